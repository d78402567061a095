"""What the lowering and its layout pass find, before they become diagnostics.

A ``Finding`` has a registered code (``codes_lower.PARTIAL_NONLINEAR``, ...: typed like the
plan's, so a misspelt code fails at import, not when the finding fires), a message, the plan
span it is about (the statement that caused it, when known) and where in the spec model it
shows (module path).
Given a plan ``Origin`` instead of a span, a finding is located where the user wrote the
statement (the outermost ``apply`` line for a template statement) and carries the expansion
chain as notes, as compilers report macro expansions.
``LoweringError`` stops the lowering: the plan has no local program (names that do not
bind, operands split incompatibly, a stage order against the data flow).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainverify_dsl.report.diagnostics import Code
from trainverify_dsl.report.span import Span


@dataclass(frozen=True, slots=True)
class Finding:
    #: a registered code (``report/codes_lower.py``, or a plan code the binding also finds)
    code: Code
    message: str
    #: a ``Span``, or a plan ``Origin`` (anything with ``report_span`` and ``notes()``),
    #: which is replaced by its report span, its trail going to ``notes``
    span: Span | None
    where: str
    help: str | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        origin = self.span
        if origin is not None and not isinstance(origin, Span):
            object.__setattr__(self, "span", origin.report_span)
            object.__setattr__(self, "notes", tuple(origin.notes()) + self.notes)


class LoweringError(Exception):
    def __init__(self, *findings: Finding) -> None:
        super().__init__("; ".join(f.message for f in findings))
        self.findings = findings
        #: the plan's binding when it was made before the error (``lower.bind.Binding``):
        #: which inputs the plan splits, for the checks of the model that need it
        self.binding: object | None = None


def merge_repeats(findings: list[Finding]) -> list[Finding]:
    """One finding per code and plan location: a wrong statement reaches many ops (a partial
    sum flows through a whole layer, a ``for`` loop repeats it per layer), and the user fixes
    it once. The first is kept, in order; the others become a note naming where they show."""
    groups: dict[tuple[str, object], list[Finding]] = {}
    for finding in findings:
        key = (finding.code, finding.span) if finding.span is not None else \
            (finding.code, finding.message)  # unlocated: only exact repeats merge
        groups.setdefault(key, []).append(finding)
    merged = []
    for first, *rest in groups.values():
        places = list(dict.fromkeys(f.where for f in rest if f.where and f.where != first.where))
        if rest:
            shown = ", ".join(f"`{p}`" for p in places[:4])
            more = f" and {len(places) - 4} more" if len(places) > 4 else ""
            where = f" (also in {shown}{more})" if places else ""
            note = f"{len(rest)} more finding{'s' * (len(rest) > 1)} of this kind trace back " \
                f"to this statement{where}"
            first = Finding(first.code, first.message, first.span, first.where, first.help,
                            first.notes + (note,))
        merged.append(first)
    return merged


def latest(entries: Iterable[tuple[tuple[int, int], Any]]) -> Any:
    """The plan origin of the most recent ``((order, kind), origin)`` cause entry (the
    lowering's per-axis causes), or None."""
    found = list(entries)
    return max(found, key=lambda e: e[0])[1] if found else None
