"""The layout propagation rules end to end: small plans over the models of
``tests/models/tiny_nets.py``, lowered and simulated (``simulate_file``: every rank's local
program in float64 against the single-device spec), plus the layout pass's findings
(``Lowered.findings``) and ``LoweringError`` diagnostics with their plan spans.

A correct plan must agree with the spec to round-off; the one-line-off variants must not, and
where the semantics fix the factor (docs/semantics.md §3.2, §4.7) the error is that factor.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pytest

from trainverify_dsl.api import prepare, simulate_file
from trainverify_dsl.lower.findings import LoweringError
from trainverify_dsl.lower.lowering import Lowered, lower

MODELS = "tests/models/tiny_nets.py"

# Finding codes: the short keys of lower/findings.py, being renamed to the registered names
# of report/codes_lower.py; either spelling is accepted.
LAYOUT = {"layout", "layout-mismatch"}
COLLECTIVE = {"collective", "collective-mismatch"}
CLAIM = {"claim", "claim-contradicts-layout"}

#: ``copy`` on the inputs of q, k, v and a row-parallel output projection.
ATTENTION_TP = """
split attn.wq.weight [tp, -]
split attn.wk.weight [tp, -]
split attn.wv.weight [tp, -]
copy attn.wq.in over tp
copy attn.wk.in over tp
copy attn.wv.in over tp
split attn.wo.weight [-, tp]
all-reduce attn.wo.out over tp
"""


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def write(tmp_path: Path, model: str, header: str, body: str, name: str = "t") -> Path:
    """A plan file: ``plan``/``spec`` lines, then ``header`` (spec settings, mesh...) and
    ``body``. Line 1 is ``plan``, line 2 ``spec``, the header starts on line 3."""
    spec_line, _, rest = textwrap.dedent(header).strip().partition("\n")
    text = (f"plan {name}\nspec \"{MODELS}:{model}\" {spec_line.strip()}\n"
            f"{rest.strip()}\n{textwrap.dedent(body).strip()}\nspec-optimizer sgd lr=0.1\n"
            "optimizer sgd lr=0.1\n")
    path = tmp_path / f"{name}.tvp"
    path.write_text(text)
    return path


def line_of(path: Path, statement: str) -> int:
    """The 1-based line of the first plan line starting with ``statement``."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith(statement):
            return number
    raise AssertionError(f"{statement!r} not in {path}")


def lowered(path: Path) -> Lowered:
    setup = prepare(path)
    return lower(setup.plan, setup.fake_model, setup.fake_inputs)


def codes(lw: Lowered) -> list[str]:
    return [f.code.name for f in lw.findings]


def bad_tensors(result) -> set[str]:
    return {m.tensor for m in result.mismatches}


# -- tensor parallel linears ------------------------------------------------------------------

COLUMN_ROW = """
split fc1.weight [tp, -]
copy fc1.in over tp
split fc2.weight [-, tp]
all-reduce fc2.out over tp
"""


def test_column_then_row_parallel_agrees(tmp_path: Path) -> None:
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh tp=2", COLUMN_ROW)
    lw = lowered(path)
    assert lw.findings == []
    assert lw.lineages["fc1.out"].describe() == "[4, 2, 8/tp]"
    assert lw.lineages["fc2.out"].partial is None  # complete after the all-reduce
    result = simulate_file(path, stop_on_errors=False)
    assert result.agrees, result.mismatches
    assert result.ranks == 2 and result.compared > 0


def test_column_then_row_parallel_with_dp_and_microbatches_agrees(tmp_path: Path) -> None:
    path = write(tmp_path, "TwoLinear",
                 "batch 8 seq 2\nmesh dp=2, tp=2\nmicrobatches 2\nloss-scale 1/microbatches",
                 "split x [dp, -, -]\nsplit target [dp, -, -]\n" + COLUMN_ROW +
                 "all-reduce grad(params) over dp op=avg")
    result = simulate_file(path, stop_on_errors=False)
    assert result.agrees, result.mismatches
    assert result.ranks == 4


