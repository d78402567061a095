"""Every output format says when something failed (issue 13, item 5): an internal error of
``tvp lint`` is never a clean report, in any format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_render_sarif import validate

from trainverify_dsl.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
CLEAN_PLAN = str(ROOT / "plans" / "mlp_tiny_dp.tvp")
CRASH = "RuntimeError: provoked for the test"


def crash(*args: object, **kwargs: object) -> None:
    raise RuntimeError("provoked for the test")


@pytest.fixture
def parser_crashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain ``tvp lint`` calls ``plan.lint_file`` (looked up when the linter loads)."""
    monkeypatch.setattr("trainverify_dsl.plan.lint_file", crash)


@pytest.fixture
def layout_pass_crashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tvp lint --spec`` calls ``api.layout_diagnostics`` on a plan that lints
    clean (looked up at each call)."""
    monkeypatch.setattr("trainverify_dsl.api.layout_diagnostics", crash)


def lint(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["lint", *argv])
    out, err = capsys.readouterr()
    return status, out, err


# --- tvp lint ------------------------------------------------------------------------------


def test_text_names_the_internal_error(parser_crashes, capsys) -> None:
    status, out, err = lint(capsys, CLEAN_PLAN)
    assert status == 2
    assert "no issues found" not in out
    assert out.strip() == "1 error (1 internal error), 0 warnings in 1 file (1 file checked)"
    assert err.strip() == f"tvp lint: internal error while linting {CLEAN_PLAN}: {CRASH}"


def test_text_layout_pass_crash_is_not_clean(layout_pass_crashes, capsys) -> None:
    status, out, err = lint(capsys, CLEAN_PLAN, "--spec")
    assert status == 2
    assert "no issues found" not in out and "internal error" in out
    assert f"internal error while linting {CLEAN_PLAN}: {CRASH}" in err


def test_json_lists_the_internal_error_and_counts_it(layout_pass_crashes, capsys) -> None:
    status, out, _ = lint(capsys, CLEAN_PLAN, "--spec", "--format", "json")
    document = json.loads(out)
    assert status == 2
    assert document["internal_errors"] == [{"file": CLEAN_PLAN, "message": CRASH}]
    assert document["diagnostics"] == []
    assert document["summary"]["errors"] == 1
    assert document["summary"]["internal_errors"] == 1


def test_json_crash_among_clean_files(parser_crashes, capsys) -> None:
    status, out, _ = lint(capsys, CLEAN_PLAN, str(ROOT / "plans" / "llama_tiny_tp.tvp"),
                          "--format", "json")
    document = json.loads(out)
    assert status == 2
    assert [failure["file"] for failure in document["internal_errors"]] == [
        CLEAN_PLAN, str(ROOT / "plans" / "llama_tiny_tp.tvp")]
    assert document["summary"]["errors"] == 2


def test_sarif_marks_the_execution_unsuccessful(layout_pass_crashes, capsys,
                                                monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    status, out, _ = lint(capsys, "plans/mlp_tiny_dp.tvp", "--spec", "--format", "sarif")
    log = json.loads(out)
    validate(log)
    run = log["runs"][0]
    (invocation,) = run["invocations"]
    assert status == 2
    assert invocation["executionSuccessful"] is False
    (notification,) = invocation["toolExecutionNotifications"]
    assert notification["level"] == "error"
    assert CRASH in notification["message"]["text"]
    (location,) = notification["locations"]
    assert location["physicalLocation"]["artifactLocation"]["uri"] == "plans/mlp_tiny_dp.tvp"


def test_sarif_clean_run_is_successful(capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    status, out, _ = lint(capsys, "plans/mlp_tiny_dp.tvp", "--format", "sarif")
    (invocation,) = json.loads(out)["runs"][0]["invocations"]
    assert status == 0
    assert invocation == {"executionSuccessful": True, "toolExecutionNotifications": []}


def test_github_prints_an_error_command(layout_pass_crashes, capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    status, out, err = lint(capsys, "plans/mlp_tiny_dp.tvp", "--spec", "--format", "github")
    assert status == 2
    assert out == ("::error file=plans/mlp_tiny_dp.tvp,title=tvp internal error::internal "
                   f"error while linting plans/mlp_tiny_dp.tvp: {CRASH}\n")
    assert "no issues found" not in err


# --- tvp simulate --format json ------------------------------------------------------------

#: the keys of every ``tvp simulate --format json`` document, whatever happened
SIMULATE_KEYS = {"plan", "verdict", "agrees", "error", "max_rel_error", "tolerance", "ranks",
                 "compared", "sizes", "idle_axes", "estimated_bytes", "first_difference",
                 "reading", "draw", "roundoff", "mismatches", "mismatch_count",
                 "lineage_mismatches", "findings"}


def simulate_json(capsys: pytest.CaptureFixture[str], plan: str) -> tuple[int, dict, str]:
    """Exit code, the one document on stdout (``json.loads`` refuses anything more), stderr."""
    status = main(["simulate", plan, "--format", "json"])
    out, err = capsys.readouterr()
    return status, json.loads(out), err


def test_simulate_agrees(capsys) -> None:
    status, document, _ = simulate_json(capsys, CLEAN_PLAN)
    assert set(document) == SIMULATE_KEYS
    assert (status, document["verdict"], document["agrees"]) == (0, "agrees", True)
    assert document["error"] is None and document["findings"] == []
    assert document["max_rel_error"] < document["tolerance"]
    assert document["first_difference"] is None and document["mismatches"] == []


def test_simulate_refused_by_the_layout_pass(capsys) -> None:
    plan = str(ROOT / "plans" / "bugs" / "sum_instead_of_avg.tvp")
    status, document, _ = simulate_json(capsys, plan)
    assert set(document) == SIMULATE_KEYS
    assert (status, document["verdict"], document["agrees"]) == (1, "errors", False)
    assert document["findings"] and all(f["span"]["file"] for f in document["findings"])
    assert any(f["severity"] == "error" for f in document["findings"])
    assert document["error"] and document["max_rel_error"] is None


def test_simulate_internal_error(capsys, monkeypatch) -> None:
    # simulate_cmd looks ``simulate_file`` up in trainverify_dsl.simulate at each run
    monkeypatch.setattr("trainverify_dsl.api.simulate_file", crash)
    status, document, err = simulate_json(capsys, CLEAN_PLAN)
    assert set(document) == SIMULATE_KEYS
    assert (status, document["verdict"], document["agrees"]) == (2, "internal-error", False)
    assert document["error"] == CRASH
    assert document["findings"] == [] and document["max_rel_error"] is None
    assert err.strip() == f"tvp simulate: internal error: {CRASH}"


def test_simulate_no_verdict(capsys, monkeypatch) -> None:
    from trainverify_dsl.simulate.torch_step import ReferenceDisagrees

    def disagree(*args: object, **kwargs: object) -> None:
        raise ReferenceDisagrees("the reference loss differs from eager torch")

    monkeypatch.setattr("trainverify_dsl.api.simulate_file", disagree)
    status, document, err = simulate_json(capsys, CLEAN_PLAN)
    assert set(document) == SIMULATE_KEYS
    assert (status, document["verdict"], document["agrees"]) == (2, "no-verdict", False)
    assert document["error"] == "the reference loss differs from eager torch"
    assert err.startswith("tvp simulate: no verdict: ")


def test_simulate_missing_plan(capsys, tmp_path: Path) -> None:
    status, document, _ = simulate_json(capsys, str(tmp_path / "nope.tvp"))
    assert set(document) == SIMULATE_KEYS
    assert (status, document["verdict"], document["agrees"]) == (1, "errors", False)
    assert [f["code"] for f in document["findings"]] == ["TVP109"]


def test_simulate_plan_without_a_spec_is_a_located_error(capsys, tmp_path: Path) -> None:
    """A plan without a `spec` line is a fault of the plan (TVP504 at its first line, exit 1),
    not a usage error without a place."""
    plan = tmp_path / "nospec.tvp"
    plan.write_text("plan nospec\nmesh dp=2\n", encoding="utf-8")
    status, document, _ = simulate_json(capsys, str(plan))
    assert set(document) == SIMULATE_KEYS
    assert (status, document["verdict"], document["agrees"]) == (1, "errors", False)
    (finding,) = document["findings"]
    assert (finding["code"], finding["span"]["line"]) == ("TVP504", 1)


def test_lint_spec_is_quiet_on_stderr_for_a_clean_plan() -> None:
    """No torch deprecation warnings on every run (issue 13, item 8): a fresh process, where
    torch is imported (and warns) for the first time."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "trainverify_dsl.cli.main", "lint", "--spec",
                          str(ROOT / "plans" / "mlp_tiny_dp.tvp")],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0 and "no issues found" in run.stdout
    assert run.stderr == "", run.stderr


