"""`tvp check` proves a plan whose data-parallel axis has more than two ranks with two, where
its meaning allows (docs/checking.md, "Fewer data-parallel ranks"; ``shrink.data_axis_refusal``,
``shrink.fewer_ranks``, ``shrink.fewer_ranks_refusal``).

"Data-parallel" is what the plan does along the axis (it splits only inputs' batch and sums
every gradient once), never its name. The reduction is taken only when every row's gradient
weighs the same at both sizes and nothing tells the ranks apart; every verdict with it says
so, and with and without it the verdicts agree on correct plans and on one-line faults.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainverify_dsl import api
from trainverify_dsl.api import check_file
from trainverify_dsl.check.verdict import COUNTEREXAMPLE, VERIFIED
from trainverify_dsl.cli.check_cmd import plan_document
from trainverify_dsl.plan import resolve_file
from trainverify_dsl.shrink import CHECKED_RANKS, data_axis_refusal, fewer_ranks

# an axis named `rows` (no conventional name): four data-parallel ranks, two microbatches
PLAN = ('plan m\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 16 seq 1 d_out 4\n'
        "spec-optimizer adamw lr=0.01 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1\n"
        "mesh rows=4\nmicrobatches 2\nloss-scale 1/microbatches\n"
        "split x [rows, -]\nsplit target [rows, -]\n"
        "all-reduce grad(params) over rows op=avg\n"
        "optimizer adamw lr=0.01 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1\n")
ZERO = PLAN.replace("all-reduce grad(params) over rows op=avg",
                    "reduce-scatter grad(params) over rows dim=0 op=avg").replace(
    "\noptimizer adamw lr=0.01 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1\n",
    "\noptimizer adamw lr=0.01 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1 shard over rows\n")

def write(tmp_path: Path, text: str, name: str = "p.tvp") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def checked_both_ways(tmp_path: Path, plan: str, fault: tuple[str, str] | None):
    """``plan`` with ``fault`` applied, checked with fewer ranks and with every rank: the
    two verdicts (asserted alike)."""
    text = plan if fault is None else plan.replace(*fault)
    assert fault is None or text != plan
    path = write(tmp_path, text)
    fewer = check_file(path, cache=False)
    every = check_file(path, cache=False, fewer_ranks=False)
    assert (fewer.verdict, bool(fewer.diagnostics)) == (every.verdict, bool(every.diagnostics))
    return fewer, every


def reduced(verdict) -> bool:
    return any(a.startswith("data-parallel ranks: proven with rows=2 of the plan's rows=")
               for a in verdict.assumptions)


@pytest.mark.parametrize("text", [PLAN, ZERO], ids=["all-reduce", "zero-1"])
def test_a_data_parallel_axis_is_proven_with_two_ranks(tmp_path: Path, text: str) -> None:
    assert ("shard over rows" in text) is (text == ZERO)
    path = write(tmp_path, text)
    built = api.build_programs(path, shrink=True, blocks=True, fewer=True)
    assert dict(built.program.mesh)["rows"] == CHECKED_RANKS
    assert built.ranks_of_plan == {"rows": 4}
    verdict = check_file(path, cache=False)
    assert verdict.verdict == VERIFIED and reduced(verdict), verdict.reason
    assert verdict.reduced_axes == {"rows": 4}
    assert plan_document(verdict)["reduced_axes"] == {"rows": 4}  # `tvp check --format json`
    # `tvp simulate` runs the plan's mesh
    assert dict(api.build_programs(path, shrink=True).program.mesh)["rows"] == 4


@pytest.mark.parametrize(("scale", "op", "expected", "reduces"), [
    # written in terms of the axis: the same weight at every size
    ("1/(rows*microbatches)", "sum", VERIFIED, True),
    # a number right for four ranks only: verified, with every rank
    ("1/8", "sum", VERIFIED, False),
    # a number right for two ranks only: wrong at four, never reduced to where it is right
    ("1/4", "sum", COUNTEREXAMPLE, False),
])
def test_the_seed_must_weigh_every_row_the_same_at_both_sizes(
        tmp_path: Path, scale: str, op: str, expected: str, reduces: bool) -> None:
    path = write(tmp_path, PLAN.replace("loss-scale 1/microbatches", f"loss-scale {scale}")
                 .replace("op=avg", f"op={op}"))
    verdict = check_file(path, cache=False)
    assert verdict.verdict == expected, verdict.reason
    assert reduced(verdict) is reduces
    if not reduces:
        assert any("every data-parallel rank was run" in n and "seed" in n
                   for n in verdict.notes), verdict.notes


@pytest.mark.parametrize(("change", "why"), [
    (("\noptimizer", "\non rows=1: optimizer adamw lr=0.02\noptimizer"), "names a coordinate"),
    (("\noptimizer adamw", "\nclip-grad-norm 1.0\noptimizer adamw"), "clipping"),
    # the recipe clips and the plan does not: wrong at any size, and not elementwise
    (("weight-decay=0.1\nmesh", "weight-decay=0.1 clip-grad-norm=1.0\nmesh"), "clipping"),
    (("split x [rows, -]", "split x [-, rows]"), "otherwise than on its batch"),
    (("all-reduce grad(params) over rows op=avg",
      "all-reduce grad(params) over rows op=avg\nall-reduce fc1.out over rows"),
     "not a gradient all-reduce"),
    (("all-reduce grad(params) over rows op=avg",
      "all-reduce grad(fc1.weight) over rows op=avg\nall-reduce grad(fc1.bias) over rows\n"
      "all-reduce grad(fc2.weight) over rows op=avg\nall-reduce grad(fc2.bias) over rows "
      "op=avg"), "both sum and average"),
    (("split target [rows, -]", "split target [rows, -]\nloss-reduction token-mean"),
     "counts over the data ranks"),
])
def test_the_plans_statements_keep_the_ranks(tmp_path: Path, change: tuple[str, str],
                                             why: str) -> None:
    text = PLAN.replace(*change)
    assert text != PLAN
    if "\nclip-grad-norm" in text:
        text = text.replace("weight-decay=0.1\nmesh", "weight-decay=0.1 clip-grad-norm=1.0\nmesh")
    # resolved with its diagnostics: a recipe that clips while the plan does not is TVP280
    # already, and the refusal holds of the plan as it stands
    plan = resolve_file(write(tmp_path, text)).plan
    assert plan is not None
    found = data_axis_refusal(plan, "rows")
    assert found is not None and why in found, found


@pytest.mark.parametrize(("change", "why"), [
    (("\noptimizer", "\non rows=1: optimizer adamw lr=0.02\noptimizer"), "names a coordinate"),
    # a claim on an activation over the axis (true here, but a statement about the ranks)
    (("split x [rows, -]", "split x [rows, -]\nsplit fc1.out [rows, -]"), "a claim on `fc1"),
    # one parameter not summed over the ranks, or summed twice: seen on the program
    (("all-reduce grad(params) over rows op=avg",
      "all-reduce grad(fc1.weight) over rows op=avg\nall-reduce grad(fc1.bias) over rows op=avg\n"
      "all-reduce grad(fc2.weight) over rows op=avg"),
     "the gradient of `fc2.bias` goes through 0 gradient statements over `rows`"),
    (("all-reduce grad(params) over rows op=avg",
      "all-reduce grad(params) over rows op=avg\nall-reduce grad(fc2.bias) over rows op=avg"),
     "the gradient of `fc2.bias` goes through 2 gradient statements"),
])
def test_what_tells_the_ranks_apart_keeps_them(tmp_path: Path, change: tuple[str, str],
                                                why: str) -> None:
    text = PLAN.replace(*change)
    assert text != PLAN
    path = write(tmp_path, text)
    built = api.build_programs(path, shrink=True, fewer=True, stop_on_errors=False)
    assert not built.ranks_of_plan
    assert dict(built.program.mesh)["rows"] == 4
    assert why in built.same_ranks_why, built.same_ranks_why


def test_the_plan_level_conditions_name_the_statement(tmp_path: Path) -> None:
    path = write(tmp_path, ZERO.replace("split target [rows, -]",
                                        "split target [rows, -]\nsplit fc1.weight [-, rows]"))
    plan = api.resolve_plan(path)
    why = data_axis_refusal(plan, "rows")
    assert why is not None and "fc1.weight" in why and f"{path}:" in why
    # the same plan with `rows` at 2 is the plan but for the mesh: no reason
    good = write(tmp_path, PLAN, "good.tvp")
    plan = api.resolve_plan(good)
    assert data_axis_refusal(plan, "rows") is None
    assert fewer_ranks(plan, api.resolve_plan(good, {"rows": 2}), {"rows": 4}) is None
    # a statement whose value depends on the axis size is not the same plan at 2
    odd = write(tmp_path, PLAN.replace("lr=0.01 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1\n",
                                       "lr=rows/400 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1\n"
                                       ), "odd.tvp")
    plan = api.resolve_plan(odd)
    why = fewer_ranks(plan, api.resolve_plan(odd, {"rows": 2}), {"rows": 4})
    assert why is not None and "depends on the size of `rows`" in why


@pytest.mark.parametrize("fault", [
    None,
    ("op=avg", "op=sum"),                                    # a sum where the mean is meant
    ("loss-scale 1/microbatches\n", ""),                     # no seed: gradients x2
    ("\noptimizer adamw lr=0.01", "\noptimizer adamw lr=0.02"),   # the recipe's rate
    ("split target [rows, -]", "split target [-, -]"),       # labels not split with the data
    # one parameter's gradient left local (not reduced: run with every rank)
    ("all-reduce grad(params) over rows op=avg",
     "all-reduce grad(fc1.weight) over rows op=avg\nall-reduce grad(fc1.bias) over rows op=avg\n"
     "all-reduce grad(fc2.weight) over rows op=avg"),
])
def test_the_verdict_is_the_same_with_every_rank(tmp_path: Path, fault) -> None:
    fewer, every = checked_both_ways(tmp_path, PLAN, fault)
    assert not reduced(every)
    if fewer.verdict == VERIFIED:
        assert reduced(fewer)
    if fewer.counterexample is not None and every.counterexample is not None:
        assert fewer.counterexample.span == every.counterexample.span


def test_every_rank_carries_its_microbatchs_first_block_of_ids(tmp_path: Path) -> None:
    """Token ids are the same on every data rank of a microbatch in the proof; the
    microbatches keep their own unless they are reduced too, and float inputs stay variables
    (``api.same_block_data``)."""
    path = write(tmp_path, 'plan l\nspec "stdlib/models/llama.py:Llama" config llama_tiny '
                 "batch 16 seq 8\nspec-optimizer sgd lr=0.1\nmesh dp=4\nmicrobatches 2\n"
                 "loss-scale 1/microbatches\nsplit tokens [dp, -]\nsplit labels [dp, -]\n"
                 "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.1\n")
    built = api.build_programs(path, shrink=True, blocks=True, fewer=True)
    assert built.ranks_of_plan == {"dp": 4} and built.microbatches_of_plan is None
    rows = built.setup.fake_inputs["tokens"].shape[0]
    assert rows % 4 == 0
    block = rows // 4  # microbatch-major: (microbatch 0: dp 0, dp 1), (microbatch 1: ...)
    values = {"tokens": np.arange(rows * 8).reshape(rows, 8),
              "labels": np.arange(rows * 8).reshape(rows, 8) + 1,
              "noise": np.linspace(0, 1, rows * 8).reshape(rows, 8)}
    out = api.same_block_data(built.program, values, ["dp"])
    for name in ("tokens", "labels"):
        got, drawn = out[name], values[name]
        for m in range(2):
            first = drawn[2 * m * block:(2 * m + 1) * block]
            assert all(np.array_equal(got[(2 * m + k) * block:(2 * m + k + 1) * block], first)
                       for k in range(2))
        assert not np.array_equal(got[:block], got[2 * block:3 * block])
    assert out["noise"] is values["noise"]  # not a data slot of the program: untouched
    # with the microbatches reduced too, every block is the first
    both = api.same_block_data(built.program, values, ["dp", "@mb"])
    assert all(np.array_equal(both["tokens"][k * block:(k + 1) * block],
                              values["tokens"][:block]) for k in range(4))
    # rows the layout does not cut into its blocks: an error, never a silently weaker proof
    with pytest.raises(ValueError, match="not cut into blocks"):
        api.same_block_data(built.program, {"tokens": values["tokens"][:-1]}, ["dp"])


# the batch split over two axes jointly, the gradients summed over both (as DeepSeek-V3's
# experts over the data ranks: `split tokens [(dp, ep), -]`, non-expert gradients summed over
# (dp, ep)); `cols` has two ranks already
JOINT = PLAN.replace("mesh rows=4", "mesh rows=4, cols=2").replace(
    "split x [rows, -]\nsplit target [rows, -]", "split x [(rows, cols), -]\n"
    "split target [(rows, cols), -]").replace("over rows op=avg", "over rows, cols op=avg")


@pytest.mark.parametrize("fault", [
    None,
    ("over rows, cols op=avg", "over cols op=avg"),          # not summed over `rows`
    ("over rows, cols op=avg", "over rows, cols op=sum"),    # x8
    ("split target [(rows, cols), -]", "split target [(cols, rows), -]"),  # rows mismatched
])
def test_an_axis_splitting_the_batch_with_another_is_proven_with_two_ranks(
        tmp_path: Path, fault) -> None:
    """Session 28: the batch split over (rows, cols) jointly and the gradients all-reduced
    over both: `rows` is proven at 2 (the argument is per `rows` slice of the batch, whatever
    `cols` does inside it), with the verdict the plan gets with every rank."""
    fewer, every = checked_both_ways(tmp_path, JOINT, fault)
    if fault is None:
        assert fewer.verdict == VERIFIED, fewer.reason
        assert fewer.reduced_axes == {"rows": 4} and reduced(fewer)
    else:
        assert fewer.verdict != VERIFIED


def test_a_reduce_scatter_over_a_group_holding_the_axis_keeps_the_ranks(tmp_path: Path) -> None:
    """Its blocks are cut over the whole group, so they depend on the axis's size."""
    text = JOINT.replace("all-reduce grad(params) over rows, cols op=avg",
                         "reduce-scatter grad(params) over rows, cols dim=0 op=avg").replace(
        "\noptimizer adamw lr=0.01 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1\n",
        "\noptimizer adamw lr=0.01 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1 "
        "shard over rows, cols\n")
    assert "shard over rows, cols" in text
    plan = resolve_file(write(tmp_path, text)).plan
    assert plan is not None
    why = data_axis_refusal(plan, "rows")
    assert why is not None and "reduce-scatter over `rows` alone" in why, why


