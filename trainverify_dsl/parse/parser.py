"""``parse_source`` / ``parse_file``: `.tvp` text -> ``ParseResult`` (AST + diagnostics).

Never raises on any input text. Strategy:

1. If the file repeats itself (most statement groups, see 3, have the shape of an earlier
   one: the same text but for the digits), parse it group by group, each distinct shape
   through Lark once and its builder calls replayed for the other groups of that shape
   (``parse.shapes``): a valid file's AST, in half the time. Any error: forget it, and
2. parse the whole file at once (a valid file parses, and gives the same AST: the groups are
   a partition of the file at statement boundaries, chunks as below);
3. on any error, split the file into top-level statement groups (a line starting at
   column 0 plus the indented lines and blank/comment lines that follow it) and parse each
   group on its own. When a group fails, the offending statement's lines (the error line and
   any lines indented deeper than it) are blanked - replaced by spaces, so every position
   stays exact - and the group is parsed again, until it parses or nothing is left. So one
   run reports every syntax error and ``plan_file`` keeps every statement that parsed.

Between 2 and 3, a file that fails to parse and does not look like a plan (fewer than half
of its lines start with a statement keyword or a near miss of one: ``looks_like_a_plan``)
is not recovered: it gets one TVP110 diagnostic at 1:1 that quotes none of it, and an empty
``plan_file``. It may be anything (a `.env` file reached through ``use`` or a symlink, a
20 MB log line), and one diagnostic per line would copy it into the output.
"""

from __future__ import annotations

import difflib
import errno
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from lark.exceptions import LarkError

from trainverify_dsl.parse import ast, shapes
from trainverify_dsl.parse.build import AstBuilder, BuildError
from trainverify_dsl.parse.errors import STATEMENT_KEYWORDS, SyntaxProblem, diagnose
from trainverify_dsl.parse.grammar import get_parser_and_builder
from trainverify_dsl.report import codes_syntax as codes
from trainverify_dsl.report.diagnostics import Diagnostic, Severity
from trainverify_dsl.report.span import Span

#: Reparse attempts per top-level statement group before giving up on the group.
MAX_ATTEMPTS_PER_GROUP = 50
#: Statement shapes pay off when at most this share of a file's statement groups have a shape
#: of their own: Lark parsing a group alone costs about 2.5 times its share of a whole-file
#: parse, a replay about 0.4 times (``bench/lint_bench.py``, ``tests/test_parse_shapes.py``).
MAX_DISTINCT_SHAPES = 0.25

#: Parses share one parser and builder (see ``grammar.get_parser_and_builder``).
_PARSE_LOCK = threading.RLock()
_BLANK = re.compile(r"[^\r]")
#: What ``_indent`` counts as indentation (the empty string: an empty line).
_INDENT_CHARS = ("", " ", "\t", "\f")
_BLOCK_HEADER = re.compile(r"[ \t\f]*(for|template)(?![\w-])")
#: The first word of a (stripped) line when a statement could start with it: a word of at
#: most 40 characters followed by a blank or the end of the line (so `plan=x` is no statement).
_FIRST_WORD = re.compile(r"([A-Za-z][\w-]{0,39})(?:[ \t\f]|$)")
#: How close a first word must be to a keyword to count as a misspelt one (`allreduce`).
KEYWORD_NEAR_MISS = 0.8


@dataclass(frozen=True, slots=True)
class ParseResult:
    """The AST (``None`` only when the file could not be read at all) and the diagnostics.
    With syntax errors, ``plan_file`` still holds every statement that parsed."""

    plan_file: ast.PlanFile | None
    diagnostics: tuple[Diagnostic, ...]

    @property
    def ok(self) -> bool:
        return not any(d.severity is Severity.ERROR for d in self.diagnostics)


#: A UTF-8 byte-order mark, as some Windows editors write at the start of a file.
BOM = "\ufeff"


def parse_source(text: str, file: str = "<string>") -> ParseResult:
    """Parse `.tvp` text. ``file`` is used in every span. The text is read as Python reads
    text files: a leading byte-order mark is dropped (editors do not show it) and CRLF or a
    lone CR ends a line like LF, so lines and columns agree with editors, ``tvp fmt`` and the
    renderers; offsets count in that normalised text."""
    text = text.removeprefix(BOM).replace("\r\n", "\n").replace("\r", "\n")
    source = text if text.endswith("\n") else text + "\n"
    diagnostics: list[Diagnostic] = []
    with _PARSE_LOCK:
        statements = _parse_by_shapes(source, file)
        if statements is None:
            statements = _parse_whole(source, file)
        if statements is None and not looks_like_a_plan(source):
            empty = ast.PlanFile(file, (), (), _file_span(text, file))
            return ParseResult(empty, (_not_a_plan_diagnostic(source, file),))
        if statements is None:
            statements = _parse_by_groups(source, file, diagnostics)
    plan_file = ast.PlanFile(file, statements, collect_comments(text, file),
                             _file_span(text, file))
    diagnostics.sort(key=lambda d: (d.span.line, d.span.col, d.code.id))
    return ParseResult(plan_file, tuple(diagnostics))


