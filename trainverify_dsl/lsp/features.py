"""The editor features as functions of an ``Analysis``: protocol values in, protocol values out
(``lsprotocol`` types), no server state. ``server.py`` wires them to requests.

- ``diagnostics``: ``tvp lint``'s diagnostics (code, severity, message, span) in the editor's
  coordinates. Notes and help follow the message on their own lines (``note: ...``,
  ``help: ...``), related locations become related information. A diagnostic located in
  another file (a syntax error in a ``use``d fragment, say) is shown on the ``use`` line that
  leads to it (the first ``use`` when it is further down the chain), its message prefixed
  with its own location, which is also its related information.
- ``formatting_edits``: ``tvp fmt``'s text as line edits; none for a file with syntax errors.
- ``hover``: a diagnostic code under the cursor (``TVP201`` anywhere, a comment included) or
  the codes of the diagnostics at the cursor: their ``tvp explain`` text; a keyword: its form
  and meaning (``keywords.py``).
- ``definition``: ``apply NAME(...)`` -> the ``template NAME`` line, in whichever file the
  resolver found it; ``use "PATH"`` -> that file.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from lsprotocol import types
from pygls.uris import from_fs_path

from trainverify_dsl.lsp import keywords
from trainverify_dsl.lsp.analysis import Analysis, part_spans, real_path
from trainverify_dsl.lsp.positions import (
    DocumentLines,
    Position,
    split_lines_keeping_ends,
)
from trainverify_dsl.parse import ast, format_source, read_source
from trainverify_dsl.parse.format import same_meaning
from trainverify_dsl.report.codes import lookup
from trainverify_dsl.report.diagnostics import Code, Diagnostic, Severity
from trainverify_dsl.report.render.explain import explain
from trainverify_dsl.report.span import NO_SPAN, Span

SOURCE = "tvp"
SEVERITIES = {
    Severity.ERROR: types.DiagnosticSeverity.Error,
    Severity.WARNING: types.DiagnosticSeverity.Warning,
    Severity.NOTE: types.DiagnosticSeverity.Information,
}
#: A word as hover and definition see it: names, hyphenated keywords, code ids.
WORD = re.compile(r"[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*")
HOVER_SEPARATOR = "\n\n---\n\n"


class FormattingRefused(Exception):
    """``tvp fmt``'s safety check failed: the formatted text would parse to another plan."""


# ---------------------------------------------------------------- diagnostics


def diagnostics(analysis: Analysis, lines: DocumentLines) -> list[types.Diagnostic]:
    files = _OtherFiles(lines.encoding)
    return [_diagnostic(analysis, lines, found, files) for found in analysis.diagnostics]


def _diagnostic(analysis: Analysis, lines: DocumentLines, found: Diagnostic,
                files: _OtherFiles) -> types.Diagnostic:
    span, moved = document_span(analysis, found)
    message = "\n".join([found.message, *(f"note: {n}" for n in found.notes),
                         *([f"help: {found.help}"] if found.help else [])])
    related = [_related(analysis, lines, where, text, files) for where, text in found.related
               if where.file != NO_SPAN.file]
    if moved:
        message = f"{found.span}: {message}"
        related.insert(0, _related(analysis, lines, found.span, "the problem is here", files))
    return types.Diagnostic(range=to_range(lines, span), message=message,
                            severity=SEVERITIES[found.severity], code=found.code.id,
                            source=SOURCE, related_information=related or None)


def document_span(analysis: Analysis, found: Diagnostic) -> tuple[Span, bool]:
    """Where in this document ``found`` is shown, and whether it was moved there from another
    file (then: the ``use`` statement that leads to that file)."""
    span = found.span
    if analysis.is_this_document(span.file):
        return span, False
    if span.file == NO_SPAN.file:
        return Span.point(analysis.path, 1, 1), False
    return _use_leading_to(analysis, span.file), True


