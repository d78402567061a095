"""GitHub Actions workflow commands: one annotation per diagnostic.

::

    ::error file=plans/a.tvp,line=3,col=10,endLine=3,endColumn=11,title=TVP203 (unknown-axis)::\
    unknown mesh axis 'tq'%0Ahelp: did you mean 'tp'?

(one line; wrapped here).
Severity maps to ``error``/``warning``/``notice``. ``col``/``endColumn`` are 1-based and
both inclusive (GitHub's annotation convention) and are given only for single-line spans,
because GitHub ignores columns on multi-line annotations. Data (the message, with notes and
help on following lines) escapes ``%``, ``\\r``, ``\\n``; property values also escape ``:``
and ``,``. Absolute paths under ``root`` (the workspace) are made relative to it. Related
locations become ``notice`` annotations. A file the linter crashed on gets a file-level
``::error file=...,title=tvp internal error::internal error while linting ...`` (no line: the
crash belongs to no statement). No summary line here: the CLI prints it on stderr so that
stdout holds only workflow commands.
"""

from __future__ import annotations

from pathlib import PurePath

from trainverify_dsl.report.diagnostics import Diagnostic, Severity
from trainverify_dsl.report.render import InternalError, LintReport
from trainverify_dsl.report.span import Span

_COMMANDS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "notice"}


def render_github(report: LintReport, *, root: str | None = None) -> str:
    """``root``: absolute paths under it are printed relative to it (the workspace)."""
    lines: list[str] = []
    for diagnostic in report.diagnostics:
        lines.extend(diagnostic_commands(diagnostic, root))
    lines += [internal_error_command(failure, root) for failure in report.internal_errors]
    return "".join(line + "\n" for line in lines)


def internal_error_command(failure: InternalError, root: str | None = None) -> str:
    """A file-level ``::error`` for a file the linter crashed on."""
    properties = [("file", workspace_path(failure.file, root)), ("title", "tvp internal error")]
    joined = ",".join(f"{key}={escape_property(value)}" for key, value in properties)
    text = f"internal error while linting {failure.file}: {failure.message}"
    return f"::error {joined}::{escape_data(text)}"


def diagnostic_commands(diagnostic: Diagnostic, root: str | None = None) -> list[str]:
    title = f"{diagnostic.code.id} ({diagnostic.code.name})"
    text = "\n".join([diagnostic.message, *(f"note: {n}" for n in diagnostic.notes),
                      *([f"help: {diagnostic.help}"] if diagnostic.help else [])])
    commands = [command(_COMMANDS[diagnostic.severity], diagnostic.span, title, text, root)]
    for span, message in diagnostic.related:
        commands.append(command("notice", span, f"{diagnostic.code.id} related", message,
                                root))
    return commands


def workspace_path(file: str, root: str | None) -> str:
    path = PurePath(file)
    if root is not None and path.is_absolute() and path.is_relative_to(root):
        return path.relative_to(root).as_posix()
    return path.as_posix()


def command(name: str, span: Span, title: str, text: str, root: str | None = None) -> str:
    properties = [("file", workspace_path(span.file, root)), ("line", str(span.line))]
    if span.end_line > span.line:
        properties.append(("endLine", str(span.end_line)))
    else:
        properties += [("col", str(span.col)), ("endLine", str(span.end_line)),
                       ("endColumn", str(max(span.end_col - 1, span.col)))]
    properties.append(("title", title))
    joined = ",".join(f"{key}={escape_property(value)}" for key, value in properties)
    return f"::{name} {joined}::{escape_data(text)}"


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")