def parse_file(path: str | Path) -> ParseResult:
    """Read and parse a file; an unreadable file or invalid UTF-8 is a diagnostic
    (invalid bytes are replaced by U+FFFD and the rest is still parsed). A file with a NUL
    byte is binary: one diagnostic and no AST."""
    text, problems = read_source(path)
    if text is None:
        return ParseResult(None, problems)
    result = parse_source(text, str(path))
    found = result.diagnostics
    if any(d.code is codes.NOT_A_PLAN for d in problems):  # said once, quoting nothing
        found = tuple(d for d in found if d.code is not codes.NOT_A_PLAN)
    return ParseResult(result.plan_file, (*problems, *found))


def read_source(path: str | Path) -> tuple[str | None, tuple[Diagnostic, ...]]:
    """The text of a plan file and the problems found reading it, each with its location:
    no text for a missing, unreadable, non-regular or binary file; for invalid UTF-8 the
    text with U+FFFD in place of the bad bytes (usable for linting, not for rewriting)."""
    file = str(path)
    try:
        data = _read_regular_file(Path(path))
    except OSError as error:
        reason = error.strerror or type(error).__name__
        message = f"cannot read '{file}': {reason}"
        return None, (Diagnostic(codes.UNREADABLE_FILE, message, Span.point(file, 1, 1)),)
    if b"\0" in data:
        return None, (_binary_diagnostic(data, file),)
    try:
        return data.decode("utf-8"), ()
    except UnicodeDecodeError as error:
        text = data.decode("utf-8", errors="replace")
        if not looks_like_a_plan(text):  # some other file (.env): quote none of it
            return text, (_not_a_plan_diagnostic(text, file),)
        return text, (_encoding_diagnostic(data, error, file),)


def _read_regular_file(path: Path) -> bytes:
    """The bytes of a regular file. Anything else (a directory, a FIFO, ``/dev/zero``) is
    refused before it is opened: reading it could block or never end."""
    mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory")
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file")
    return path.read_bytes()


def _byte_position(data: bytes, offset: int) -> tuple[int, int]:
    """(line, column) of byte ``offset``, counting characters as an editor does."""
    before = data[:offset].decode("utf-8", errors="replace")
    return before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1


def _encoding_diagnostic(data: bytes, error: UnicodeDecodeError, file: str) -> Diagnostic:
    line, col = _byte_position(data, error.start)
    byte = data[error.start]
    message = f"the file is not valid UTF-8 (byte 0x{byte:02x} at offset {error.start})"
    return Diagnostic(codes.UNREADABLE_FILE, message, Span(file, line, col, line, col + 1))


def binary_text(text: str, file: str) -> Diagnostic | None:
    """For text given in memory (an editor's buffer), what ``read_source`` says of a file
    with these characters: a NUL makes it binary (TVP109, and no parse)."""
    if "\0" not in text:
        return None
    return _binary_diagnostic(text.encode("utf-8", errors="surrogatepass"), file)


def _binary_diagnostic(data: bytes, file: str) -> Diagnostic:
    """A NUL byte never occurs in a plan: the file is binary, and parsing it would only
    produce a flood of meaningless syntax errors."""
    offset = data.index(b"\0")
    line, col = _byte_position(data, offset)
    message = f"this is not a text file: NUL byte at offset {offset}"
    return Diagnostic(codes.UNREADABLE_FILE, message, Span(file, line, col, line, col + 1))


# ---------------------------------------------------------------- parsing


def _parse_by_shapes(source: str, file: str) -> tuple[ast.Statement, ...] | None:
    """Step 1: the statement groups, through ``parse.shapes``, if the file repeats itself
    enough to gain by it; None otherwise, or on any error (or a Lark that module does not
    know), and the plain parse then runs (and reports the error)."""
    if _first_line_indented(source):
        return None
    parser, builder = get_parser_and_builder()
    groups = shapes.ShapeParser.of(parser)
    if groups is None:
        return None
    source_shape = groups.shape_of(source)
    bounds = list(_group_bounds(source))
    distinct = {source_shape[start:end] for _, start, end in bounds}
    if len(distinct) > MAX_DISTINCT_SHAPES * len(bounds):
        return None
    statements: list[ast.Statement] = []
    try:
        for first_line, start, end in bounds:
            builder.reset(file, first_line, start)
            statements.extend(groups.parse(source[start:end], source_shape[start:end]))
    except Exception:  # noqa: BLE001 - any failure: parse the plain way below
        return None
    return tuple(statements)


