"""Simulate a plan file end to end: the full-size binding and layout pass first (what
``tvp lint --spec`` runs; any error stops here), then build the spec at shrunk sizes
(``simulate.shrink``), lower the plan to its ``ParallelProgram``, trace the reference step,
evaluate both on the same random values, check the reference against eager torch
(``simulate.torch_step``) and run the named checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trainverify_dsl.ir.parallel import ParallelProgram, parallel_problems
from trainverify_dsl.lower.findings import LoweringError
from trainverify_dsl.lower.lowering import Lowered, lower
from trainverify_dsl.lower.program import parallel_program
from trainverify_dsl.report.diagnostics import Diagnostic, Severity
from trainverify_dsl.simulate.budget import (
    Estimate,
    default_budget,
    estimate,
    human,
    without_idle_axes,
)
from trainverify_dsl.simulate.run import (
    FLOOR,
    TOLERANCE,
    SimulationResult,
    compare_programs,
    plan_states,
    random_inputs,
    reference_points,
    spec_optimizer,
)
from trainverify_dsl.simulate.setup import SimulationSetup, SimulationSetupError, prepare
from trainverify_dsl.simulate.torch_step import check_reference


def over_budget(plan: Any, need: Estimate, budget: int, shrunk: bool) -> Diagnostic:
    """TVP501 at the ``mesh`` line, with the estimate and what to do."""
    from trainverify_dsl.report.codes_run import OVER_BUDGET

    advice = "raise the budget with --max-memory, or use fewer ranks" if shrunk else \
        "simulate with shrunk widths (the default, without --no-shrink), raise the budget " \
        "with --max-memory, or use fewer ranks"
    return Diagnostic(
        OVER_BUDGET, f"simulating this plan would need {need.describe()}, above the budget "
        f"of {human(budget)}", plan.mesh.span,
        ("estimated from the lowered program's types before anything is allocated",), advice)


class ShrinkingLostDivisibility(RuntimeError):
    """The plan lowers at full size but not at its shrunk sizes: a bug of the shrinking rule,
    never a finding about the plan (an internal error, exit 2)."""


def simulate_lowered(lowered: Lowered, program: ParallelProgram, reference: Any,
                     reference_opt: Any, model: Any, seed: int = 0) -> SimulationResult:
    """Both programs on the same random values (``seed``), then the named checks."""
    problems = parallel_problems(program)
    if problems:
        raise AssertionError("invalid parallel program: " + "; ".join(problems[:5]))
    rng = np.random.default_rng(seed)
    values = random_inputs(reference.program.inputs, model, rng)
    plan_states(program, values, rng)
    want = reference.evaluate(values)
    # the reference IR against eager torch first: a verdict on a wrong reference is no verdict
    check_reference(want, model, values, list(lowered.binding.data), reference_opt,
                    TOLERANCE, FLOOR)
    return compare_programs(program, want, values, reference_opt)


def simulate_file(path: str | Path, *, seed: int = 0, shrink: bool | None = None,
                  allow_model_outside_root: bool = False,
                  stop_on_errors: bool = True, max_memory: int | None = None
                  ) -> SimulationResult:
    """Raises ``SimulationSetupError`` (with diagnostics when the plan has errors at full
    size, or its estimated memory exceeds ``max_memory`` bytes: TVP501) or ``SpecError``.
    ``shrink``: ``None`` shrinks large models, ``True`` always, ``False`` never
    (``prepare``). ``allow_model_outside_root``: see ``prepare``. ``stop_on_errors=False``
    simulates a plan with full-size errors too (tests measure what a wrong plan computes); its
    ``findings`` then hold the errors. ``max_memory``: the budget in bytes (default: half of
    the machine's memory, ``simulate.budget``). Mesh axes no statement uses run at size 1."""
    from trainverify_dsl.lower.diagnose import layout_diagnostics

    findings = layout_diagnostics(path, allow_model_outside_root=allow_model_outside_root)
    errors = [d for d in findings if d.severity is Severity.ERROR]
    if errors and stop_on_errors:
        raise SimulationSetupError(findings)
    setup: SimulationSetup = prepare(path, shrink=shrink, real=False,
                                     allow_model_outside_root=allow_model_outside_root)
    setup.plan, idle = without_idle_axes(setup.plan)
    if setup.plan.clip_grad_norm is not None:
        raise SimulationSetupError([], f"{path}: `clip-grad-norm` is not simulated yet "
                                       "(neither side would clip, so agreement would say "
                                       "nothing about it)")
    from trainverify_dsl.spec.trace import trace_training_step

    reference_opt = spec_optimizer(setup.plan)
    shrunk = bool(setup.overrides)
    try:
        lowered = lower(setup.plan, setup.fake_model, setup.fake_inputs)
    except LoweringError as error:
        if not shrunk or errors:
            raise
        message = "; ".join(f.message for f in error.findings)
        raise ShrinkingLostDivisibility(f"the plan lowers at full size but not at the shrunk "
                                        f"sizes {setup.overrides}: {message}") from None
    if shrunk and len(lowered.findings) > len(findings):
        message = "; ".join(f.message for f in lowered.findings)
        raise ShrinkingLostDivisibility(f"the shrunk plan (sizes {setup.overrides}) has "
                                        f"findings the full-size plan has not: {message}")
    program = parallel_program(lowered)
    spec = trace_training_step(setup.fake_model, setup.input_specs, reference_opt, reuse=False,
                               points=reference_points(program))
    budget = default_budget() if max_memory is None else max_memory
    need = estimate(program, [g.type for g in spec.program.inputs], spec.program)
    if need.bytes > budget:
        raise SimulationSetupError([over_budget(setup.plan, need, budget, shrunk)])
    result = simulate_lowered(lowered, program, spec, reference_opt, setup.build_real(), seed)
    result.sizes = dict(setup.overrides)
    result.idle_axes = idle
    result.estimated_bytes = need.bytes
    result.findings = findings
    return result
