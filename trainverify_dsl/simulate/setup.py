"""Everything a simulation needs from a plan file: the resolved plan, the spec model (fake for
tracing and lowering, real for its buffers) and the input shapes — shrunk when the plan's
model is too large to run (``simulate.shrink``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainverify_dsl.plan.model import Plan
from trainverify_dsl.report.diagnostics import Diagnostic


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
    from trainverify_dsl.report.diagnostics import Severity

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
    from trainverify_dsl.simulate.shrink import NOT_CONFIG, needs_shrinking
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
    from trainverify_dsl.simulate.shrink import ShrinkError, shrink_plan

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