def test_row_parallel_without_the_all_reduce_differs(tmp_path: Path) -> None:
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh tp=2",
                 COLUMN_ROW.replace("all-reduce fc2.out over tp", ""))
    lw = lowered(path)
    nonlinear = [f for f in lw.findings if f.code.name == "partial-nonlinear"]
    assert nonlinear, lw.findings
    # the partial sum's cause is a split statement of this plan
    assert nonlinear[0].span is not None and Path(nonlinear[0].span.file) == path
    assert nonlinear[0].span.line in (line_of(path, "split fc1.weight"),
                                      line_of(path, "split fc2.weight"))
    result = simulate_file(path, stop_on_errors=False)
    assert not result.agrees
    assert {"loss", "grad(fc1.weight)"} <= bad_tensors(result)


def test_row_parallel_all_reduce_with_backward_all_reduce_doubles_gradients(
        tmp_path: Path) -> None:
    """docs/semantics.md §3.4: ``all-reduce fc2.out over tp backward all-reduce`` (what
    ``torch.distributed.nn.all_reduce`` does) makes every upstream gradient tp = 2 times too
    large; the forward (and the loss) is unchanged."""
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh tp=2",
                 COLUMN_ROW.replace("all-reduce fc2.out over tp",
                                    "all-reduce fc2.out over tp backward all-reduce"))
    result = simulate_file(path, stop_on_errors=False)
    assert not result.agrees
    assert "loss" not in bad_tensors(result)
    grads = [m for m in result.mismatches if m.tensor.startswith("grad(")]
    assert grads and all(abs(m.rel_error - 1.0) < 1e-9 for m in grads)  # exactly tp = 2 times


# -- reductions over a split dimension ---------------------------------------------------------

POOL = """
split proj.weight [tp, -]
copy proj.in over tp
"""


def test_sum_over_a_split_dimension_then_all_reduce_sum_agrees(tmp_path: Path) -> None:
    path = write(tmp_path, "PoolNet", "batch 4 seq 2\nmesh tp=2",
                 POOL + "all-reduce pool.out over tp")
    lw = lowered(path)
    assert lw.findings == []
    assert lw.lineages["pool.out"].partial is None
    assert simulate_file(path, stop_on_errors=False).agrees


def test_sum_over_a_split_dimension_without_the_all_reduce(tmp_path: Path) -> None:
    path = write(tmp_path, "PoolNet", "batch 4 seq 2\nmesh tp=2", POOL)
    lw = lowered(path)
    assert "partial-nonlinear" in codes(lw)  # tanh of a partial sum
    assert not simulate_file(path, stop_on_errors=False).agrees


def test_partial_sum_all_reduced_with_avg_is_a_collective_finding(tmp_path: Path) -> None:
    path = write(tmp_path, "PoolNet", "batch 4 seq 2\nmesh tp=2",
                 POOL + "all-reduce pool.out over tp op=avg")
    lw = lowered(path)
    found = [f for f in lw.findings if f.code.name in COLLECTIVE]
    assert found and "op=avg divides a partial sum" in found[0].message
    assert found[0].span.line == line_of(path, "all-reduce pool.out")
    assert not simulate_file(path, stop_on_errors=False).agrees


def test_mean_over_a_split_dimension_then_all_reduce_avg(tmp_path: Path) -> None:
    """The local mean divides by the local count and ``op=avg`` restores the spec's value, so
    the loss agrees; the all-reduce's identity backward hands each rank the full cotangent
    (Rule 3.2: the backward always sums), so the local mean's backward is ``tp`` times the
    spec's and the projection's gradient is exactly ``tp`` times too large."""
    path = write(tmp_path, "MeanPoolNet", "batch 4 seq 2\nmesh tp=2",
                 POOL + "all-reduce pool.out over tp op=avg")
    lw = lowered(path)
    assert lw.lineages["pool.out"].partial is None
    result = simulate_file(path, stop_on_errors=False)
    assert "loss" not in bad_tensors(result)
    grads = [m for m in result.mismatches if m.tensor == "grad(proj.weight)"]
    assert len(grads) == 2 and all(abs(m.rel_error - 1.0) < 1e-9 for m in grads)


def test_mean_over_a_split_dimension_all_reduced_with_sum_differs(tmp_path: Path) -> None:
    path = write(tmp_path, "MeanPoolNet", "batch 4 seq 2\nmesh tp=2",
                 POOL + "all-reduce pool.out over tp")
    assert "loss" in bad_tensors(simulate_file(path, stop_on_errors=False))


# -- data parallel, microbatches, loss scale (docs/semantics.md §4.7) -----------------------------

