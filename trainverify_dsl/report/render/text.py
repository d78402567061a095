"""Human-readable text, in the mypy/ruff style.

One block per diagnostic, then one summary line::

    plans/a.tvp:3:10: error: unknown mesh axis 'tq' [TVP203]
        split x [tq, -]
                 ^~
        note: the mesh declares pp, dp, tp
        help: did you mean 'tp'?
    plans/a.tvp:2:1: note: mesh declared here
        mesh pp=4, dp=4, tp=8
        ^~~~~~~~~~~~~~~~~~~~~
    1 error, 0 warnings in 1 file (3 files checked)

The header names the code by id only (``[TVP203]``); ``tvp explain TVP203`` gives its name
and explanation. Columns are 1-based characters. The excerpt expands tabs to ``TAB_WIDTH``
columns and counts East Asian wide characters as two, so the marker stays under the span; a
span running past the end of its line is clipped to one column after the last character; a
multi-line span is marked to the end of its first line and says where it ends. A line longer
than ``MAX_EXCERPT`` characters is cut to a window of that many around the span's start, with
`` …`` where text was left out, so a huge line is never echoed whole. Without the source
(missing file, line out of range, blank line), or for a code that is about the whole file and
must not quote it (``Code.quotes_source`` false, e.g. TVP110 not-a-plan), the excerpt is left
out. Related locations follow as ``note:`` blocks. A clean run prints ``no issues found in N
files``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator

from trainverify_dsl.report.diagnostics import Diagnostic, Severity
from trainverify_dsl.report.render import (
    LintReport,
    SourceLookup,
    summarize,
    summary_line,
)
from trainverify_dsl.report.span import Span

TAB_WIDTH = 4
INDENT = "    "
#: Most characters of a source line an excerpt shows, and how many of them come before the
#: span's start when the line has to be cut.
MAX_EXCERPT = 200
EXCERPT_LEAD = 60
CUT = "…"

# ANSI SGR sequences; used only when the caller asks for colour. Stripped of them, coloured
# text is the plain text, character for character (the tests check it).
_RESET = "\x1b[0m"
_STYLES = {
    "location": "\x1b[1m",
    "error": "\x1b[1;31m",
    "warning": "\x1b[1;33m",
    "note": "\x1b[1;36m",
    "help": "\x1b[1;32m",
    "code": "\x1b[2m",
    "clean": "\x1b[1;32m",
    # verdicts of tvp check and tvp simulate: held, failed, undecided
    "good": "\x1b[1;32m",
    "bad": "\x1b[1;31m",
    "doubt": "\x1b[1;33m",
}


class Painter:
    """``paint(text, style)``: ``text`` in one of the styles above when colour is on, else
    ``text`` itself."""

    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, style: str) -> str:
        if not self.color or not text:
            return text
        return f"{_STYLES[style]}{text}{_RESET}"


def render_text(report: LintReport, sources: SourceLookup, *, color: bool = False) -> str:
    """Every diagnostic of ``report`` as a block, then the summary line (ends with a newline)."""
    paint = Painter(color)
    lines: list[str] = []
    for diagnostic in report.diagnostics:
        lines.extend(diagnostic_lines(diagnostic, sources, paint))
    summary = summarize(report)
    style = "error" if summary.errors else ("warning" if not summary.clean else "clean")
    lines.append(paint(summary_line(summary), style))
    return "\n".join(lines) + "\n"


def render_diagnostic(diagnostic: Diagnostic, sources: SourceLookup, *,
                      color: bool = False) -> str:
    """One diagnostic block without a summary (for tools printing diagnostics one by one)."""
    return "\n".join(diagnostic_lines(diagnostic, sources, Painter(color))) + "\n"


def diagnostic_lines(diagnostic: Diagnostic, sources: SourceLookup,
                     paint: Painter) -> list[str]:
    severity = diagnostic.severity
    code = code_tag(diagnostic.code.id, paint)
    lines = [_header(diagnostic.span, severity.value, f"{diagnostic.message} {code}", paint)]
    if diagnostic.code.quotes_source:
        lines.extend(excerpt(diagnostic.span, sources, paint, severity.value))
    for note in diagnostic.notes:
        lines.extend(_labelled("note", note, paint))
    if diagnostic.help:
        lines.extend(_labelled("help", diagnostic.help, paint))
    for span, message in diagnostic.related:
        lines.append(_header(span, Severity.NOTE.value, message, paint))
        lines.extend(excerpt(span, sources, paint, Severity.NOTE.value))
    return lines


def _header(span: Span, label: str, message: str, paint: Painter) -> str:
    return headline(f"{span.file}:{span.line}:{span.col}", label, message, paint)


def headline(where: str, label: str, message: str, paint: Painter) -> str:
    """``where: label: message``, a diagnostic's first line: the location bold, the label
    (``error``, ``warning``, ``note``) in its colour. Other commands' text output uses it too."""
    return f"{paint(where + ':', 'location')} {paint(label + ':', label)} {message}"


