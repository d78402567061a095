"""Where a difference or a layout finding is reported: at the statement at fault, also when
another statement stands at the same point or the value passes one on its way.

- A lineage that differs at a point an algorithm computes is reported at the algorithm, even
  when a collective follows it there (docs/semantics.md Rule 7.2): with heads split over tp,
  the context-parallel attention in the wrong order is reported at its `algorithm` line, not
  at `all-reduce l.attention.out over tp`, which is exact on whatever the algorithm computed.
  Where no algorithm computes the value, the last collective at the point stays blamed.
- A partial sum that a collective lets through unreduced (a `scatter` where the
  `reduce-scatter` belongs) is blamed on that collective: the findings of the ops and of the
  later collectives it reaches stand there, not at the correct `column_parallel_sp` lines the
  sum reaches next. A sum an op has already reported stays where it was reported.
"""

from __future__ import annotations

from pathlib import Path

from trainverify_dsl.api import layout_diagnostics, simulate_file

ROOT = Path(__file__).resolve().parents[1]

#: zigzag context parallelism with the attention's heads split over tp (Llama 3's recipe)
CP_TP = """plan cp_tp_heads
spec "{root}/stdlib/models/llama.py:Llama" config llama_tiny batch 2 seq 8
spec-optimizer sgd lr=0.01
mesh cp=2, tp=2

split tokens [-, zigzag(cp)]
split labels [-, zigzag(cp)]

for l in layers:
    split l.attention.wq.weight [tp, -]
    split l.attention.wk.weight [tp, -]
    split l.attention.wv.weight [tp, -]
    split l.attention.wo.weight [-, tp]
    copy l.attention.in over tp
    all-reduce l.attention.out over tp
algorithm context-parallel-attention for layers.*.attention over cp order={order}

all-reduce grad(params) over cp op=avg
optimizer sgd lr=0.01
"""

#: sequence parallelism; the attention output's partial sum is made at `wo` and handled by
#: the statement {attention_out}
SEQUENCE_PARALLEL = """plan sp_attention_out
spec "{root}/stdlib/models/llama.py:Llama" config llama_tiny batch 4 seq 8
spec-optimizer sgd lr=0.01
mesh dp=2, tp=2
use "{root}/stdlib/megatron.tvp"

split tokens [dp, -]
split labels [dp, -]

apply vocab_parallel_embedding_sp(embed, tp)
for l in layers:
    apply sp_norm(l.attention_norm, tp)
    apply column_parallel_sp(l.attention.wq, tp)
    apply column_parallel_sp(l.attention.wk, tp)
    apply column_parallel_sp(l.attention.wv, tp)
    split l.attention.wo.weight [-, tp]
{attention_out}
    apply sp_norm(l.ffn_norm, tp)
    apply swiglu_parallel_sp(l.feed_forward, tp)
apply sp_norm(norm, tp)
apply vocab_parallel_output_sp(output, tp)

all-reduce grad(params) over dp op=avg
optimizer sgd lr=0.01
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.tvp"
    path.write_text(text)
    return path


def line_of(path: Path, start: str) -> int:
    return next(n for n, s in enumerate(path.read_text().splitlines(), 1)
                if s.strip().startswith(start))


def findings_at(path: Path) -> list[tuple[str, int]]:
    found = layout_diagnostics(path, allow_model_outside_root=True)
    assert all(d.span is not None and d.span.file == str(path) for d in found), found
    return [(d.code.id, d.span.line) for d in found]


# -- a lineage at a point an algorithm computes -----------------------------------------------


def test_a_wrong_attention_order_with_heads_over_tp_is_reported_at_the_algorithm(
        tmp_path: Path) -> None:
    path = write(tmp_path, CP_TP.format(root=ROOT, order="contiguous"))
    result = simulate_file(path, allow_model_outside_root=True)
    assert not result.agrees and not result.findings
    first = result.first
    assert first is not None and first.check == "lineages"
    assert first.tensor == "layers.0.attention.out"
    assert first.span is not None
    assert first.span.line == line_of(path, "algorithm context-parallel-attention")
    assert first.span.line != line_of(path, "all-reduce l.attention.out")


def test_the_collective_is_blamed_where_no_algorithm_computes_the_value() -> None:
    """The doubled all-reduce run past its layout error: the lineage after it differs, and
    it is the last statement at the point (docs/lowering.md)."""
    path = ROOT / "plans" / "bugs" / "doubled_allreduce.tvp"
    result = simulate_file(path, stop_on_errors=False)
    first = result.first
    assert first is not None and first.check == "lineages"
    assert first.tensor == "layers.0.feed_forward.out"
    assert first.span is not None
    assert first.span.line == line_of(path, "all-reduce l.feed_forward.out")


# -- a partial sum let through by a collective ------------------------------------------------


def test_a_scatter_where_the_reduce_scatter_belongs_is_blamed_for_the_sum(
        tmp_path: Path) -> None:
    path = write(tmp_path, SEQUENCE_PARALLEL.format(
        root=ROOT, attention_out="    scatter l.attention.out over tp dim=1"))
    scatter = line_of(path, "scatter l.attention.out")
    found = findings_at(path)
    # the residual add, the norms and the gathers the unreduced sum reaches, all at the
    # scatter: none at the correct column-parallel lines (13-15, 19, 21) it reaches next
    assert sorted(found) == [("TVP404", scatter), ("TVP405", scatter), ("TVP406", scatter)]


def test_without_the_scatter_the_sum_is_blamed_on_the_split_that_made_it(
        tmp_path: Path) -> None:
    path = write(tmp_path, SEQUENCE_PARALLEL.format(root=ROOT, attention_out=""))
    assert findings_at(path) == [("TVP403", line_of(path, "split l.attention.wo.weight"))]


def test_with_the_reduce_scatter_the_plan_has_no_finding(tmp_path: Path) -> None:
    path = write(tmp_path, SEQUENCE_PARALLEL.format(
        root=ROOT, attention_out="    reduce-scatter l.attention.out over tp dim=1"))
    assert findings_at(path) == []


def test_a_sum_already_reported_is_not_taken_over_by_a_later_copy() -> None:
    """`plans/bugs/missing_allreduce.tvp`: w2's unreduced sum reaches the next layer's
    `copy` (column parallel) after the residual add and the norm reported it at the split of
    w2; the copy is not blamed for it."""
    path = ROOT / "plans" / "bugs" / "missing_allreduce.tvp"
    split = line_of(path, "split l.feed_forward.w2.weight")
    assert sorted(findings_at(path)) == [("TVP404", split), ("TVP405", split)]