DP = """
split x [dp, -, -]
split target [dp, -, -]
"""


@pytest.mark.parametrize(("scale", "op", "agrees"), [
    ("1/microbatches", "avg", True),
    ("1/(dp*microbatches)", "sum", True),
    (None, "avg", False),  # x microbatches
    ("1/microbatches", "sum", False),  # x dp
    ("1/(microbatches*microbatches)", "avg", False),  # / microbatches
])
def test_batch_split_with_microbatches(tmp_path: Path, scale: str | None, op: str,
                                       agrees: bool) -> None:
    header = "batch 8 seq 2\nmesh dp=2\nmicrobatches 2" + (f"\nloss-scale {scale}" if scale
                                                          else "")
    path = write(tmp_path, "TwoLinear", header,
                 DP + f"all-reduce grad(params) over dp op={op}")
    result = simulate_file(path, stop_on_errors=False)
    assert result.agrees is agrees, result.mismatches
    if not agrees:
        assert "loss" not in bad_tensors(result)  # the loss itself is never scaled
        grads = [m for m in result.mismatches if m.tensor.startswith("grad(")]
        # x2 or /2: relative error 1 or 1/2
        assert grads and all(min(abs(m.rel_error - 1.0), abs(m.rel_error - 0.5)) < 1e-9
                             for m in grads)


def test_gradients_not_synchronised_over_dp_differ(tmp_path: Path) -> None:
    path = write(tmp_path, "TwoLinear", "batch 8 seq 2\nmesh dp=2\nmicrobatches 2\n"
                 "loss-scale 1/microbatches", DP)
    result = simulate_file(path, stop_on_errors=False)
    assert not result.agrees and "loss" not in bad_tensors(result)


# -- reshapes of split dimensions: attention heads ----------------------------------------------


def test_attention_heads_split_over_tp_with_dp_agrees(tmp_path: Path) -> None:
    """``view(b, s, H, hd)`` of a tp-split projection splits the split dimension into
    (H/tp, hd); ``q @ k^T`` merges (b/dp, H/tp) into one batched dimension; softmax runs along
    the (whole) key dimension; the merge back to ``[b, s, H*hd]`` is row-parallel's input."""
    path = write(tmp_path, "AttnNet", "batch 4 seq 4\nmesh dp=2, tp=2",
                 DP + ATTENTION_TP + "all-reduce grad(params) over dp op=avg")
    lw = lowered(path)
    assert lw.findings == []
    views = [n for n in lw.stages[0].gm.graph.nodes if "view" in str(n.target)]
    shapes = {tuple(n.meta["val"].shape) for n in views}
    assert (2, 4, 2, 2) in shapes  # local [b/dp, s, H/tp, hd]
    assert (4, 4, 2) in shapes  # local [b/dp * H/tp, s, hd]
    result = simulate_file(path, stop_on_errors=False)
    assert result.agrees, result.mismatches


def test_attention_with_one_head_per_rank_agrees(tmp_path: Path) -> None:
    path = write(tmp_path, "AttnNet", "batch 2 seq 3\nmesh tp=4", ATTENTION_TP)
    assert simulate_file(path, stop_on_errors=False).agrees


def test_heads_not_divisible_by_tp_is_a_lowering_error(tmp_path: Path) -> None:
    """2 heads over tp=4: the projection's 8 units split 2 per rank, but ``view`` to
    (2 heads, 4) would cut a head in two."""
    path = write(tmp_path, "AttnNet", "batch 2 seq 2 heads 2\nmesh tp=4", ATTENTION_TP)
    with pytest.raises(LoweringError) as info:
        lowered(path)
    finding = info.value.findings[0]
    assert finding.code.name in LAYOUT
    assert "not divisible by 4" in finding.message
    assert finding.span is not None and Path(finding.span.file) == path


def test_value_projection_left_unsplit_is_a_lowering_error(tmp_path: Path) -> None:
    body = ATTENTION_TP.replace("split attn.wv.weight [tp, -]\n", "")
    path = write(tmp_path, "AttnNet", "batch 2 seq 2\nmesh tp=2", body)
    with pytest.raises(LoweringError) as info:
        lowered(path)
    assert info.value.findings[0].code.name in LAYOUT


