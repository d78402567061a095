"""Simulate a plan file end to end: the full-size binding and layout pass first (what
``tvp lint --spec`` runs; any error stops here), then build the spec at shrunk sizes
(``simulate.shrink``), lower, run both sides and compare."""

from __future__ import annotations

from pathlib import Path

from trainverify_dsl.lower.findings import LoweringError
from trainverify_dsl.lower.lowering import lower
from trainverify_dsl.report.diagnostics import Diagnostic, Severity
from trainverify_dsl.simulate.run import SimulationResult, simulate_lowered, spec_optimizer
from trainverify_dsl.simulate.setup import SimulationSetup, SimulationSetupError, prepare


class ShrinkingLostDivisibility(RuntimeError):
    """The plan lowers at full size but not at its shrunk sizes: a bug of the shrinking rule,
    never a finding about the plan (an internal error, exit 2)."""


def full_size_diagnostics(path: str | Path) -> list[Diagnostic]:
    """The layout pass of ``tvp lint --spec`` at the plan's real sizes; raises
    ``SimulationSetupError`` carrying every diagnostic when one of them is an error."""
    from trainverify_dsl.lower.diagnose import layout_diagnostics

    found = layout_diagnostics(path)
    if any(d.severity is Severity.ERROR for d in found):
        raise SimulationSetupError(found)
    return found


def simulate_file(path: str | Path, *, seed: int = 0,
                  shrink: bool | None = None) -> SimulationResult:
    """Raises ``SimulationSetupError`` (with diagnostics when the plan has errors at full
    size) or ``SpecError``. ``shrink``: ``None`` shrinks large models, ``True`` always,
    ``False`` never (``prepare``)."""
    findings = full_size_diagnostics(path)
    setup: SimulationSetup = prepare(path, shrink=shrink)
    if setup.plan.clip_grad_norm is not None:
        raise SimulationSetupError([], f"{path}: `clip-grad-norm` is not simulated yet "
                                       "(neither side would clip, so agreement would say "
                                       "nothing about it)")
    from trainverify_dsl.spec.trace import trace_training_step

    spec = trace_training_step(setup.fake_model, setup.input_specs,
                               spec_optimizer(setup.plan), reuse=False)
    try:
        lowered = lower(setup.plan, setup.fake_model, setup.fake_inputs)
    except LoweringError as error:
        message = "; ".join(f.message for f in error.findings)
        raise ShrinkingLostDivisibility(f"the plan lowers at full size but not at the shrunk "
                                        f"sizes {setup.overrides}: {message}") from None
    if lowered.findings:
        message = "; ".join(f.message for f in lowered.findings)
        raise ShrinkingLostDivisibility(f"the shrunk plan (sizes {setup.overrides}) has "
                                        f"findings the full-size plan has not: {message}")
    result = simulate_lowered(lowered, spec, setup.real_model, seed)
    result.sizes = dict(setup.overrides)
    result.findings = findings
    return result
