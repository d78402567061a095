"""Context parallelism with tensor-parallel heads (Llama 3's long-context recipe: TP + CP +
PP + DP, sequence parallel outside attention).

The attention's projections are split by heads over tp and the context-parallel algorithm
runs over cp on each rank's heads: its input, gathered over tp along the sequence, gets a
gradient that is each rank's heads' share (partial over tp), so the all-gather's default
backward (a reduce-scatter, Megatron's sequence-parallel gather) is right. The layout pass
knows it (the algorithm declares its input's partial cotangent): the plan lints clean and
agrees with the spec; the same plan with ``backward scatter`` (each rank keeps its own share,
never summed) is a TVP410 at the algorithm and differs in simulation.
"""

from __future__ import annotations

from pathlib import Path

from trainverify_dsl.api import layout_diagnostics, simulate_file

ROOT = Path(__file__).resolve().parents[1]
PLAN = """plan tiny_cp_tp_pp
spec "{root}/stdlib/models/llama.py:Llama" config llama_tiny batch 4 seq 16 n_layers 4
spec-optimizer adamw lr=8e-5 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1
mesh pp=2, dp=2, cp=2, tp=2
microbatches 2 schedule 1f1b
loss-scale 1/microbatches
use "{root}/stdlib/megatron.tvp"

split tokens [dp, cp]
split labels [dp, cp]

pipeline-stage 0: embed, layers[0:2]
pipeline-stage 1: layers[2:4], norm, output, loss

apply vocab_parallel_embedding_sp(embed, tp)

for l in layers:
    apply sp_norm(l.attention_norm, tp)
    split l.attention.wq.weight [tp, -]
    split l.attention.wk.weight [tp, -]
    split l.attention.wv.weight [tp, -]
    split l.attention.wo.weight [-, tp]
    all-gather l.attention.in over tp dim=1
    reduce-scatter l.attention.out over tp dim=1
    apply sp_norm(l.ffn_norm, tp)
    apply swiglu_parallel_sp(l.feed_forward, tp)

algorithm context-parallel-attention for layers.*.attention over cp

apply sp_norm(norm, tp)
apply vocab_parallel_output_sp(output, tp)

all-reduce grad(params) over dp, cp op=avg
optimizer adamw lr=8e-5 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cp_tp.tvp"
    path.write_text(text.format(root=ROOT))
    return path


def test_heads_split_over_tp_under_context_parallelism_agree(tmp_path: Path) -> None:
    path = write(tmp_path, PLAN)
    assert layout_diagnostics(path, allow_model_outside_root=True) == []
    result = simulate_file(path, allow_model_outside_root=True)
    assert result.agrees, result.mismatches[:3]


def test_a_split_backward_at_the_gather_is_found_at_the_algorithm(tmp_path: Path) -> None:
    text = PLAN.replace("all-gather l.attention.in over tp dim=1",
                        "all-gather l.attention.in over tp dim=1 backward scatter")
    assert text != PLAN
    path = write(tmp_path, text)
    findings = layout_diagnostics(path, allow_model_outside_root=True)
    line = next(n for n, s in enumerate(text.splitlines(), 1)
                if s.startswith("algorithm context-parallel-attention"))
    assert [(d.code.id, d.span.line) for d in findings] == [("TVP410", line)]
    result = simulate_file(path, allow_model_outside_root=True, stop_on_errors=False)
    assert not result.agrees and result.max_rel_error > 1e-3


INSIDE = """plan cp_tp_inside
spec "{root}/stdlib/models/llama.py:Llama" config llama_tiny batch 2 seq 8
spec-optimizer sgd lr=0.01
mesh ctx=2, tp=2
use "{root}/stdlib/megatron.tvp"

split tokens [-, ctx]
split labels [-, ctx]

for blk in layers:
    algorithm context-parallel-attention for blk.attention over ctx
{heads}
    apply swiglu_parallel(blk.feed_forward, tp)

all-reduce grad(params) over ctx op=avg
optimizer sgd lr=0.01
"""
#: Megatron's column/row-parallel statements on the projections, inside the attention
APPLIED = "    apply attention_parallel(blk.attention, tp)"
#: the same collectives at the attention's boundary, where the algorithm's input and output are
BOUNDARY = "\n".join([
    "    split blk.attention.wq.weight [tp, -]", "    split blk.attention.wk.weight [tp, -]",
    "    split blk.attention.wv.weight [tp, -]", "    split blk.attention.wo.weight [-, tp]",
    "    copy blk.attention.in over tp", "    all-reduce blk.attention.out over tp"])


def test_statements_inside_a_module_an_algorithm_replaces_are_rejected_at_them(
        tmp_path: Path) -> None:
    """The algorithm computes the attention whole: a `copy` on `wq.in` inside it would not
    run. It was TVP408 at the spec line ("view in ...wq ... is also used outside it"); it is
    TVP408 at the statement, naming the algorithm and the boundary to use instead, and the
    boundary form lints clean and agrees."""
    path = tmp_path / "inside.tvp"
    path.write_text(INSIDE.format(root=ROOT, heads=APPLIED), encoding="utf-8")
    (found,) = layout_diagnostics(path)
    assert found.code.id == "TVP408" and found.span.line == 12, found
    assert "`layers.0.attention.wq.in` is inside `layers.0.attention`" in found.message
    assert any("algorithm context-parallel-attention for layers.0.attention` is at" in n
               for n in found.notes)
    path.write_text(INSIDE.format(root=ROOT, heads=BOUNDARY), encoding="utf-8")
    assert layout_diagnostics(path) == []
    assert simulate_file(path).agrees