def _parse_whole(source: str, file: str) -> tuple[ast.Statement, ...] | None:
    """The fast path: the whole file in one parse, or None on any error."""
    if _first_line_indented(source):
        return None
    try:
        return _parse_chunk(source, AstBuilder(file))
    except Exception:  # noqa: BLE001 - any failure: recover group by group below
        return None


def _parse_chunk(text: str, where: AstBuilder) -> tuple[ast.Statement, ...]:
    """Parse one chunk; ``where`` says which file it is from and where it starts."""
    parser, builder = get_parser_and_builder()
    builder.reset(where.file, where.line_offset, where.pos_offset)
    return parser.parse(text)


def _parse_by_groups(source: str, file: str,
                     diagnostics: list[Diagnostic]) -> tuple[ast.Statement, ...]:
    statements: list[ast.Statement] = []
    for first_line, start_pos, lines in _statement_groups(source):
        builder = AstBuilder(file, first_line, start_pos)
        statements.extend(_parse_group(lines, builder, diagnostics))
    return tuple(statements)


def _parse_group(lines: list[str], builder: AstBuilder,
                 diagnostics: list[Diagnostic]) -> tuple[ast.Statement, ...]:
    """Parse one statement group, blanking each failing statement and retrying."""
    if builder.line_offset == 0 and _first_line_indented("\n".join(lines)):
        diagnostics.append(_leading_indent_diagnostic(lines, builder))
        _blank_statement(lines, _first_content_index(lines))
    original, blanked = list(lines), []
    for _ in range(MAX_ATTEMPTS_PER_GROUP):
        text = "\n".join(lines)
        try:
            return _parse_chunk(text, builder)
        except Exception as error:  # noqa: BLE001 - never a traceback; see _problem
            problem = _problem(error, text, builder)
            if not _emptied_by_recovery(problem, original, blanked):
                diagnostics.append(problem.diagnostic)
            blanked.append(problem.line - 1)
            if not _blank_statement(lines, problem.line - 1):
                return ()
    return ()


def _emptied_by_recovery(problem: SyntaxProblem, original: list[str], blanked: list[int]
                         ) -> bool:
    """A ``for`` or ``template`` header whose body is empty only because recovery blanked
    its statements (each already reported): no second error saying the body is missing."""
    if problem.diagnostic.code is not codes.EXPECTED_INDENTED_BLOCK:
        return False
    header = problem.line - 1
    depth = _indent(original[header])
    return any(index > header and _indent(original[index]) > depth for index in blanked)


def _problem(error: Exception, text: str, builder: AstBuilder) -> SyntaxProblem:
    """The diagnostic for any exception raised while parsing one group. Exceptions that are
    not syntax errors are parser bugs: reported as a diagnostic on the group, never raised."""
    if not isinstance(error, LarkError | BuildError | RecursionError):
        return _internal_problem(error, text, builder)
    try:
        return _syntax_problem(error, text, builder)
    except Exception as bug:  # noqa: BLE001
        return _internal_problem(bug, text, builder)


def _internal_problem(error: Exception, text: str, builder: AstBuilder) -> SyntaxProblem:
    line = _first_content_index(text.split("\n")) + 1
    number = builder.line_offset + line
    message = f"internal error while parsing this statement ({type(error).__name__}); please report"
    span = Span(builder.file, number, 1, number, 2)
    return SyntaxProblem(Diagnostic(codes.UNEXPECTED_TOKEN, message, span), line)


def _syntax_problem(error: Exception, text: str, builder: AstBuilder) -> SyntaxProblem:
    if isinstance(error, BuildError):
        span = error.span
        line = span.line - builder.line_offset
        if error.code is codes.NESTING_TOO_DEEP:  # skip the whole group, not an inner block
            line = _first_content_index(text.split("\n")) + 1
        return SyntaxProblem(Diagnostic(error.code, error.message, span), line)
    if isinstance(error, RecursionError):
        span = Span(builder.file, builder.line_offset + 1, 1, builder.line_offset + 1, 2)
        return SyntaxProblem(Diagnostic(codes.NESTING_TOO_DEEP,
                                        "this statement is nested too deeply", span), 1)
    return diagnose(error, text, builder)


# ---------------------------------------------------------------- plan or not


