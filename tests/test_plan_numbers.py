"""Numbers a float64 training step cannot hold are diagnostics at their option, never an
internal error (issue 13, item 6: `optimizer sgd lr=1e1000` was an OverflowError in
`tvp simulate`). Plan numbers are exact rationals, so the plan itself never overflows; the
step's hyper-parameters must be finite float64 values."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl.cli.main import main
from trainverify_dsl.plan import lint_file

HEAD = ('plan p\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
        "spec-optimizer sgd lr=0.1\nmesh dp=2\nsplit x [dp, -]\nsplit target [dp, -]\n"
        "all-reduce grad(params) over dp op=avg\n")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.tvp"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("statement", [
    "optimizer sgd lr=1e1000", "optimizer sgd lr=0.1 momentum=1e309",
    "optimizer adamw lr=0.1 eps=1e400", "optimizer adam lr=0.1 weight-decay=1e300*1e300",
])
def test_a_hyper_parameter_beyond_float64_is_located(tmp_path: Path, statement: str) -> None:
    path = _write(tmp_path, HEAD + statement + "\n")
    found = [d for d in lint_file(path) if d.code.id == "TVP255"]
    assert len(found) == 1 and found[0].span.line == 8
    assert "float64" in found[0].message and len(found[0].message) < 200


def test_the_largest_float64_is_accepted(tmp_path: Path) -> None:
    path = _write(tmp_path, HEAD.replace("lr=0.1", "lr=1e308") + "optimizer sgd lr=1e308\n")
    assert not [d for d in lint_file(path) if d.code.id == "TVP255"]


def test_simulate_reports_it_instead_of_crashing(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, HEAD.replace("lr=0.1", "lr=1e1000") + "optimizer sgd lr=1e1000\n")
    assert main(["simulate", str(path)]) == 1
    captured = capsys.readouterr()
    assert "[TVP255]" in captured.out and "internal error" not in captured.err


def test_clip_grad_norm_beyond_float64_is_located(tmp_path: Path) -> None:
    path = _write(tmp_path, HEAD + "optimizer sgd lr=0.1\nclip-grad-norm 1e999\n")
    assert [d.span.line for d in lint_file(path) if d.code.id == "TVP255"] == [9]
