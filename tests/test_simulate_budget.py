"""Bounded simulation work (issue 13, item 2): idle mesh axes run at size 1, and a plan whose
estimated memory exceeds the budget is refused (TVP501 at its mesh line) before the real
model or any value is allocated."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl.api import SimulationSetup, SimulationSetupError, resolve_plan, simulate_file
from trainverify_dsl.cli.main import main
from trainverify_dsl.ir.graph import GraphBuilder
from trainverify_dsl.ir.types import TensorType
from trainverify_dsl.shrink import idle_axes
from trainverify_dsl.simulate.budget import parse_bytes, peak_live_bytes

HEAD = ('plan p\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
        "spec-optimizer sgd lr=0.1\n")
BODY = ("split x [dp, -]\nsplit target [dp, -]\n{extra}"
        "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.1\n")


def _write(tmp_path: Path, mesh: str, extra: str = "") -> Path:
    path = tmp_path / "p.tvp"
    path.write_text(HEAD + f"mesh {mesh}\n" + BODY.format(extra=extra), encoding="utf-8")
    return path


def test_an_idle_axis_of_a_million_ranks_runs_at_size_1(tmp_path: Path) -> None:
    result = simulate_file(_write(tmp_path, "dp=2, tp=1048576"))
    assert result.agrees and result.ranks == 2
    assert result.idle_axes == {"tp": 1048576}


def test_an_axis_a_statement_names_is_not_idle(tmp_path: Path) -> None:
    """`all-reduce grad(params) over tp, dp op=sum` with tp otherwise unused sums tp
    identical copies: the axis matters (the gradients come out tp times the data sum) and is
    kept."""
    path = tmp_path / "p.tvp"
    path.write_text(HEAD + "mesh dp=2, tp=2\n" + BODY.format(extra="").replace(
        "over dp op=avg", "over tp, dp op=sum"), encoding="utf-8")
    assert idle_axes(resolve_plan(path)) == {}
    result = simulate_file(path, stop_on_errors=False)
    assert result.ranks == 4 and not result.agrees


def test_replicate_over_an_axis_leaves_it_idle(tmp_path: Path) -> None:
    path = _write(tmp_path, "dp=2, tp=4", extra="replicate fc1.weight over tp\n")
    assert idle_axes(resolve_plan(path)) == {"tp": 4}


def test_pipeline_stages_use_their_axis(tmp_path: Path) -> None:
    path = _write(tmp_path, "pp=2, dp=2", extra="pipeline-stage 0: fc1\n"
                                               "pipeline-stage 1: fc2, loss\n")
    assert idle_axes(resolve_plan(path)) == {}


def test_over_budget_is_refused_at_the_mesh_line_before_the_real_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def never(self: SimulationSetup) -> None:
        raise AssertionError("the real model was built before the budget check")

    monkeypatch.setattr(SimulationSetup, "build_real", never)
    with pytest.raises(SimulationSetupError) as info:
        simulate_file(_write(tmp_path, "dp=2"), max_memory=1024)
    (only,) = info.value.diagnostics
    assert only.code.id == "TVP501" and only.span.line == 4
    assert "KiB" in only.message and "budget of 1 KiB" in only.message


def test_the_cli_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(_write(tmp_path, "dp=2"))
    assert main(["simulate", "--max-memory", "2K", path]) == 1
    assert "[TVP501]" in capsys.readouterr().out
    assert main(["simulate", "--max-memory", "1G", path]) == 0
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--max-memory", "lots", path])
    assert info.value.code == 2


def test_peak_live_bytes_frees_values_after_their_last_use() -> None:
    t = TensorType((10,), "f32")
    b = GraphBuilder()
    x = b.add_input("x", "data", t)
    y = b.add("neg", (x,), {}, t)       # x (80) + y (80)
    z = b.add("neg", (y,), {}, t)       # + z, then y is dead
    w = b.add("add", (z, x), {}, t)     # x + z + w = 240
    b.add_output("w", w)
    assert peak_live_bytes(b.build()) == 240


@pytest.mark.parametrize(("text", "size"), [("4G", 4 << 30), ("512M", 512 << 20),
                                             ("1.5GiB", 3 << 29), ("1000", 1000)])
def test_sizes(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["", "-1G", "0", "inf", "lots"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_bytes(text)
