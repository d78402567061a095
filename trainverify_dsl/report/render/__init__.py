"""Renderers: diagnostics in, text out. Collection happens elsewhere.

Every renderer is a pure function of a ``LintReport`` (the diagnostics, the files that were
checked and the files the linter crashed on) and a ``SourceLookup`` (file path -> its text,
or ``None`` when it cannot be read). Nothing here reads files, the terminal or the
environment; ``FileSources`` is the disk-backed lookup the CLI passes in.

Formats (``FORMATS``), each documented in its module:

    text    ``report.render.text``         human-readable, mypy/ruff style, optional colour
    json    ``report.render.json_format``  stable schema, version ``JSON_SCHEMA_VERSION``
    sarif   ``report.render.sarif``        SARIF 2.1.0 for code-scanning tools
    github  ``report.render.github``       GitHub Actions workflow commands
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from trainverify_dsl.report.diagnostics import Diagnostic, Severity

#: Maps a file path (as it appears in ``Span.file``) to its text, or ``None`` if unreadable.
SourceLookup = Callable[[str], str | None]

FORMATS: tuple[str, ...] = ("text", "json", "sarif", "github")


@dataclass(frozen=True, slots=True)
class InternalError:
    """A file the linter crashed on. Nothing said about it can be trusted, so every format
    reports it as a failure (an error in the counts), never as a clean file."""

    file: str
    #: ``RuntimeError: what went wrong`` (the exception's class, then its text)
    message: str


@dataclass(frozen=True, slots=True)
class LintReport:
    """What a lint run found: its diagnostics, every file it checked (clean ones too) and the
    files it crashed on (also among ``files``)."""

    diagnostics: tuple[Diagnostic, ...]
    files: tuple[str, ...]
    internal_errors: tuple[InternalError, ...] = ()

    @staticmethod
    def of(diagnostics: Iterable[Diagnostic], files: Iterable[str],
           internal_errors: Iterable[InternalError] = ()) -> LintReport:
        return LintReport(tuple(sort_diagnostics(diagnostics)), tuple(files),
                          tuple(internal_errors))


@dataclass(frozen=True, slots=True)
class Summary:
    #: error diagnostics plus internal errors (a crash is never a clean run)
    errors: int
    warnings: int
    notes: int
    #: files with a diagnostic or an internal error
    files_with_findings: int
    files_checked: int
    #: how many of ``errors`` are internal errors (files the linter crashed on)
    internal_errors: int = 0

    @property
    def clean(self) -> bool:
        return self.errors == 0 and self.warnings == 0 and self.notes == 0


def sort_diagnostics(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Stable reading order: file, line, column, code id."""
    return sorted(diagnostics, key=lambda d: (d.span.file, d.span.line, d.span.col, d.code.id))


def summarize(report: LintReport) -> Summary:
    def count(severity: Severity) -> int:
        return sum(1 for d in report.diagnostics if d.severity is severity)

    crashed = len(report.internal_errors)
    files_with = {d.span.file for d in report.diagnostics}
    files_with |= {failure.file for failure in report.internal_errors}
    files_checked = len(set(report.files) | files_with)
    return Summary(count(Severity.ERROR) + crashed, count(Severity.WARNING),
                   count(Severity.NOTE), len(files_with), files_checked, crashed)


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def summary_line(summary: Summary) -> str:
    """``2 errors, 1 warning in 1 file (3 files checked)`` or ``no issues found in 3 files``;
    internal errors are counted among the errors and named: ``1 error (1 internal error), 0
    warnings in 1 file (1 file checked)``."""
    if summary.clean:
        return f"no issues found in {plural(summary.files_checked, 'file')}"
    errors = plural(summary.errors, "error")
    if summary.internal_errors:
        errors += f" ({plural(summary.internal_errors, 'internal error')})"
    parts = [errors, plural(summary.warnings, "warning")]
    if summary.notes:
        parts.append(plural(summary.notes, "note"))
    found = ", ".join(parts)
    where = plural(summary.files_with_findings, "file")
    return f"{found} in {where} ({plural(summary.files_checked, 'file')} checked)"


class FileSources:
    """A ``SourceLookup`` reading files from disk once each (UTF-8, bad bytes replaced)."""

    def __init__(self) -> None:
        self._cache: dict[str, str | None] = {}

    def __call__(self, file: str) -> str | None:
        if file not in self._cache:
            self._cache[file] = _read_text(file)
        return self._cache[file]


def _read_text(file: str) -> str | None:
    """The file's text; ``None`` for anything but a regular file (reading a FIFO or a device
    such as /dev/zero could block or never end)."""
    try:
        if not Path(file).is_file():
            return None
        return Path(file).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def no_sources(file: str) -> str | None:
    """A lookup that knows no file: renderers then omit source excerpts."""
    return None


def render(fmt: str, report: LintReport, sources: SourceLookup, *, color: bool = False,
           root: str | None = None) -> str:
    """Render ``report`` in format ``fmt`` (one of ``FORMATS``).

    ``color`` applies to ``text`` only; ``root`` (a directory) makes SARIF URIs and GitHub
    file names relative.
    """
    if fmt == "text":
        from trainverify_dsl.report.render.text import render_text

        return render_text(report, sources, color=color)
    if fmt == "json":
        from trainverify_dsl.report.render.json_format import render_json

        return render_json(report)
    if fmt == "sarif":
        from trainverify_dsl.report.render.sarif import render_sarif

        return render_sarif(report, root=root, sources=sources)
    if fmt == "github":
        from trainverify_dsl.report.render.github import render_github

        return render_github(report, root=root)
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