def test_attention_with_a_global_batch_of_one(tmp_path: Path) -> None:
    path = write(tmp_path, "AttnNet", "batch 1 seq 4\nmesh tp=2", ATTENTION_TP)
    assert simulate_file(path, stop_on_errors=False).agrees


# -- softmax ------------------------------------------------------------------------------------


def test_softmax_along_an_unsplit_dimension_agrees(tmp_path: Path) -> None:
    path = write(tmp_path, "SoftmaxNet", "batch 4 seq 2\nmesh dp=2",
                 DP + "all-reduce grad(params) over dp op=avg")
    assert simulate_file(path, stop_on_errors=False).agrees


def test_softmax_along_a_split_dimension_is_a_lowering_error(tmp_path: Path) -> None:
    path = write(tmp_path, "SoftmaxNet", "batch 4 seq 2\nmesh tp=2",
                 "split fc.weight [tp, -]\ncopy fc.in over tp")
    with pytest.raises(LoweringError) as info:
        lowered(path)
    finding = info.value.findings[0]
    assert "split over tp" in finding.message and "_softmax" in finding.message
    assert finding.span.line == line_of(path, "split fc.weight")


# -- layer norm ---------------------------------------------------------------------------------


def test_layer_norm_written_out_with_batch_and_sequence_split_agrees(tmp_path: Path) -> None:
    path = write(tmp_path, "ManualNormNet", "batch 4 seq 4\nmesh dp=2, sp=2",
                 "split x [dp, sp, -]\nsplit target [dp, sp, -]\n"
                 "all-reduce grad(params) over dp, sp op=avg")
    result = simulate_file(path, stop_on_errors=False)
    assert result.agrees, result.mismatches


def test_layer_norm_without_the_gradient_all_reduce_over_sp_differs(tmp_path: Path) -> None:
    path = write(tmp_path, "ManualNormNet", "batch 4 seq 4\nmesh dp=2, sp=2",
                 "split x [dp, sp, -]\nsplit target [dp, sp, -]\n"
                 "all-reduce grad(params) over dp op=avg")
    result = simulate_file(path, stop_on_errors=False)
    assert not result.agrees
    assert {"grad(norm.weight)", "grad(fc.weight)"} <= bad_tensors(result)


def test_torch_layer_norm_with_batch_split_agrees(tmp_path: Path) -> None:
    path = write(tmp_path, "NormNet", "batch 4 seq 2\nmesh dp=2",
                 DP + "all-reduce grad(params) over dp op=avg")
    assert simulate_file(path, stop_on_errors=False).agrees


def test_torch_layer_norm_on_a_replicated_activation_agrees(tmp_path: Path) -> None:
    path = write(tmp_path, "NormAfterRowNet", "batch 4 seq 2\nmesh tp=2", COLUMN_ROW)
    assert simulate_file(path, stop_on_errors=False).agrees


# -- reduce-scatter / all-gather ------------------------------------------------------------------

SEQUENCE_PARALLEL = """
split x [-, tp, -]
split target [-, tp, -]
split fc1.weight [tp, -]
all-gather fc1.in over tp dim=1
split fc2.weight [-, tp]
reduce-scatter fc2.out over tp dim=1
"""


def test_sequence_parallel_all_gather_and_reduce_scatter_agree(tmp_path: Path) -> None:
    """The sequence split over tp is a data axis: each rank's loss is the mean of its piece and
    the backward all-gather hands every rank all pieces' cotangents, so the seed is 1/tp."""
    path = write(tmp_path, "TwoLinear", "batch 2 seq 4\nmesh tp=2\nloss-scale 1/tp",
                 SEQUENCE_PARALLEL)
    lw = lowered(path)
    assert lw.findings == []
    assert lw.lineages["fc1.in"].describe() == "[2, 4, 4]"
    assert lw.lineages["fc2.out"].describe() == "[2, 4/tp, 4]"
    result = simulate_file(path, stop_on_errors=False)
    assert result.agrees, result.mismatches


def test_sequence_parallel_without_the_loss_scale_doubles_the_gradients(tmp_path: Path) -> None:
    path = write(tmp_path, "TwoLinear", "batch 2 seq 4\nmesh tp=2", SEQUENCE_PARALLEL)
    result = simulate_file(path, stop_on_errors=False)
    assert "loss" not in bad_tensors(result)
    grads = [m for m in result.mismatches if m.tensor.startswith("grad(")]
    assert grads and all(abs(m.rel_error - 1.0) < 1e-9 for m in grads)


