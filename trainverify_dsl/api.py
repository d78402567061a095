"""The drivers: from a plan file to what the commands report. Above ``lower/``, ``simulate/``
and (later) ``check/``; those stages never read a plan file, and nothing after the lowering reads
the ``Plan``.

- ``prepare``: resolve the plan, locate and build its spec model (fake for tracing and
  lowering, real for its buffers) and the input shapes, shrunk when the model is too large to
  run (``trainverify_dsl/shrink.py``);
- ``layout_diagnostics``: the full-size binding and layout pass as diagnostics (``tvp lint
  --spec``);
- ``simulate_file``: ``tvp simulate`` end to end: the layout pass first (any error stops
  here), the shrunk sizes, the plan lowered to its ``ParallelProgram``, the reference step
  traced from the spec with the plan's marked points, both evaluated on the same random values
  (``simulate/``), the reference checked against eager torch, then the named checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainverify_dsl.ir.parallel import ParallelProgram, parallel_problems
from trainverify_dsl.lower.diagnose import to_diagnostic
from trainverify_dsl.lower.findings import LoweringError
from trainverify_dsl.lower.lowering import Lowered, lower
from trainverify_dsl.lower.program import parallel_program
from trainverify_dsl.plan.model import Plan
from trainverify_dsl.report.diagnostics import Diagnostic, Severity
from trainverify_dsl.report.span import Span
from trainverify_dsl.shrink import without_idle_axes
from trainverify_dsl.simulate.budget import Estimate, default_budget, estimate, human
from trainverify_dsl.simulate.run import (
    FLOOR,
    TOLERANCE,
    SimulationResult,
    compare_programs,
    plan_states,
    random_inputs,
    reference_points,
)
from trainverify_dsl.simulate.torch_step import check_reference
from trainverify_dsl.spec import optim


class SimulationSetupError(Exception):
    def __init__(self, diagnostics: list[Diagnostic], message: str = "") -> None:
        super().__init__(message or "; ".join(d.message for d in diagnostics))
        self.diagnostics = diagnostics


@dataclass
class SimulationSetup:
    plan: Plan
    fake_model: torch.nn.Module
    #: built only when asked for (a full-size model would not fit in memory)
    real_model: torch.nn.Module | None
    input_specs: dict[str, Any]
    fake_inputs: dict[str, torch.Tensor]
    #: config overrides and batch/seq used (empty when nothing was shrunk)
    overrides: dict[str, Any]
    #: how to build the real model later (``build_real``): the located model reference and
    #: the keyword arguments the fake model was built with
    model_ref: Any = None
    model_kwargs: dict[str, Any] | None = None

    def build_real(self) -> torch.nn.Module:
        """The real model (float32 weights allocated), built once, after the budget check."""
        from trainverify_dsl.spec.load import load_model

        if self.real_model is None:
            self.real_model = load_model(self.model_ref, fake=False, **(self.model_kwargs or {}))
        return self.real_model


def resolve_plan(path: str | Path) -> Plan:
    from trainverify_dsl.plan import resolve_file

    result = resolve_file(path)
    errors = [d for d in result.diagnostics if d.severity is Severity.ERROR]
    if result.plan is None or errors:
        raise SimulationSetupError(errors or list(result.diagnostics),
                                   f"{path}: the plan has errors; run `tvp lint {path}`")
    return result.plan


def prepare(path: str | Path, *, shrink: bool | None = None, real: bool = True,
            allow_model_outside_root: bool = False) -> SimulationSetup:
    """Resolve the plan and build its model. The model file is looked up from the plan's
    folder and must lie inside it, the project or the stdlib unless
    ``allow_model_outside_root`` (``spec/load.py``); a refused file is not imported.
    ``shrink``: ``None`` shrinks a model with a width above ``shrink.SMALL`` (or a batch
    above 64), ``True`` always shrinks, ``False`` never does."""
    from trainverify_dsl.shrink import NOT_CONFIG, needs_shrinking
    from trainverify_dsl.spec.load import load_model, model_input_specs

    plan = resolve_plan(path)
    if plan.spec is None or plan.mesh is None:
        raise SimulationSetupError([], f"{path}: a simulated plan needs a `spec` line and a "
                                       "`mesh`")
    settings = {k: _plain(v) for k, v in plan.spec.settings if k not in NOT_CONFIG}
    # located (and refused if outside the allowed roots) before anything imports it
    model_ref = locate_model(plan, Path(path), allow_model_outside_root)
    if shrink is None:
        shrink = needs_shrinking(plan, settings)
    overrides, batch, seq = _shrunk(plan, settings, model_ref) if shrink else ({}, None, None)
    batch = batch or plan.spec.batch or 1
    seq = seq or plan.spec.seq or 1
    kwargs = {**settings, **overrides}
    fake = load_model(model_ref, **kwargs)
    real_model = load_model(model_ref, fake=False, **kwargs) if real else None
    specs = dict(model_input_specs(fake, batch, seq))
    mode = next(iter(fake.parameters())).fake_mode
    with mode:
        fake_inputs = {k: torch.zeros(tuple(s), dtype=d) for k, (s, d) in specs.items()}
    used = {**overrides, "batch": batch, "seq": seq} if overrides or \
        (batch, seq) != (plan.spec.batch, plan.spec.seq) else {}
    return SimulationSetup(plan, fake, real_model, specs, fake_inputs, used, model_ref, kwargs)


def locate_model(plan: Plan, path: Path, allow_outside_root: bool) -> Any:
    """The ``ModelRef`` of the plan's ``spec`` line; a reference that names no file, or a
    file outside the allowed roots, is a ``SpecError`` located at that line."""
    from dataclasses import replace

    from trainverify_dsl.spec.errors import SpecError
    from trainverify_dsl.spec.load import ModelAccess, resolve_ref

    assert plan.spec is not None
    access = ModelAccess(base=path.resolve().parent, allow_outside_root=allow_outside_root)
    try:
        return resolve_ref(plan.spec.model, plan.spec.config, access)
    except SpecError as error:
        span = plan.spec.origin.span
        raise SpecError([replace(d, span=span, notes=d.notes + (
            f"the model reference is `{plan.spec.model}`",)) for d in error.diagnostics]) \
            from None


def _shrunk(plan: Plan, settings: dict[str, Any], model_ref: Any
            ) -> tuple[dict[str, Any], int, int]:
    from trainverify_dsl.shrink import ShrinkError, shrink_plan

    try:
        shrunk = shrink_plan(plan, settings, model_ref)
    except ShrinkError as error:
        assert plan.spec is not None
        raise SimulationSetupError([], f"{plan.spec.origin.span.file}: cannot shrink the "
                                       f"model: {error}; simulate it at full size with "
                                       "--no-shrink") from None
    return shrunk.overrides, shrunk.batch, shrunk.seq


def _plain(value: Any) -> Any:
    from fractions import Fraction

    if isinstance(value, Fraction):
        return int(value) if value.denominator == 1 else float(value)
    return value


# -- the layout pass as diagnostics (tvp lint --spec) ----------------------------------------


def at_spec_line(diagnostics: list[Diagnostic], path: str | Path) -> list[Diagnostic]:
    """Spec diagnostics located at a model reference (``nope.py:X``, no source line) are moved
    to the plan's ``spec`` line, which is what the user edits; those at a line of the
    model's own code stay there."""
    from dataclasses import replace

    try:
        plan = resolve_plan(path)
    except SimulationSetupError:
        return diagnostics
    if plan.spec is None:
        return diagnostics
    return [d if Path(d.span.file).is_file() else
            replace(d, span=plan.spec.origin.span,
                    notes=d.notes + (f"the model reference is `{d.span.file}`",))
            for d in diagnostics]


