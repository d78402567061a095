"""`tvp check` proves a plan of more than two microbatches with two where its meaning allows
(docs/checking.md, "Fewer microbatches"; ``shrink.fewer_microbatches``).

The reduction is taken only when the seed times the count is the same at both counts, nothing
else depends on the count, the loss is a local mean, nothing clips and no gradient statement
runs after a given microbatch; every verdict with it says so. A plan whose seed is written
for one count keeps its count (a literal `1/2` with four microbatches is a counterexample,
never verified; a literal `1/4` is verified with all four); with and without the reduction
the verdicts agree on correct plans and on one-line faults.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl import api
from trainverify_dsl.api import check_file
from trainverify_dsl.check.verdict import COUNTEREXAMPLE, VERIFIED
from trainverify_dsl.shrink import CHECKED_MICROBATCHES, fewer_microbatches

ROOT = Path(__file__).resolve().parents[1]
PLAN = ('plan m\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 16 seq 1\n'
        "spec-optimizer sgd lr=0.1 momentum=0.9\nmesh dp=2\nmicrobatches 4\n"
        "loss-scale 1/microbatches\nsplit x [dp, -]\nsplit target [dp, -]\n"
        "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.1 momentum=0.9\n")


def write(tmp_path: Path, text: str, name: str = "p.tvp") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def reduced(verdict) -> bool:
    return any(a.startswith("microbatches: proven with 2 of the plan's")
               for a in verdict.assumptions)


def test_a_plan_with_one_over_the_count_is_proven_with_two(tmp_path: Path) -> None:
    path = write(tmp_path, PLAN)
    built = api.build_programs(path, shrink=True, blocks=True, fewer=True)
    assert built.program.microbatches == CHECKED_MICROBATCHES
    assert built.microbatches_of_plan == 4
    # the batch shrinks with the count: two microbatches of one row on each of 2 dp ranks
    assert built.setup.overrides.get("batch") == 4
    verdict = check_file(path, cache=False)
    assert verdict.verdict == VERIFIED and reduced(verdict), verdict.reason
    # `tvp simulate` runs the plan's own count
    assert api.build_programs(path, shrink=True).program.microbatches == 4


@pytest.mark.parametrize(("scale", "expected", "why"), [
    # a number written for two microbatches: right with two, wrong with four
    ("1/2", COUNTEREXAMPLE, "seed times the microbatch count"),
    # a number written for four: right, and proven with every microbatch
    ("1/4", VERIFIED, "seed times the microbatch count"),
    # right at one count only
    ("1/(microbatches*microbatches)", COUNTEREXAMPLE, "seed times the microbatch count"),
])
def test_a_seed_written_for_one_count_keeps_every_microbatch(
        tmp_path: Path, scale: str, expected: str, why: str) -> None:
    path = write(tmp_path, PLAN.replace("loss-scale 1/microbatches", f"loss-scale {scale}"))
    verdict = check_file(path, cache=False)
    assert verdict.verdict == expected, verdict.reason
    assert not reduced(verdict)
    assert any(why in note and "all 4 microbatches" in note for note in verdict.notes)


@pytest.mark.parametrize(("change", "why"), [
    (("op=avg", "op=avg after=2"), "runs after microbatch 2"),
    (("\noptimizer sgd", "\nclip-grad-norm 1.0\noptimizer sgd"), "clipping"),
    (("split x", "loss-reduction token-mean\nsplit x"), "counts over the microbatches"),
    # `after=microbatches` is the last microbatch at any count, but another statement's value
    # depends on the count: not reduced
    (("op=avg", "op=avg after=microbatches"), "another statement"),
])
def test_what_couples_the_microbatches_keeps_them(tmp_path: Path, change: tuple[str, str],
                                                   why: str) -> None:
    text = PLAN.replace(*change)
    if "clip-grad-norm" in text:
        text = text.replace("spec-optimizer sgd lr=0.1 momentum=0.9",
                            "spec-optimizer sgd lr=0.1 momentum=0.9 clip-grad-norm=1.0")
    if "token-mean" in text:
        text = text.replace("loss-scale 1/microbatches\n", "").replace(
            "all-reduce grad(params) over dp op=avg", "all-reduce grad(params) over dp op=sum")
    path = write(tmp_path, text)
    plan = api.resolve_plan(path)
    try:
        smaller = api.resolve_plan(path, {"microbatches": CHECKED_MICROBATCHES})
    except api.SimulationSetupError:
        smaller = None
    found = fewer_microbatches(plan, smaller)
    assert found is not None and why in found, found
    built = api.build_programs(path, shrink=True, fewer=True)
    assert built.program.microbatches == 4 and why in built.same_microbatches_why


@pytest.mark.parametrize("fault", [
    None,
    ("op=avg", "op=sum"),                                   # a sum where the mean is meant
    ("loss-scale 1/microbatches\n", ""),                    # no seed: gradients x4
    ("loss-scale 1/microbatches", "loss-scale 2/microbatches"),
    ("momentum=0.9\nmesh", "momentum=0.5\nmesh"),           # the recipe's momentum
    ("split target [dp, -]", "split target [-, -]"),        # labels not split with the data
])
def test_the_verdict_is_the_same_with_every_microbatch(tmp_path: Path, fault) -> None:
    text = PLAN if fault is None else PLAN.replace(*fault)
    assert fault is None or text != PLAN
    path = write(tmp_path, text)
    fewer = check_file(path, cache=False)
    every = check_file(path, cache=False, fewer_microbatches=False)
    assert (fewer.verdict, bool(fewer.diagnostics)) == (every.verdict, bool(every.diagnostics))
    assert not reduced(every)
    if fewer.verdict == VERIFIED:
        assert reduced(fewer)
    if fewer.counterexample is not None and every.counterexample is not None:
        assert fewer.counterexample.span == every.counterexample.span


def test_after_each_and_a_seed_with_other_factors_are_reduced(tmp_path: Path) -> None:
    """Gradient statements after every microbatch act on each term, linearly; a seed
    `1/(microbatches*dp)` (DeepSeek-V3's plan) times the count does not depend on it."""
    each = write(tmp_path, PLAN.replace("op=avg", "op=avg after=each"), "each.tvp")
    verdict = check_file(each, cache=False)
    assert verdict.verdict == VERIFIED and reduced(verdict), verdict.reason
    other = write(tmp_path, PLAN.replace("loss-scale 1/microbatches",
                                         "loss-scale 1/(microbatches*dp)")
                  .replace("op=avg", "op=sum"), "other.tvp")
    verdict = check_file(other, cache=False)
    assert verdict.verdict == VERIFIED and reduced(verdict), verdict.reason


def test_an_op_mixing_the_microbatches_rows_stops_the_check(tmp_path: Path) -> None:
    """The argument needs every op but the loss's mean to keep microbatches apart (the two
    microbatches carry the same ids, under which a batch statistic of duplicated rows would
    equal one microbatch's): the layout pass, which runs first, rejects an op mixing the rows
    of different microbatches, so such a plan is never verified with two."""
    (tmp_path / "center.py").write_text('''import torch
from torch import nn


class Center(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.d = d
        self.fc = nn.Linear(d, d)

    def input_specs(self, batch, seq):
        dt = torch.get_default_dtype()
        return {"x": ((batch, self.d), dt), "y": ((batch, self.d), dt)}

    def forward(self, x, y):
        h = torch.tanh(self.fc(x))
        h = h - h.mean(0, keepdim=True)
        return ((h - y) ** 2).mean()
''')
    path = write(tmp_path, 'plan c\nspec "center.py:Center" batch 16 seq 1\n'
                 "spec-optimizer sgd lr=0.1\nmesh dp=1\nmicrobatches 4\n"
                 "loss-scale 1/microbatches\nsplit x [dp, -]\nsplit y [dp, -]\n"
                 "optimizer sgd lr=0.1\n")
    verdict = check_file(path, cache=False)
    assert verdict.verdict != VERIFIED
    assert {d.code.id for d in verdict.diagnostics} & {"TVP403", "TVP404"}
