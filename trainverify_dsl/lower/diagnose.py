"""The layout pass as diagnostics: lower a plan against its spec model and report what the
binding and layout propagation find (TVP4xx), the model's own problems (TVP3xx), or nothing.

Used by ``tvp lint --spec`` and ``tvp simulate``. It imports torch; ``tvp lint`` without
``--spec`` never calls it.
"""

from __future__ import annotations

from pathlib import Path

from trainverify_dsl.lower.findings import Finding, LoweringError
from trainverify_dsl.report.codes import lookup
from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.span import Span


def to_diagnostic(finding: Finding, fallback: Span) -> Diagnostic:
    code = lookup(finding.code)
    assert code is not None, f"finding code {finding.code!r} is not registered"
    notes = (f"in the spec model at `{finding.where}`",) if finding.where else ()
    return Diagnostic(code, finding.message, finding.span or fallback,
                      finding.notes + notes, finding.help)


def at_spec_line(diagnostics: list[Diagnostic], path: str | Path) -> list[Diagnostic]:
    """Spec diagnostics located at a model reference (``nope.py:X``, no source line) are moved
    to the plan's ``spec`` line, which is what the user edits; those at a line of the
    model's own code stay there."""
    from dataclasses import replace

    from trainverify_dsl.simulate.setup import SimulationSetupError, resolve_plan

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
    ``allow_model_outside_root``: see ``simulate.setup.prepare``."""
    from trainverify_dsl.lower.lowering import lower
    from trainverify_dsl.simulate.setup import SimulationSetupError, prepare
    from trainverify_dsl.spec.errors import SpecError

    try:
        setup = prepare(path, shrink=False, real=False,
                        allow_model_outside_root=allow_model_outside_root)
    except SimulationSetupError as error:
        return list(error.diagnostics)
    except SpecError as error:
        return at_spec_line(list(error.diagnostics), path)
    plan = setup.plan
    fallback = plan.spec.origin.span if plan.spec else Span(str(path), 1, 1, 1, 1)
    try:
        lowered = lower(plan, setup.fake_model, setup.fake_inputs)
    except LoweringError as error:
        return [to_diagnostic(f, fallback) for f in error.findings]
    except SpecError as error:
        return at_spec_line(list(error.diagnostics), path)
    return [to_diagnostic(f, fallback) for f in lowered.findings]
