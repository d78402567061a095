"""Mutations of correct plans: every one makes the simulation disagree with the spec, and the
layout pass (forward and backward, no numbers) flags every one of them too.

Mutations are made on the resolved plan (so statements that come from stdlib templates are
mutated too): drop a collective, swap all-reduce for all-gather, change avg <-> sum, move a
collective to another mesh axis, change the loss scale, and reorder pipeline stages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from trainverify_dsl.api import prepare, spec_optimizer
from trainverify_dsl.lower.findings import LoweringError
from trainverify_dsl.lower.lowering import lower
from trainverify_dsl.plan.model import Plan
from trainverify_dsl.simulate import run as sim
from trainverify_dsl.spec.trace import trace_training_step

ROOT = Path(__file__).resolve().parents[1]

#: Findings that mean "the layout pass saw it"
STATIC = {"partial-nonlinear", "mixed-partial", "collective-mismatch", "layout-mismatch",
          "claim-contradicts-layout", "stage-order", "missing-collective",
          "loss-scale-mismatch"}


def _with(plan: Plan, index: int, statement: Any | None) -> Plan:
    rest = plan.collectives[:index] + ((statement,) if statement else ()) + \
        plan.collectives[index + 1:]
    return dataclasses.replace(plan, collectives=rest)


def mutations(plan: Plan) -> Iterator[tuple[str, Plan]]:
    assert plan.mesh is not None
    axes = [a.name for a in plan.mesh.axes if a.name != "pp"]
    for i, st in enumerate(plan.collectives):
        yield f"drop {st.kind} {st.target}", _with(plan, i, None)
        if st.kind == "all-reduce":
            flipped = "sum" if st.op == "avg" else "avg"
            yield f"op={flipped} {st.target}", _with(plan, i, dataclasses.replace(st, op=flipped))
            if not st.target.grad:
                gather = dataclasses.replace(st, kind="all-gather", op=None, dim=-1,
                                             backward="reduce-scatter")
                yield f"all-gather {st.target}", _with(plan, i, gather)
        other = [a for a in axes if a not in st.axes]
        if other:
            moved = dataclasses.replace(st, axes=(other[0],))
            yield f"over {other[0]} {st.target}", _with(plan, i, moved)
    if plan.microbatches > 1:
        yield "loss-scale 1", dataclasses.replace(plan, loss_scale=Fraction(1))
    if len(plan.stages) > 1:
        first, last = plan.stages[0], plan.stages[-1]
        swapped = (dataclasses.replace(first, members=last.members),) + plan.stages[1:-1] + \
            (dataclasses.replace(last, members=first.members),)
        yield "swap first and last stage", dataclasses.replace(plan, stages=swapped)


class Subject:
    def __init__(self, name: str) -> None:
        self.setup = prepare(ROOT / "plans" / f"{name}.tvp")
        self.specs: dict[tuple[str, ...], Any] = {}

    def spec(self, points: list[str]) -> Any:
        """The reference step with ``points`` marked (traced once per set of points)."""
        key = tuple(points)
        if key not in self.specs:
            self.specs[key] = trace_training_step(
                self.setup.fake_model, self.setup.input_specs,
                spec_optimizer(self.setup.plan), reuse=False, points=points)
        return self.specs[key]

    def outcome(self, plan: Plan) -> tuple[bool, set[str]]:
        """(simulation agrees, static finding codes); a lowering error is static and never
        agrees."""
        try:
            lowered = lower(plan, self.setup.fake_model, self.setup.fake_inputs)
        except LoweringError as error:
            return False, {f.code.name for f in error.findings}
        from trainverify_dsl.api import simulate_programs
        from trainverify_dsl.lower.program import parallel_program

        program = parallel_program(lowered)
        result = simulate_programs(program, self.spec(sim.reference_points(program)),
                                   spec_optimizer(self.setup.plan), self.setup.real_model)
        return result.agrees, {f.code.name for f in lowered.findings}


#: llama_tiny_tp's mutations take over a minute: `slow` (the fast loop keeps the other two)
SUBJECTS = (pytest.param("llama_tiny_tp", marks=pytest.mark.slow), "mlp_tiny_dp",
            "deepseek_tiny_pp")


@pytest.fixture(scope="module", params=SUBJECTS)
def subject(request: pytest.FixtureRequest) -> Subject:
    return Subject(request.param)


def test_the_unmutated_plan_agrees_and_is_clean(subject: Subject) -> None:
    agrees, static = subject.outcome(subject.setup.plan)
    assert agrees and not static


def test_every_mutation_disagrees(subject: Subject) -> None:
    results = {name: subject.outcome(plan) for name, plan in mutations(subject.setup.plan)}
    assert len(results) >= 2
    agreeing = [name for name, (agrees, _) in results.items() if agrees]
    assert not agreeing, f"mutations the simulation did not catch: {agreeing}"
    flagged = {name for name, (_, static) in results.items() if static & STATIC}
    assert flagged == set(results), f"not flagged statically: {sorted(set(results) - flagged)}"