def code_tag(code_id: str, paint: Painter) -> str:
    """``[TVP203]``, dimmed."""
    return paint(f"[{code_id}]", "code")


def _labelled(label: str, text: str, paint: Painter) -> list[str]:
    first, *rest = text.split("\n")
    continuation = INDENT + " " * (len(label) + 2)
    return [f"{INDENT}{paint(label + ':', label)} {first}"] + [continuation + r for r in rest]


def excerpt(span: Span, sources: SourceLookup, paint: Painter, style: str) -> list[str]:
    """The source line of ``span`` and a ``^~~~`` marker under it; ``[]`` without source."""
    source_line = _source_line(sources(span.file), span.line)
    if source_line is None or not source_line.strip():
        return []
    start, end = _marked_range(span, source_line)
    source_line, start, end = _window(source_line, start, end)
    shown = _display(source_line)
    offset = _width(source_line[:start])
    width = max(1, _width(source_line[:end]) - offset)  # tabs depend on the absolute column
    marker = "^" + "~" * (width - 1)
    if span.end_line > span.line:
        marker += f" (span ends at line {span.end_line})"
    return [INDENT + shown.rstrip(), INDENT + " " * offset + paint(marker, style)]


def _source_line(text: str | None, line: int) -> str | None:
    if text is None or line < 1:
        return None
    lines = text.split("\n")
    if line > len(lines):
        return None
    return lines[line - 1].rstrip("\r")


def _marked_range(span: Span, source_line: str) -> tuple[int, int]:
    """0-based [start, end) character range of ``span`` on its first line, clipped to it."""
    length = len(source_line)
    start = min(max(span.col, 1) - 1, length)
    end = length if span.end_line > span.line else min(span.end_col - 1, length)
    return start, max(end, start + 1)


def _window(line: str, start: int, end: int) -> tuple[str, int, int]:
    """At most ``MAX_EXCERPT`` characters of ``line`` around ``start``, marked with ``CUT``
    where text was left out, and [start, end) moved into the window (end clipped to it)."""
    if len(line) <= MAX_EXCERPT:
        return line, start, end
    first = 0 if start < MAX_EXCERPT - EXCERPT_LEAD else start - EXCERPT_LEAD
    last = min(first + MAX_EXCERPT, len(line))
    prefix = CUT + " " if first else ""
    suffix = " " + CUT if last < len(line) else ""
    shift = len(prefix) - first
    window_end = min(end, last) + shift
    return prefix + line[first:last] + suffix, start + shift, max(window_end, start + shift + 1)


def _display(text: str) -> str:
    """``text`` as printed: tabs expanded, control characters as spaces."""
    return "".join(_display_char(ch, column) for column, ch in _columns(text))


def _width(text: str) -> int:
    """Display width of ``text`` when it starts at column 0 of the excerpt."""
    return sum(_char_width(ch, column) for column, ch in _columns(text))


def _columns(text: str) -> Iterator[tuple[int, str]]:
    """Yields (display column before the char, char) pairs."""
    column = 0
    for ch in text:
        yield column, ch
        column += _char_width(ch, column)


def _char_width(ch: str, column: int) -> int:
    if ch == "\t":
        return TAB_WIDTH - column % TAB_WIDTH
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def _display_char(ch: str, column: int) -> str:
    if ch == "\t":
        return " " * _char_width(ch, column)
    if unicodedata.category(ch) == "Cc":
        return " "
    return ch