def layout_diagnostics(path: str | Path, *,
                       allow_model_outside_root: bool = False) -> list[Diagnostic]:
    """Lower the plan at ``path`` (full size, fake tensors) and report its findings. The plan
    must lint clean first (syntax and plan checks); then every problem is a diagnostic.
    ``allow_model_outside_root``: see ``prepare``."""
    return _layout_pass(path, allow_model_outside_root)[0]


def _layout_pass(path: str | Path, allow_model_outside_root: bool
                 ) -> tuple[list[Diagnostic], Lowered | None]:
    """``layout_diagnostics`` and the full-size lowering it made (``None`` if none)."""
    from trainverify_dsl.spec.errors import SpecError

    try:
        setup = prepare(path, shrink=False, real=False,
                        allow_model_outside_root=allow_model_outside_root)
    except SimulationSetupError as error:
        return list(error.diagnostics), None
    except SpecError as error:
        return at_spec_line(list(error.diagnostics), path), None
    plan = setup.plan
    fallback = plan.spec.origin.span if plan.spec else Span(str(path), 1, 1, 1, 1)
    try:
        lowered = lower(plan, setup.fake_model, setup.fake_inputs)
    except LoweringError as error:
        return [to_diagnostic(f, fallback) for f in error.findings], None
    except SpecError as error:
        return at_spec_line(list(error.diagnostics), path), None
    return [to_diagnostic(f, fallback) for f in lowered.findings], lowered


