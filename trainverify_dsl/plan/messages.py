"""Message builders: detection code hands over plain data, these build the ``Diagnostic``.

Messages follow the shard_map template: a headline naming the construct; context (mesh shape
and axis names); one note per offender with sizes; a help sentence; "did you mean" for slips.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from trainverify_dsl.plan.model import Mesh, Origin
from trainverify_dsl.report import codes_plan as codes
from trainverify_dsl.report.diagnostics import Code, Diagnostic
from trainverify_dsl.report.span import Span


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """``did you mean 'tp'?`` for the closest candidate, or ``None``."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.5)
    return f"did you mean '{close[0]}'?" if close else None


def at(code: Code, message: str, origin: Origin, *, notes: Sequence[str] = (),
       help: str | None = None, related: Sequence[tuple[Span, str]] = ()) -> Diagnostic:
    """A diagnostic reported at ``origin`` (relocated to the user's apply site), with the
    expansion trail appended to the notes."""
    return Diagnostic(code, message, origin.report_span, tuple(notes) + origin.notes(), help,
                      tuple(related))


def unknown_name(code: Code, what: str, name: str, known: Sequence[str], origin: Origin,
                 *, context: str | None = None) -> Diagnostic:
    """``unknown mesh axis 'tq'; did you mean 'tp'?`` + the names that would be accepted.
    ``what`` is any noun phrase (``reduce op of all-reduce``): it is never inflected."""
    hint = did_you_mean(name, known)
    notes = [context] if context else []
    notes.append("expected one of: " + ", ".join(f"'{k}'" for k in known) if known
                 else f"no {what} is defined here")
    message = f"unknown {what} '{name}'" + (f"; {hint}" if hint else "")
    return at(code, message, origin, notes=notes,
              help=f"replace '{name}' with one of the expected names" if known else None)


def unknown_axis(name: str, mesh: Mesh | None, origin: Origin, construct: str) -> Diagnostic:
    known = mesh.names if mesh is not None else ()
    context = f"{construct} on {mesh.describe()}" if mesh is not None else construct
    return unknown_name(codes.UNKNOWN_MESH_AXIS, "mesh axis", name, known, origin,
                        context=context)


def conflict(code: Code, headline: str, first: Origin, second: Origin, notes: Sequence[str],
             help: str) -> Diagnostic:
    """Two statements disagree: reported at the second, the first as a related span."""
    return at(code, headline, second, notes=[*notes, f"first stated at {first.report_span}"],
              help=help, related=[(first.report_span, "first stated here")])


def not_divisible_note(dim: int, size: int, axes: Sequence[tuple[str, int]],
                       microbatches: int | None, zigzag: bool = False) -> str:
    """``splits dimension 0 (of size 10) over mesh axis 'tp' (of size 4), but 4 does not
    evenly divide 10``; in zigzag order the dimension is cut into two chunks per block."""
    parts = [f"mesh axis '{name}' (of size {n})" for name, n in axes]
    divisor = 1
    for _, n in axes:
        divisor *= n
    if microbatches is not None:
        parts.append(f"{microbatches} microbatches")
        divisor *= microbatches
    if zigzag:
        return (f"splits dimension {dim} (of size {size}) over {' and '.join(parts)} in zigzag "
                f"order, which cuts it into 2 x {divisor} = {2 * divisor} chunks, but "
                f"{2 * divisor} does not evenly divide {size}")
    return (f"splits dimension {dim} (of size {size}) over {' and '.join(parts)}, "
            f"but {divisor} does not evenly divide {size}")


def expected_kind(param: str, expected: str, got: str, origin: Origin, *,
                  loop_variable: bool = False) -> Diagnostic:
    if loop_variable:
        return at(codes.TEMPLATE_ARGUMENT_KIND,
                  f"loop variable '{param}' is used as {expected} but is bound to {got}",
                  origin, help=f"rename the loop variable '{param}': it hides {expected}")
    return at(codes.TEMPLATE_ARGUMENT_KIND,
              f"template parameter '{param}' is used as {expected} but is bound to {got}",
              origin, help=f"pass {expected} for '{param}'")
