"""Diagnostics as data.

Detection is separate from message building and from rendering: passes create
``Diagnostic`` values (a registered ``Code``, a message, a span, notes, help), a ``Collector``
gathers them, and ``trainverify_dsl.report.render`` turns them into text/JSON/SARIF/GitHub.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from trainverify_dsl.report.span import Span


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True, slots=True)
class Code:
    """A stable diagnostic code: id (``TVP101``) plus kebab-case name (``unexpected-token``).

    ``summary`` is one line for tables; ``what``/``why``/``example``/``fix`` feed
    ``tvp explain``. ``example`` and ``fix`` are ``.tvp`` snippets: ``example`` must produce
    this code and ``fix`` must not (the test-suite checks both). ``quotes_source`` is false
    for codes about a whole file that may not be a plan at all: renderers never show its text.
    """

    id: str
    name: str
    severity: Severity
    summary: str
    what: str
    why: str
    example: str
    fix: str
    quotes_source: bool = True


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: Code
    message: str
    span: Span
    notes: tuple[str, ...] = ()
    help: str | None = None
    #: Secondary locations, e.g. the earlier conflicting declaration.
    related: tuple[tuple[Span, str], ...] = ()
    #: The severity where a command reads the code otherwise than its default (``tvp check``
    #: reports a plan refused for its work, TVP501, as a warning: not checked, not wrong).
    level: Severity | None = None

    @property
    def severity(self) -> Severity:
        return self.level or self.code.severity


@dataclass(slots=True)
class Collector:
    """Accumulates diagnostics so one run reports every problem, not only the first."""

    items: list[Diagnostic] = field(default_factory=list)

    def add(self, diagnostic: Diagnostic) -> None:
        self.items.append(diagnostic)

    def emit(self, code: Code, message: str, span: Span, *, notes: Iterable[str] = (),
             help: str | None = None,
             related: Iterable[tuple[Span, str]] = ()) -> None:
        self.add(Diagnostic(code, message, span, tuple(notes), help, tuple(related)))

    def extend(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.items.extend(diagnostics)

    @property
    def has_errors(self) -> bool:
        return any(d.severity is Severity.ERROR for d in self.items)

    def sorted(self) -> list[Diagnostic]:
        return sorted(self.items, key=lambda d: (d.span.file, d.span.line, d.span.col, d.code.id))
