"""Simulate a plan file end to end: resolve, build the spec at (possibly shrunk) sizes, lower
to the plan's ``ParallelProgram``, trace the reference step, evaluate both and compare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trainverify_dsl.ir.parallel import ParallelProgram, parallel_problems
from trainverify_dsl.lower.diagnose import to_diagnostic
from trainverify_dsl.lower.lowering import Lowered, lower
from trainverify_dsl.lower.program import parallel_program
from trainverify_dsl.simulate.run import (
    SimulationResult,
    compare_programs,
    plan_states,
    random_inputs,
    spec_optimizer,
    spec_values_at,
)
from trainverify_dsl.simulate.setup import SimulationSetup, SimulationSetupError, prepare


def simulate_lowered(lowered: Lowered, program: ParallelProgram, reference: Any,
                     reference_opt: Any, model: Any, seed: int = 0) -> SimulationResult:
    """Both programs on the same random values (``seed``), then the named checks."""
    problems = parallel_problems(program)
    if problems:
        raise AssertionError("invalid parallel program: " + "; ".join(problems[:5]))
    rng = np.random.default_rng(seed)
    values = random_inputs(reference.program.inputs, model, rng)
    plan_states(program, values, rng)
    points = [lin.point for lin in program.lineages if lin.point != "loss"]
    want_points = spec_values_at(model, values, list(lowered.binding.data), points) \
        if points else {}
    return compare_programs(program, reference, values, reference_opt, want_points)


def simulate_file(path: str | Path, *, seed: int = 0, shrink: bool = True,
                  allow_model_outside_root: bool = False) -> SimulationResult:
    """Raises ``SimulationSetupError`` / ``LoweringError`` / ``SpecError`` with diagnostics.
    ``allow_model_outside_root``: see ``simulate.setup.prepare``."""
    setup: SimulationSetup = prepare(path, shrink=shrink,
                                     allow_model_outside_root=allow_model_outside_root)
    if setup.plan.clip_grad_norm is not None:
        raise SimulationSetupError([], f"{path}: `clip-grad-norm` is not simulated yet "
                                       "(neither side would clip, so agreement would say "
                                       "nothing about it)")
    from trainverify_dsl.spec.trace import trace_training_step

    reference_opt = spec_optimizer(setup.plan)
    spec = trace_training_step(setup.fake_model, setup.input_specs, reference_opt, reuse=False)
    lowered = lower(setup.plan, setup.fake_model, setup.fake_inputs)
    program = parallel_program(lowered)
    result = simulate_lowered(lowered, program, spec, reference_opt, setup.real_model, seed)
    result.sizes = dict(setup.overrides)
    fallback = setup.plan.spec.origin.span if setup.plan.spec else None
    result.findings = [to_diagnostic(f, fallback) for f in lowered.findings]
    return result