@pytest.mark.parametrize(("backward", "agrees"), [("", False), (" backward scatter", True)])
def test_reduce_scatter_then_all_gather_of_a_row_parallel_output(tmp_path: Path, backward: str,
                                                               agrees: bool) -> None:
    """Two statements on one point apply in order: reduce-scatter then all-gather of the
    row-parallel output is its all-reduce in the forward. In the backward the replicated
    loss hands every rank the full cotangent; the all-gather's default reduce-scatter
    backward sums the ``tp`` copies (§3.3: it expects a partial cotangent), so every upstream
    gradient is exactly ``tp`` times too large. ``backward scatter`` keeps the rank's block
    of its own copy, and the reduce-scatter's all-gather backward rebuilds the cotangent."""
    body = COLUMN_ROW.replace("all-reduce fc2.out over tp",
                              "reduce-scatter fc2.out over tp dim=1\n"
                              f"all-gather fc2.out over tp dim=1{backward}")
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh tp=2", body)
    lw = lowered(path)
    # the backward layout pass sees the default reduce-scatter summing a complete cotangent
    assert [f.code.name for f in lw.findings] == ([] if agrees else ["collective-mismatch"])
    assert lw.lineages["fc2.out"].describe() == "[4, 2, 4]"
    result = simulate_file(path, stop_on_errors=False)
    assert result.agrees is agrees, result.mismatches
    if not agrees:
        assert "loss" not in bad_tensors(result)
        grads = [m for m in result.mismatches if m.tensor.startswith("grad(")]
        assert {m.tensor for m in grads} == {"grad(fc1.weight)", "grad(fc2.weight)"}
        assert all(abs(m.rel_error - 1.0) < 1e-9 for m in grads)
        assert grads[0].span.line == line_of(path, "all-gather fc2.out") or \
            grads[0].span.line in (line_of(path, "split fc1.weight"),
                                   line_of(path, "split fc2.weight"))


def test_all_gather_instead_of_all_reduce_cannot_be_lowered(tmp_path: Path) -> None:
    """All-gather of the row-parallel partial sum: the gathered ``[b, 2s, d]`` cannot meet the
    ``[b, s, d]`` target; a LoweringError at the plan, not a traceback."""
    body = COLUMN_ROW.replace("all-reduce fc2.out over tp", "all-gather fc2.out over tp dim=1")
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh tp=2", body)
    with pytest.raises(LoweringError) as info:
        lowered(path)
    assert info.value.findings[0].code.name in LAYOUT


# -- incompatible splits ------------------------------------------------------------------------


def test_incompatible_splits_raise_with_the_plan_line(tmp_path: Path) -> None:
    """fc1 column parallel, fc2 left whole: its weight meets a tp-split hidden dimension."""
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh tp=2",
                 "split fc1.weight [tp, -]\ncopy fc1.in over tp")
    with pytest.raises(LoweringError) as info:
        lowered(path)
    finding = info.value.findings[0]
    assert finding.code.name in LAYOUT
    assert "contracted dimension" in finding.message and "mm in fc2" in finding.message
    assert finding.where == "fc2"
    assert finding.span is not None
    assert Path(finding.span.file) == path
    assert finding.span.line == line_of(path, "split fc1.weight") == 4


def test_row_split_weight_on_a_replicated_input_raises(tmp_path: Path) -> None:
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh tp=2", "split fc1.weight [-, tp]")
    with pytest.raises(LoweringError) as info:
        lowered(path)
    assert info.value.findings[0].span.line == line_of(path, "split fc1.weight")


def test_incompatible_input_splits_raise_with_the_plan_line(tmp_path: Path) -> None:
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh dp=2", "split x [dp, -, -]")
    with pytest.raises(LoweringError) as info:
        lowered(path)
    finding = info.value.findings[0]
    assert "meets an operand split as" in finding.message
    assert finding.span is not None and finding.span.line == line_of(path, "split x")


# -- findings of the layout pass -------------------------------------------------------------------


def test_all_reduce_of_a_complete_tensor_is_a_collective_finding(tmp_path: Path) -> None:
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh tp=2",
                 "all-reduce fc2.out over tp")
    lw = lowered(path)
    found = [f for f in lw.findings if f.code.name in COLLECTIVE]
    assert len(found) == 1
    assert "not partial over tp" in found[0].message and "by 2" in found[0].message
    assert found[0].span.line == line_of(path, "all-reduce fc2.out") and found[0].where == \
        "fc2.out"
    assert "loss" in bad_tensors(simulate_file(path, stop_on_errors=False))


