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

PLAN = """plan gpt2_sp_bias
spec "stdlib/models/gpt2.py:GPT2" config gpt2_tiny batch 4 seq 8
spec-optimizer adam lr=6e-4 betas=(0.9, 0.95) eps=1e-8
mesh dp=2, tp=2
use "stdlib/megatron.tvp"

split tokens [dp, -]
split labels [dp, -]

scatter layers.0.in over tp dim=1
for l in layers:
    apply sp_layernorm(l.attention_norm, tp)
    apply column_parallel_bias_sp(l.attention.wq, tp)
    apply column_parallel_bias_sp(l.attention.wk, tp)
    apply column_parallel_bias_sp(l.attention.wv, tp)
    apply row_parallel_bias_sp(l.attention.wo, tp)
    apply sp_layernorm(l.ffn_norm, tp)
    apply column_parallel_bias_sp(l.feed_forward.w1, tp)
    apply row_parallel_bias_sp(l.feed_forward.w2, tp)
apply sp_layernorm(norm, tp)
all-gather norm.out over tp dim=1 backward scatter

all-reduce grad(params) over dp op=avg
optimizer adam lr=6e-4 betas=(0.9, 0.95) eps=1e-8
"""


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


@pytest.mark.parametrize("dim", ["2", "-1", "1/2"])
def test_a_dimension_not_before_the_features_is_tvp408(tmp_path: Path, dim: str) -> None:
    text = PLAN.replace("apply row_parallel_bias_sp(l.feed_forward.w2, tp)",
                        f"apply row_parallel_bias_sp(l.feed_forward.w2, tp, {dim})")
    codes = {code for code, _ in errors(write(tmp_path, text))}
    assert "TVP408" in codes, codes


def test_the_old_transcription_still_adds_the_bias_on_every_rank(tmp_path: Path) -> None:
    text = PLAN.replace("    apply row_parallel_bias_sp(l.attention.wo, tp)\n",
                        "    apply row_parallel_sp(l.attention.wo, tp)\n")
    assert "TVP405" in {code for code, _ in errors(write(tmp_path, text))}