# -- tvp simulate ---------------------------------------------------------------------------


def spec_optimizer(plan: Plan) -> optim.Optimizer | None:
    """The reference step's optimizer: the plan's ``spec-optimizer`` recipe, or ``None``."""
    opt = plan.spec_optimizer
    return None if opt is None else optim.optimizer_config(opt.kind, dict(opt.hyper))


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


#: Called with the name of each phase of a long command as it starts (the CLI shows it on a
#: terminal, ``cli/progress.py``); the drivers never print.
Progress = Callable[[str], None]


def _quiet(phase: str) -> None:
    del phase


def simulate_programs(program: ParallelProgram, reference: Any,
                      reference_opt: Any, model: Any, seed: int = 0,
                      progress: Progress = _quiet) -> SimulationResult:
    """Both programs on the same random values (``seed``), then the named checks."""
    problems = parallel_problems(program)
    if problems:
        raise AssertionError("invalid parallel program: " + "; ".join(problems[:5]))
    rng = np.random.default_rng(seed)
    values = random_inputs(reference.program.inputs, model, rng)
    plan_states(program, values, rng)
    progress("evaluating the reference step")
    want = reference.evaluate(values)
    # the reference IR against eager torch first: a verdict on a wrong reference is no verdict
    progress("checking the reference step against eager torch")
    data = [g.name for g in reference.program.inputs if g.kind == "data"]
    check_reference(want, model, values, data, reference_opt, TOLERANCE, FLOOR)
    progress(f"evaluating the parallel program on {program.world_size:,} ranks and comparing")
    return compare_programs(program, want, values, reference_opt)


def simulate_file(path: str | Path, *, seed: int = 0, shrink: bool | None = None,
                  allow_model_outside_root: bool = False,
                  stop_on_errors: bool = True, max_memory: int | None = None,
                  progress: Progress = _quiet) -> SimulationResult:
    """Raises ``SimulationSetupError`` (with diagnostics when the plan has errors at full
    size, or its estimated memory exceeds ``max_memory`` bytes: TVP501) or ``SpecError``.
    ``shrink``: ``None`` shrinks large models, ``True`` always, ``False`` never
    (``prepare``). ``allow_model_outside_root``: see ``prepare``. ``stop_on_errors=False``
    simulates a plan with full-size errors too (tests measure what a wrong plan computes); its
    ``findings`` then hold the errors. ``max_memory``: the budget in bytes (default: half of
    the machine's memory, ``simulate.budget``). Mesh axes no statement uses run at size 1.
    ``progress`` is told each phase as it starts."""
    progress("layout pass at full size")
    findings, full_size = _layout_pass(path, allow_model_outside_root)
    errors = [d for d in findings if d.severity is Severity.ERROR]
    if errors and stop_on_errors:
        raise SimulationSetupError(findings)
    progress("shrinking the model's widths")
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
    progress("lowering the plan to its parallel program")
    try:
        # at full size and with no idle axis the plan is the one the layout pass lowered
        lowered = full_size if full_size is not None and not shrunk and not idle else \
            lower(setup.plan, setup.fake_model, setup.fake_inputs)
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
    progress("tracing the reference step")
    spec = trace_training_step(setup.fake_model, setup.input_specs, reference_opt, reuse=False,
                               points=reference_points(program))
    budget = default_budget() if max_memory is None else max_memory
    need = estimate(program, [g.type for g in spec.program.inputs], spec.program)
    if need.bytes > budget:
        raise SimulationSetupError([over_budget(setup.plan, need, budget, shrunk)])
    result = simulate_programs(program, spec, reference_opt, setup.build_real(), seed,
                               progress)
    result.sizes = dict(setup.overrides)
    result.idle_axes = idle
    result.estimated_bytes = need.bytes
    result.findings = findings
    return result
