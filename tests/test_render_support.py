"""Hand-made diagnostics for the renderer tests (a test-only code, not in the registry)."""

from __future__ import annotations

from trainverify_dsl.report.diagnostics import Code, Diagnostic, Severity
from trainverify_dsl.report.span import Span

TEST_ERROR = Code("TVP990", "test-error", Severity.ERROR, "a test error", "what it does",
                  "why it is bad", "plan bad\n", "plan good\n")
TEST_WARNING = Code("TVP991", "test-warning", Severity.WARNING, "a test warning", "what",
                    "why", "plan bad\n", "plan good\n")
TEST_NOTE = Code("TVP992", "test-note", Severity.NOTE, "a test note", "what", "why",
                 "plan bad\n", "plan good\n")

SOURCE = "plan demo\nmesh pp=4, dp=4, tp=8\nsplit x [tq, -]\n"
FILE = "plans/demo.tvp"


def sources(files: dict[str, str]):
    return files.get


def error(message: str = "unknown mesh axis 'tq'", *, file: str = FILE, line: int = 3,
          col: int = 10, end_line: int | None = None, end_col: int | None = None,
          **extra) -> Diagnostic:
    span = Span(file, line, col, end_line or line, end_col or col + 2)
    return Diagnostic(TEST_ERROR, message, span, **extra)


def warning(message: str, *, file: str = FILE, line: int = 1, col: int = 1,
            end_col: int = 5) -> Diagnostic:
    return Diagnostic(TEST_WARNING, message, Span(file, line, col, line, end_col))