def looks_like_a_plan(text: str) -> bool:
    """At least half of the content lines (not blank, not a comment) start a statement."""
    content, starting = _count_statement_lines(text)
    return 2 * starting >= content


def _count_statement_lines(text: str) -> tuple[int, int]:
    content = starting = 0
    for line in text.split("\n"):
        if _is_content(line):
            content += 1
            starting += _starts_a_statement(line.strip())
    return content, starting


def _starts_a_statement(line: str) -> bool:
    match = _FIRST_WORD.match(line)
    if match is None:
        return False
    word = match.group(1).lower()
    return word in STATEMENT_KEYWORDS or bool(
        difflib.get_close_matches(word, STATEMENT_KEYWORDS, n=1, cutoff=KEYWORD_NEAR_MISS))


def _not_a_plan_diagnostic(text: str, file: str) -> Diagnostic:
    """One diagnostic for the whole file; it states counts only, never the file's text."""
    content, starting = _count_statement_lines(text)
    message = (f"this file does not look like a plan: {starting} of {content} lines (not "
               "blank, not comments) start with a statement keyword; its text is not shown")
    return Diagnostic(codes.NOT_A_PLAN, message, Span(file, 1, 1, 1, 2, 0, 1),
                      help="check that this is the plan file you meant; a plan's lines start "
                           "with plan, spec, mesh, split, replicate, a collective, ...")


# ---------------------------------------------------------------- lines and groups


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t\f"))


def _is_content(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _first_content_index(lines: list[str]) -> int:
    return next((i for i, line in enumerate(lines) if _is_content(line)), 0)


def _first_line_indented(text: str) -> bool:
    for line in text.split("\n"):
        if _is_content(line):
            return _indent(line) > 0
    return False


def _statement_groups(source: str):
    """Yield (line offset, position offset, lines) for each top-level statement group."""
    for first_line, start, end in _group_bounds(source):
        yield first_line, start, source[start:end].split("\n")


def _group_bounds(source: str):
    """Yield (line offset, start, end) for each top-level statement group of ``source`` (a
    text ending in a newline): a line with a statement at column 1, the lines after it that
    are indented, blank or comments, and the newline ending the last of them."""
    first_line, start, pos = 0, 0, 0
    for index, line in enumerate(source.split("\n")):
        if pos > start and line[:1] not in _INDENT_CHARS and _is_content(line):
            yield first_line, start, pos
            first_line, start = index, pos
        pos += len(line) + 1
    yield first_line, start, len(source)


def _blank_statement(lines: list[str], index: int) -> bool:
    """Blank line ``index`` and, for a block header, its body (the lines indented deeper
    after it). False if nothing was left to blank (so recovery cannot loop forever)."""
    if not 0 <= index < len(lines) or not lines[index].strip():
        return False
    depth = _indent(lines[index])
    end = index + 1
    if _BLOCK_HEADER.match(lines[index]):
        while end < len(lines) and (not _is_content(lines[end]) or _indent(lines[end]) > depth):
            end += 1
    for number in range(index, end):
        lines[number] = _BLANK.sub(" ", lines[number])
    return True


def _leading_indent_diagnostic(lines: list[str], builder: AstBuilder) -> Diagnostic:
    index = _first_content_index(lines)
    line = lines[index]
    pos = sum(len(text) + 1 for text in lines[:index])
    span = Span(builder.file, index + 1, 1, index + 1, _indent(line) + 1, pos,
                pos + _indent(line))
    return Diagnostic(codes.BAD_INDENTATION,
                      "unexpected indentation: the first statement must start at column 1",
                      span)


def _file_span(text: str, file: str) -> Span:
    last_line = text.count("\n") + 1
    last_col = len(text) - (text.rfind("\n") + 1) + 1
    return Span(file, 1, 1, last_line, last_col, 0, len(text))


# ---------------------------------------------------------------- comments


def collect_comments(text: str, file: str) -> tuple[ast.Comment, ...]:
    """Every ``#`` comment outside a string, in order. Strings cannot span lines, so a
    per-line scan is exact."""
    comments: list[ast.Comment] = []
    pos = 0
    for number, line in enumerate(text.split("\n"), start=1):
        column = _comment_column(line) if "#" in line else -1
        if column >= 0:
            body = line[column:].rstrip("\r")
            span = Span(file, number, column + 1, number, column + 1 + len(body),
                        pos + column, pos + column + len(body))
            comments.append(ast.Comment(body, span))
        pos += len(line) + 1
    return tuple(comments)


def _comment_column(line: str) -> int:
    if '"' not in line:
        return line.find("#")
    in_string = escaped = False
    for column, char in enumerate(line):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "#":
            return column
    return -1
