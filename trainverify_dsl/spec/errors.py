"""Spec-stage failures as diagnostics: ``SpecError`` carries them to the caller."""

from __future__ import annotations

from pathlib import Path

from trainverify_dsl.report.diagnostics import Code, Diagnostic
from trainverify_dsl.report.span import Span


class SpecError(Exception):
    """Loading or tracing failed; ``diagnostics`` says why (never a bare traceback)."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        super().__init__("; ".join(f"{d.code.id}: {d.message}" for d in diagnostics))
        self.diagnostics = tuple(diagnostics)


def spec_span(where: str) -> Span:
    """A span naming the model file or reference (no line is known)."""
    return Span(where or "<model>", 1, 1, 1, 1)


#: Codes about what a ``spec`` line names rather than a line of the model's code.
REFERENCE_CODES = frozenset({"TVP301", "TVP302", "TVP303", "TVP307", "TVP310", "TVP312"})


def names_the_reference(diagnostic: Diagnostic) -> bool:
    """Whether ``diagnostic`` is about the model reference itself (no line of the model's
    code: a missing file, class or config, an import or constructor that failed, bad input
    sizes, a refused location): a plan's diagnostics put it at the ``spec`` line."""
    span = diagnostic.span
    if not Path(span.file).is_file():
        return True
    return diagnostic.code.id in REFERENCE_CODES and span == spec_span(span.file)


def fail(code: Code, message: str, where: str = "", notes: tuple[str, ...] = (),
         help: str | None = None) -> SpecError:
    return SpecError([Diagnostic(code, message, spec_span(where), notes, help)])


def fail_at(code: Code, message: str, span: Span, notes: tuple[str, ...] = (),
            help: str | None = None) -> SpecError:
    """``fail`` at a known source location (a line of the model's code)."""
    return SpecError([Diagnostic(code, message, span, notes, help)])


#: where torch's C++ errors start their backtrace (not for a diagnostic's message)
_CPP_TRACE = ("\nException raised from ", "\nframe #0: ")


def error_text(error: BaseException) -> str:
    """``"TypeError: message"`` for an exception of user code or torch, without the C++
    backtrace torch appends to some of its errors."""
    text = str(error)
    for marker in _CPP_TRACE:
        text = text.split(marker, 1)[0]
    return f"{type(error).__name__}: {text.rstrip()}"
