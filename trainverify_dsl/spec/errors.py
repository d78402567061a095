"""Spec-stage failures as diagnostics: ``SpecError`` carries them to the caller."""

from __future__ import annotations

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


def fail(code: Code, message: str, where: str = "", notes: tuple[str, ...] = (),
         help: str | None = None) -> SpecError:
    return SpecError([Diagnostic(code, message, spec_span(where), notes, help)])


def fail_at(code: Code, message: str, span: Span, notes: tuple[str, ...] = (),
            help: str | None = None) -> SpecError:
    """``fail`` at a known source location (a line of the model's code)."""
    return SpecError([Diagnostic(code, message, span, notes, help)])