NOISY = '''\
import torch
from torch import nn

print("MODEL IMPORTED")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        print("MODEL BUILT")
        self.fc = nn.Linear(4, 4)

    def input_specs(self, batch, seq):
        return {"x": ((batch, 4), torch.float32), "y": ((batch, 4), torch.float32)}

    def forward(self, x, y):
        print("FORWARD")
        return ((self.fc(x) - y) ** 2).mean()
'''


@pytest.mark.parametrize("command", [["check", "--format", "json"],
                                     ["simulate", "--format", "json"],
                                     ["lint", "--spec", "--format", "json"],
                                     ["lint", "--spec", "--format", "sarif"]])
def test_what_the_model_prints_never_reaches_the_document(command, capsys, tmp_path: Path
                                                         ) -> None:
    """A model printing at import, construction and in forward wrote into stdout ahead of
    the JSON document, which then did not parse. Its output goes to stderr now."""
    (tmp_path / "noisy.py").write_text(NOISY)
    plan = tmp_path / "noisy.tvp"
    plan.write_text('plan p\nspec "noisy.py:Net" batch 8 seq 1\nspec-optimizer sgd lr=0.1\n'
                    "mesh dp=2\nsplit x [dp, -]\nsplit y [dp, -]\n"
                    "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.1\n")
    code = main([*command, str(plan), "--allow-model-outside-root"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    json.loads(out)
    assert "FORWARD" not in out and "MODEL" not in out
    assert "FORWARD" in err
