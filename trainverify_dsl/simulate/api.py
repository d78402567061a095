"""Simulate a plan file end to end: resolve, build the spec at (possibly shrunk) sizes, lower,
run both sides and compare."""

from __future__ import annotations

from pathlib import Path

from trainverify_dsl.lower.diagnose import to_diagnostic
from trainverify_dsl.lower.lowering import lower
from trainverify_dsl.simulate.run import SimulationResult, simulate_lowered, spec_optimizer
from trainverify_dsl.simulate.setup import SimulationSetup, SimulationSetupError, prepare


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

    spec = trace_training_step(setup.fake_model, setup.input_specs,
                               spec_optimizer(setup.plan), reuse=False)
    lowered = lower(setup.plan, setup.fake_model, setup.fake_inputs)
    result = simulate_lowered(lowered, spec, setup.real_model, seed)
    result.sizes = dict(setup.overrides)
    fallback = setup.plan.spec.origin.span if setup.plan.spec else None
    result.findings = [to_diagnostic(f, fallback) for f in lowered.findings]
    return result