def test_all_reduce_of_a_split_tensor_is_a_collective_finding(tmp_path: Path) -> None:
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh tp=2",
                 COLUMN_ROW + "all-reduce fc1.out over tp")
    lw = lowered(path)
    found = [f for f in lw.findings if f.code.name in COLLECTIVE]
    assert found and "split over tp" in found[0].message
    assert found[0].span.line == line_of(path, "all-reduce fc1.out")


def test_claims_on_computed_tensors(tmp_path: Path) -> None:
    """``split fc1.out [tp, -, -]`` contradicts the derived ``[.., .., 8/tp]``; a replicated
    claim after the all-reduce holds; ``partial fc2.out`` after it does not."""
    body = COLUMN_ROW + ("split fc1.out [tp, -, -]\nreplicate fc2.out\n")
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh tp=2", body)
    lw = lowered(path)
    claims = [f for f in lw.findings if f.code.name in CLAIM]
    assert len(claims) == 1
    assert claims[0].where == "fc1.out" and "dimension 0" in claims[0].message
    assert claims[0].span.line == line_of(path, "split fc1.out")
    assert Path(claims[0].span.file) == path
    # claims never change the program: every computed value agrees, only the false claim
    # fails its value check (docs/semantics.md §8 item 4), at its line
    result = simulate_file(path, stop_on_errors=False)
    assert {m.check for m in result.mismatches} == {"claims"}
    assert {m.span.line for m in result.mismatches} == {line_of(path, "split fc1.out")}


def test_true_claims_give_no_finding(tmp_path: Path) -> None:
    body = COLUMN_ROW.replace("all-reduce fc2.out over tp", "") + \
        "split fc1.out [-, -, tp]\npartial fc2.out over tp"
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh tp=2", body)
    lw = lowered(path)
    assert not CLAIM & set(codes(lw))
    assert "partial-nonlinear" in codes(lw)  # the loss is still computed from a partial sum


def test_partial_claim_on_a_complete_tensor(tmp_path: Path) -> None:
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh tp=2",
                 COLUMN_ROW + "partial fc2.out over tp")
    claims = [f for f in lowered(path).findings if f.code.name in CLAIM]
    assert len(claims) == 1 and "complete over it" in claims[0].message
    assert claims[0].span.line == line_of(path, "partial fc2.out")


def test_a_claim_over_an_axis_it_does_not_name_says_so(tmp_path: Path) -> None:
    """`replicate fc2.out over dp` says nothing of tp, which is then claimed replicated: the
    row-parallel output's partial sum over tp (no all-reduce) contradicts it, and the
    finding says the claim over tp comes from the axis not being named, and what to write
    if partial is meant; naming tp gives the plain message."""
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh dp=2, tp=2",
                 COLUMN_ROW.replace("all-reduce fc2.out over tp", "") +
                 "replicate fc2.out over dp\n")
    claims = [f for f in lowered(path).findings if f.code.name in CLAIM]
    assert len(claims) == 1, claims
    assert "no layout statement of `fc2.out` names tp" in claims[0].message
    assert "add `partial fc2.out over tp op=sum` if that is meant" in claims[0].message
    path = write(tmp_path, "TwoLinear", "batch 4 seq 2\nmesh dp=2, tp=2",
                 COLUMN_ROW.replace("all-reduce fc2.out over tp", "") +
                 "replicate fc2.out over dp, tp\n")
    claims = [f for f in lowered(path).findings if f.code.name in CLAIM]
    assert len(claims) == 1 and "names tp" not in claims[0].message
    assert "(a reduction is missing)" in claims[0].message


def test_partial_sum_into_a_nonlinear_op_names_the_module(tmp_path: Path) -> None:
    path = write(tmp_path, "PoolNet", "batch 4 seq 2\nmesh tp=2", POOL)
    found = [f for f in lowered(path).findings if f.code.name == "partial-nonlinear"]
    assert len(found) == 1
    assert "tanh" in found[0].message and "reduce it first" in found[0].message
    assert found[0].span.line == line_of(path, "split proj.weight")
