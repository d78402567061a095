"""``tvp check --executor ray``: the same jobs as the local pool, as tasks on a local Ray
instance the command starts (and stops); verdicts in the order given, relative paths
resolved in the caller's folder, nothing from Ray on stdout or stderr. Without Ray
installed the option is a clear usage error; an unknown executor is rejected."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trainverify_dsl.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_plans_are_checked_on_a_local_ray_instance(monkeypatch, capsys) -> None:
    pytest.importorskip("ray")
    monkeypatch.chdir(ROOT)
    code = main(["check", "--executor", "ray", "--jobs", "2", "--no-cache", "--format",
                 "json", "plans/bugs/loss_not_scaled.tvp", "plans/mlp_tiny_dp.tvp"])
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert [(p["plan"], p["verdict"]) for p in document["plans"]] == \
        [("plans/bugs/loss_not_scaled.tvp", "counterexample"),
         ("plans/mlp_tiny_dp.tvp", "verified")]
    assert code == 1  # the worst verdict: a counterexample
    assert err == ""


def test_without_ray_the_option_is_a_usage_error(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails
    code = main(["check", "--executor", "ray", str(ROOT / "plans" / "mlp_tiny_dp.tvp")])
    assert code == 2
    assert "pip install 'trainverify_dsl[ray]'" in capsys.readouterr().err


def test_an_unknown_executor_is_rejected(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["check", "--executor", "dask", str(ROOT / "plans" / "mlp_tiny_dp.tvp")])
    assert stop.value.code == 2
    assert "not an executor" in capsys.readouterr().err


def test_a_cluster_that_cannot_be_reached_is_an_error_verdict_not_a_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`ray://nohost:1` (here without the client extra, or with it and no such host): every
    plan is an `error` (exit 2, never 1, "counterexample"), and the JSON document is whole."""
    pytest.importorskip("ray")
    code = main(["check", "--executor", "ray://nohost:1", "--format", "json",
                 str(ROOT / "plans" / "mlp_tiny_dp.tvp")])
    out, err = capsys.readouterr()
    (plan,) = json.loads(out)["plans"]
    assert code == 2 and plan["verdict"] == "error"
    assert plan["reason"].startswith("not checked: Ray could not start or connect")
    assert "Traceback" not in err
