"""Work bounds decided before torch is imported (issue 13: memory bombs refused in under a
second). A mesh of millions of busy ranks or a loop of millions of microbatches is refused by
`tvp simulate` and `tvp check` from the plan alone (TVP501 at the line that asks for it);
the proof that it is decided before the model is built is that torch is never imported.
`--no-shrink` on a model whose parameters alone exceed the budget is refused from the fake
model, before the full-size layout pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainverify_dsl.plan import resolve_file
from trainverify_dsl.shrink import MAX_MICROBATCHES, MAX_RANKS, work_refusal

ROOT = Path(__file__).resolve().parent.parent
HEAD = ('plan p\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
        "spec-optimizer sgd lr=0.1\n")
BODY = ("split x [dp, -]\nsplit target [dp, -]\n"
        "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.1\n")


def _write(tmp_path: Path, mesh: str, microbatches: int = 1) -> Path:
    path = tmp_path / "bomb.tvp"
    path.write_text(HEAD + f"mesh {mesh}\nmicrobatches {microbatches}\n"
                    "loss-scale 1/microbatches\n" + BODY, encoding="utf-8")
    return path


def _refusal(path: Path):
    result = resolve_file(path)
    assert result.plan is not None
    return work_refusal(result.plan)


@pytest.mark.parametrize("mesh", [f"dp={2**22}", f"dp={2**40}", "dp=256, tp=512"])
def test_a_mesh_of_too_many_busy_ranks_is_refused_at_the_mesh_line(tmp_path: Path,
                                                                   mesh: str) -> None:
    path = _write(tmp_path, mesh)
    if "tp=" in mesh:  # make tp busy: statements name it
        path.write_text(path.read_text() + "replicate fc1.weight over tp\n"
                        "all-reduce grad(fc1.bias) over tp op=avg\n")
    d = _refusal(path)
    assert d is not None and d.code.id == "TVP501"
    assert d.span.line == 4 and "above the limit" in d.message


def test_limits_are_inclusive_and_idle_axes_do_not_count(tmp_path: Path) -> None:
    assert _refusal(_write(tmp_path, f"dp={MAX_RANKS}")) is None
    assert _refusal(_write(tmp_path, f"dp={MAX_RANKS * 2}")) is not None
    # tp is named by no statement: it runs at size 1 and is not counted
    assert _refusal(_write(tmp_path, "dp=2, tp=1048576")) is None


def test_too_many_microbatches_are_refused_at_the_microbatches_line(tmp_path: Path) -> None:
    assert _refusal(_write(tmp_path, "dp=2", MAX_MICROBATCHES)) is None
    d = _refusal(_write(tmp_path, "dp=2", MAX_MICROBATCHES + 1))
    assert d is not None and d.code.id == "TVP501" and d.span.line == 5
    assert "microbatches" in d.message


def _run_without_torch(args: list[str]) -> tuple[int, str, list[str]]:
    """Run the CLI in a fresh interpreter; report whether torch got imported."""
    code = ("import sys, json; from trainverify_dsl.cli.main import main; "
            f"status = main({args!r}); "
            "print(json.dumps(['torch' in sys.modules, 'numpy.linalg' in sys.modules]), "
            "file=sys.stderr); sys.exit(status)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    flags = json.loads(proc.stderr.strip().splitlines()[-1])
    return proc.returncode, proc.stdout, flags


@pytest.mark.parametrize("command", ["simulate", "check"])
def test_the_cli_refuses_a_bomb_without_importing_torch(tmp_path: Path, command: str) -> None:
    path = _write(tmp_path, f"dp={2**22}")
    status, out, (torch_imported, _) = _run_without_torch([command, "--format", "json",
                                                           str(path)])
    # simulate reports the refusal as an error; for check the plan is neither proven nor
    # refuted: inconclusive (exit 3), never "the plan has errors"
    assert status == (1 if command == "simulate" else 3)
    assert not torch_imported
    doc = json.loads(out)
    if command == "simulate":
        found = [(f["code"], f["span"]["line"]) for f in doc["findings"]]
    else:
        found = [(f["code"], f["line"]) for f in doc["plans"][0]["diagnostics"]]
        # not checked is not wrong: a warning here (an error would fail code scanning)
        assert [f["severity"] for f in doc["plans"][0]["diagnostics"]] == ["warning"]
        assert doc["verdict"] == "inconclusive"
        assert doc["plans"][0]["reason"].startswith("not checked: ")
        # the limit on ranks is no memory budget: no --max-memory advice
        assert "--max-memory" not in doc["plans"][0]["reason"]
    assert found == [("TVP501", 4)]


def test_a_plan_within_the_limits_still_runs(tmp_path: Path) -> None:
    """The control: the same plan with a small mesh is simulated (torch imported)."""
    status, out, (torch_imported, _) = _run_without_torch(
        ["simulate", "--format", "json", str(_write(tmp_path, "dp=2"))])
    assert status == 0 and torch_imported
    assert json.loads(out)["verdict"] == "agrees"


def test_no_shrink_on_an_8b_model_is_refused_before_the_layout_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from trainverify_dsl import api

    def no_layout_pass(*args: object, **kwargs: object) -> None:
        raise AssertionError("the full-size layout pass ran before the refusal")

    monkeypatch.setattr(api, "_layout_pass", no_layout_pass)
    with pytest.raises(api.SimulationSetupError) as caught:
        api.build_programs(ROOT / "plans" / "llama3_8b_3d.tvp", shrink=False,
                           max_memory=64 << 30)
    (d,) = caught.value.diagnostics
    assert d.code.id == "TVP501" and "at least" in d.message
    assert "8,030,261,248 parameters" in d.notes[0]