def _use_leading_to(analysis: Analysis, file: str) -> Span:
    uses = analysis.uses()
    target = real_path(file)
    for use in uses:
        if analysis.expansion.used_files.get(use.span) == target:
            return use.span
    return uses[0].span if uses else Span.point(analysis.path, 1, 1)


def _related(analysis: Analysis, lines: DocumentLines, span: Span, message: str,
             files: _OtherFiles) -> types.DiagnosticRelatedInformation:
    if analysis.is_this_document(span.file):
        location = types.Location(analysis.uri, to_range(lines, span))
    else:
        location = files.location(span)
    return types.DiagnosticRelatedInformation(location=location, message=message)


class _OtherFiles:
    """Locations in files other than the document, from their text on disk (read once)."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.lines: dict[str, DocumentLines] = {}

    def location(self, span: Span) -> types.Location:
        path = real_path(span.file)
        if path is None:
            return types.Location(span.file, to_range(DocumentLines.of(""), span))
        key = str(path)
        if key not in self.lines:
            text, _ = read_source(path)
            self.lines[key] = DocumentLines.of(text or "", self.encoding)
        return types.Location(from_fs_path(key), to_range(self.lines[key], span))


def to_range(lines: DocumentLines, span: Span) -> types.Range:
    return types.Range(start=_position(lines.to_client(span.line, span.col)),
                       end=_position(lines.to_client(span.end_line, span.end_col)))


def _position(position: Position) -> types.Position:
    return types.Position(line=position.line, character=position.character)


# ---------------------------------------------------------------- formatting


def formatting_edits(analysis: Analysis, lines: DocumentLines) -> list[types.TextEdit]:
    """The edits turning the document into ``tvp fmt``'s text, one per changed run of lines;
    none when it is canonical already or has syntax errors (which its diagnostics show).
    Raises ``FormattingRefused`` when ``tvp fmt`` would refuse the result too."""
    result = format_source(analysis.text, analysis.path)
    if result.text is None or result.text == analysis.text:
        return []
    if not same_meaning(analysis.text, result.text, analysis.path):
        raise FormattingRefused(f"formatting {analysis.path} would change its meaning; left "
                                "unchanged (please report this plan)")
    return line_edits(analysis.text, result.text, lines)


def line_edits(old: str, new: str, lines: DocumentLines) -> list[types.TextEdit]:
    """Edits replacing whole lines of ``old`` (positions in ``lines``, its editor view) so
    that it reads ``new``; in document order, never overlapping."""
    before, after = split_lines_keeping_ends(old), split_lines_keeping_ends(new)
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    return [types.TextEdit(range=types.Range(start=_line_start(lines, before, i1),
                                             end=_line_start(lines, before, i2)),
                           new_text="".join(after[j1:j2]))
            for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


def _line_start(lines: DocumentLines, before: list[str], index: int) -> types.Position:
    """The start of line ``index``; past the last line, the end of the text."""
    if index < len(before):
        return types.Position(line=index, character=0)
    return _position(lines.end())


# ---------------------------------------------------------------- hover


@dataclass(frozen=True, slots=True)
class Word:
    text: str
    line: int  # 1-based, as spans
    col: int  # 1-based first character
    end_col: int  # exclusive
    #: the whole line, as spans count it (no byte-order mark)
    line_text: str


def word_at(lines: DocumentLines, position: Position) -> Word | None:
    """The word under the cursor, or just before it (a cursor at a word's end)."""
    index, char = lines.char_index(position)
    skip = 1 if index == 0 and lines.has_bom else 0
    text = lines.lines[index][skip:]
    for match in WORD.finditer(text):
        if match.start() <= char - skip <= match.end():
            return Word(match.group(), index + 1, match.start() + 1, match.end() + 1, text)
    return None


def hover(analysis: Analysis, lines: DocumentLines, position: Position, *,
          markdown: bool) -> types.Hover | None:
    word = word_at(lines, position)
    sections = _hover_sections(analysis, lines.from_client(position), word, markdown)
    if not sections:
        return None
    kind = types.MarkupKind.Markdown if markdown else types.MarkupKind.PlainText
    text = (HOVER_SEPARATOR if markdown else "\n\n").join(sections)
    word_range = None
    if word is not None:
        word_range = to_range(lines, Span(analysis.path, word.line, word.col, word.line,
                                          word.end_col))
    return types.Hover(contents=types.MarkupContent(kind=kind, value=text), range=word_range)


def _hover_sections(analysis: Analysis, cursor: tuple[int, int], word: Word | None,
                    markdown: bool) -> list[str]:
    """A code under the cursor alone; else the codes of the diagnostics there, then the
    keyword's meaning."""
    code = lookup(word.text) if word is not None else None
    if code is not None:
        return [_explained(explain(code), markdown)]
    sections = [_explained(explain(c), markdown) for c in _codes_at(analysis, *cursor)]
    described = _keyword(analysis, word) if word is not None else None
    if word is not None and described is not None:
        sections.append(_described(word.text, *described, markdown=markdown))
    return sections


def _codes_at(analysis: Analysis, line: int, col: int) -> list[Code]:
    """The distinct codes of the diagnostics whose range in this document holds the cursor
    (its end included, so a cursor just after a short range still finds it)."""
    codes: dict[str, Code] = {}
    for found in analysis.diagnostics:
        span, _ = document_span(analysis, found)
        if (span.line, span.col) <= (line, col) <= (span.end_line, span.end_col):
            codes.setdefault(found.code.id, found.code)
    return list(codes.values())


def _keyword(analysis: Analysis, word: Word) -> tuple[str, str] | None:
    """(form, meaning) when ``word`` is a keyword where it stands: a statement's first word,
    or a word of a statement outside every part the user named (keywords are soft)."""
    stmt = analysis.statement_at(word.line)
    if stmt is None:  # a line that did not parse: its first word may still be a keyword
        first = WORD.search(word.line_text)
        heads = first is not None and first.start() + 1 == word.col
        return keywords.describe(word.text, heads_statement=True) if heads else None
    if (stmt.span.line, stmt.span.col) == (word.line, word.col):
        return keywords.describe(word.text, heads_statement=True)
    if any(_overlaps(span, word) for span in part_spans(stmt)):
        return None
    return keywords.describe(word.text, heads_statement=False)


def _overlaps(span: Span, word: Word) -> bool:
    return ((span.line, span.col) < (word.line, word.end_col)
            and (word.line, word.col) < (span.end_line, span.end_col))


def _explained(text: str, markdown: bool) -> str:
    return f"```text\n{text}```" if markdown else text


def _described(word: str, form: str, meaning: str, *, markdown: bool) -> str:
    if markdown:
        return f"**{word}** `{form}`\n\n{meaning}"
    return f"{form}\n\n{meaning}"


# ---------------------------------------------------------------- definition


def definition(analysis: Analysis, lines: DocumentLines,
               position: Position) -> types.Location | None:
    line, col = lines.from_client(position)
    stmt = analysis.statement_at(line)
    if isinstance(stmt, ast.UseDecl) and _holds(stmt.span, line, col):
        target = analysis.expansion.used_files.get(stmt.span)
        if target is None:
            return None
        start = types.Position(line=0, character=0)
        return types.Location(from_fs_path(str(target)), types.Range(start=start, end=start))
    if isinstance(stmt, ast.ApplyStmt) and _holds(stmt.name.span, line, col):
        return _template_location(analysis, lines, stmt.name.name)
    return None


def _template_location(analysis: Analysis, lines: DocumentLines,
                       name: str) -> types.Location | None:
    template = analysis.expansion.templates.get(name)
    if template is None:
        return None
    span = template.definition.name.span
    if analysis.is_this_document(template.file):
        return types.Location(analysis.uri, to_range(lines, span))
    return _OtherFiles(lines.encoding).location(span)


def _holds(span: Span, line: int, col: int) -> bool:
    return (span.line, span.col) <= (line, col) <= (span.end_line, span.end_col)
