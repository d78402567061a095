"""`row-parallel-linear scatter-dim=D` (docs/semantics.md §7.6): Megatron's sequence-parallel
RowParallelLinear with a bias, `reduce-scatter(x W_rᵀ) + b`.

A GPT-2 plan with sequence parallelism and biased linears (NeMo / Megatron GPT) lints clean,
agrees with the spec and with torch under gloo; without the bias gradient's all-reduce it is
TVP410 at the algorithm; a dimension that is not before the features is TVP408. Before the
option the faithful plan could not be written: `reduce-scatter m.out` adds the bias on every
rank before the sum (TVP405).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl import api
from trainverify_dsl.api import simulate_file
from trainverify_dsl.oracle import run_distributed

ROOT = Path(__file__).resolve().parents[1]
PLAN = (ROOT / "plans" / "gpt2_tiny_sp.tvp").read_text()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.tvp"
    path.write_text(text)
    return path


def errors(path: Path) -> list[tuple[str, int]]:
    return [(d.code.id, d.span.line) for d in api.layout_diagnostics(path)
            if d.severity == "error"]


def test_the_sequence_parallel_gpt2_plan_agrees(tmp_path: Path) -> None:
    path = write(tmp_path, PLAN)
    assert errors(path) == []
    result = simulate_file(path)
    assert result.agrees, result.mismatches[:3]


@pytest.mark.slow
def test_gloo_agrees(tmp_path: Path) -> None:
    assert run_distributed(write(tmp_path, PLAN), timeout=120).agrees


def test_the_bias_gradient_left_partial_is_tvp410_at_the_algorithm(tmp_path: Path) -> None:
    text = PLAN.replace("    apply row_parallel_bias_sp(l.attention.wo, tp)\n",
                        "    split l.attention.wo.weight [-, tp]\n"
                        "    algorithm row-parallel-linear for l.attention.wo over tp "
                        "scatter-dim=1\n")
    path = write(tmp_path, text)
    line = text.splitlines().index("    algorithm row-parallel-linear for l.attention.wo over "
                                   "tp scatter-dim=1") + 1
    assert errors(path) == [("TVP410", line)]


@pytest.mark.parametrize("dim", ["2", "1/2"])
def test_a_dimension_not_before_the_features_is_tvp408(tmp_path: Path, dim: str) -> None:
    text = PLAN.replace("apply row_parallel_bias_sp(l.feed_forward.w2, tp)",
                        f"apply row_parallel_bias_sp(l.feed_forward.w2, tp, {dim})")
    codes = {code for code, _ in errors(write(tmp_path, text))}
    assert "TVP408" in codes, codes


def test_the_old_transcription_still_adds_the_bias_on_every_rank(tmp_path: Path) -> None:
    text = PLAN.replace("    apply row_parallel_bias_sp(l.attention.wo, tp)\n",
                        "    apply row_parallel_sp(l.attention.wo, tp)\n")
    assert "TVP405" in {code for code, _ in errors(write(tmp_path, text))}