def test_a_sum_over_the_ranks_after_one_microbatch_keeps_them(tmp_path: Path) -> None:
    """`after=1` sums the first microbatch's gradients over the ranks and leaves the second's
    on each rank: ranks that carried the same data would hide it."""
    path = write(tmp_path, PLAN.replace("microbatches 2\n", "microbatches 3\n").replace(
        "over rows op=avg", "over rows op=avg after=1"))
    why = data_axis_refusal(api.resolve_plan(path), "rows")
    assert why is not None and "runs after microbatch 1" in why


@pytest.mark.parametrize(("batch", "microbatches", "ranks", "note"), [
    # 6 rows over rows=3 and 2 microbatches: no room for rows=2 and 2 microbatches
    (6, 2, True, "every data-parallel rank was run: `rows`: the plan does not shrink or lower"),
    # 9 rows over rows=3 and 3 microbatches: nor for 2 microbatches, with or without rows=2
    (9, 3, False, "all 3 microbatches were run: the plan does not shrink or lower"),
    (9, 3, True, "all 3 microbatches were run: the plan does not shrink or lower"),
])
def test_sizes_the_reduced_plan_cannot_take_keep_the_plans(
        tmp_path: Path, batch: int, microbatches: int, ranks: bool, note: str) -> None:
    """A batch that divides the plan's ranks and microbatches but not two of each: the
    reductions are not taken (the shrinking makes up no divisibility), and the plan is
    proven at its own sizes, never an internal error (found by an adversarial run)."""
    text = PLAN.replace("batch 16", f"batch {batch}").replace(
        "microbatches 2\n", f"microbatches {microbatches}\n").replace(
        "mesh rows=4", "mesh rows=3")
    verdict = check_file(write(tmp_path, text), cache=False, fewer_ranks=ranks)
    assert verdict.verdict == VERIFIED, verdict.reason
    assert not verdict.reduced_axes and not reduced(verdict)
    assert any(n.startswith(note) for n in verdict.notes), verdict.notes
