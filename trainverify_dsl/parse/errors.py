"""Syntax errors by example: Lark exceptions -> friendly ``Diagnostic`` values.

``EXAMPLES`` is a table of (code, message, bad snippets). A syntax error is matched against
it by its parser signature: the LALR state the parser stopped in plus the exact set of
tokens it would have accepted there. The signatures of the snippets are computed once, by
parsing them. (Lark's ``UnexpectedInput.match_examples`` does the same matching, but it
compares parser states including the stack depth, so an example written at top level would
not match the same mistake inside a ``for`` block, and it re-parses every example for every
error.) The same table is test data: every snippet must produce its code.

Errors no example matches get a generic message that lists what was expected, in user
words (``'['``, "a mesh axis name", "the end of the line"), never Lark terminal names.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import lru_cache

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedToken

from trainverify_dsl.parse.build import AstBuilder
from trainverify_dsl.parse.grammar import IndentationProblem, get_parser
from trainverify_dsl.report import codes_syntax as codes
from trainverify_dsl.report.diagnostics import Code, Diagnostic
from trainverify_dsl.report.span import Span


@dataclass(frozen=True, slots=True)
class SyntaxExample:
    code: Code
    message: str
    snippets: tuple[str, ...]


EXAMPLES: tuple[SyntaxExample, ...] = (
    SyntaxExample(codes.EXPECTED_OVER, "expected 'over' and the mesh axes of the group", (
        "all-reduce grad(params) dp\n",
        "all-reduce x\n",
        "copy x tp\n",
        "partial x tp\n",
        "partial x\n",
        "optimizer adamw lr=1 shard dp\n",
    )),
    SyntaxExample(codes.EXPECTED_OVER,
                  "expected the mesh axes after 'over', e.g. 'over dp' or 'over dp, cp'", (
        "replicate x over\n",
        "all-reduce x over\n",
        "all-reduce x over 1\n",
        "optimizer adamw shard over\n",
        "replicate x over (\n",
        # Not "over tp," or "over (tp,": after the comma the parser state is the one of
        # "split x [(dp,", which has no 'over'; the generic "expected a name" fits both.
    )),
    SyntaxExample(codes.EXPECTED_TARGET,
                  "expected a module path, e.g. 'embed' or 'layers[0:8]'", (
        "pipeline-stage 0:\n",
        "pipeline-stage 0: embed,\n",
        "for l in:\n    replicate l\n",
        "for l in layers,:\n    replicate l\n",
    )),
    SyntaxExample(codes.BAD_SPLIT_ENTRY, "expected a mesh axis name, '(' or '-' as a split entry", (
        "split tokens [dp, ]\n",
        "split tokens [dp, 1]\n",
        "split tokens []\n",
        "split tokens [dp, ,]\n",
    )),
    SyntaxExample(codes.EXPECTED_SPLIT_DIMS,
                  "expected '[' and one entry per tensor dimension, e.g. [dp, -]", (
        "split tokens dp\n",
        "split tokens\n",
        "split tokens (dp, -)\n",
        "place x S(0)\n",
        "place x\n",
    )),
    SyntaxExample(codes.BAD_MESH_AXIS, "expected a mesh axis as name=size, e.g. dp=4", (
        "mesh dp 4\n",
        "mesh dp\n",
        "mesh 4\n",
        "mesh\n",
        "mesh dp=4 tp=2\n",
        "mesh dp=4,\n",
    )),
    SyntaxExample(codes.EXPECTED_COLON, "expected ':'", (
        "for l in layers\n    split l.w [tp, -]\n",
        "template t(m)\n    split m.w [tp, -]\n",
        "pipeline-stage 0 embed\n",
        "pipeline-stage 0\n",
    )),
    SyntaxExample(codes.BAD_OPTION, "expected an option as key=value, e.g. op=avg", (
        "all-reduce grad(params) over dp op avg\n",
        "all-reduce grad(params) over dp op\n",
        "partial x over tp op\n",
        "optimizer adamw lr\n",
        "optimizer adamw lr 3\n",
        "clip-grad-norm 1.0 foo\n",
        "algorithm a for x over tp k\n",
        "all-reduce grad(params) over dp op=\n",
        "optimizer adamw lr=\n",
    )),
    SyntaxExample(codes.EXPECTED_EXPRESSION, "expected a number, a name or '('", (
        "loss-scale 1/\n",
        "loss-scale\n",
        "loss-scale 1 +\n",
        "loss-scale 1 *\n",
        "loss-scale -\n",
        "loss-scale (\n",
        "microbatches\n",
        "mesh dp=\n",
        "send x from\n",
        "send x from 0 to\n",
        "clip-grad-norm\n",
        "pipeline-stage\n",
    )),
    SyntaxExample(codes.UNCLOSED_BRACKET, "expected ']' to close the list", (
        "split tokens [dp, -\n",
        "split tokens [dp\n",
        "split tokens [dp -\n",
        "place x [S(0), R\n",
        "place x [S(0)\n",
    )),
    SyntaxExample(codes.UNCLOSED_PAREN, "expected ')' to close the parenthesis", (
        "apply column_parallel(l.attention.wq, tp\n",
        "apply column_parallel(l\n",
        "apply column_parallel(\n",
        "loss-scale (1\n",
        "split x [(dp, cp]\n",
        "split x [(dp\n",
        "optimizer adamw betas=(0.9, 0.95\n",
        "template t(m\n",
        "all-reduce grad(params\n",
        "place x [S(0]\n",
        "replicate x over (tp\n",
    )),
    SyntaxExample(codes.EXPECTED_STRING, "expected a double-quoted string", (
        "use stdlib/megatron.tvp\n",
        "use\n",
        "spec llama\n",
        "spec\n",
    )),
    SyntaxExample(codes.EXPECTED_TARGET,
                  "expected a tensor: a module path, a glob, an input, loss, params or grad(X)", (
        "split [dp, -]\n",
        "split\n",
        "replicate\n",
        "all-reduce\n",
        "place [S(0)]\n",
        "send from 0 to 1\n",
        "all-reduce grad() over dp\n",
    )),
    SyntaxExample(codes.EXPECTED_BACKWARD_KIND,
                  "expected the backward kind after 'backward' (identity, all-reduce, "
                  "all-gather, reduce-scatter, all-to-all or scatter)", (
        "all-reduce x over tp backward\n",
        "all-reduce x over tp backward 1\n",
    )),
    SyntaxExample(codes.EXPECTED_NAME, "expected a name", (
        "plan\n",
        "plan 1\n",
        "template\n",
        "template (m):\n    split m [tp]\n",
        "apply\n",
        "apply (x)\n",
        "for in layers:\n    split x [tp]\n",
        "for\n",
        "optimizer\n",
        "algorithm\n",
        "algorithm for x\n",
        "microbatches 4 schedule\n",
    )),
)

# ---------------------------------------------------------------- user words for terminals

#: The words a statement starts with (parse/parser.py uses them to tell a plan from other files).
STATEMENT_KEYWORDS = (
    "plan", "spec", "mesh", "microbatches", "loss-scale", "loss-reduction", "use", "split",
    "replicate",
    "partial", "place", "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "copy",
    "scatter", "send", "pipeline-stage", "optimizer", "spec-optimizer", "clip-grad-norm",
    "on", "algorithm",
    "template", "apply", "for",
)

_TERMINAL_WORDS = {
    "NAME": "a name", "WORD": "a name", "PATH": "a tensor or module path",
    "VALUE_PATH": "a dotted path", "INT": "an integer", "NUMBER": "a number",
    "STRING": "a double-quoted string",
    "COLLECTIVE": "a collective (all-reduce, all-gather, reduce-scatter, all-to-all, copy, "
                  "scatter)",
    "_NL": "the end of the line", "_INDENT": "an indented block", "_DEDENT": "the end of the block",
    "$END": "the end of the file",
    "LSQB": "'['", "RSQB": "']'", "LPAR": "'('", "RPAR": "')'", "COMMA": "','", "EQUAL": "'='",
    "COLON": "':'", "DOT": "'.'", "MINUS": "'-'", "PLUS": "'+'", "STAR": "'*'", "SLASH": "'/'",
}


def describe_terminal(name: str) -> str:
    """User words for a terminal name: ``_SPLIT`` -> ``'split'``, ``RSQB`` -> ``']'``."""
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    return "'" + name.lstrip("_").lower().replace("_", "-") + "'"


def describe_expected(names: set[str]) -> str:
    if "_SPLIT" in names:
        return "a statement keyword (split, replicate, all-reduce, for, ...)"
    words = sorted({describe_terminal(name) for name in names if name != "WS"})
    if len(words) <= 1:
        return "".join(words) or "nothing"
    return ", ".join(words[:-1]) + " or " + words[-1]


#: Most characters of a token a message quotes; a longer one is cut and ends in "…".
MAX_QUOTED = 40


def describe_token(token: Token) -> str:
    if token.type in ("_NL", "_INDENT", "_DEDENT", "$END"):
        return describe_terminal(token.type)
    return quote(str(token))


def quote(text: str) -> str:
    """``text`` in quotes, cut to ``MAX_QUOTED`` characters so a huge token is never echoed."""
    return repr(text if len(text) <= MAX_QUOTED else text[:MAX_QUOTED] + "…")


# ---------------------------------------------------------------- matching


def _signature(error: UnexpectedToken) -> tuple[int, frozenset[str]]:
    state = error.state
    position = getattr(state, "position", state)
    return position, frozenset(error.accepts or error.expected)


@lru_cache(maxsize=2)
def _example_index(parser: Lark) -> dict[tuple[int, frozenset[str]], SyntaxExample]:
    """Signature of each snippet's first error -> its example (first snippet wins).
    Keyed by parser: state numbers belong to one parse table."""
    index: dict[tuple[int, frozenset[str]], SyntaxExample] = {}
    for example in EXAMPLES:
        for snippet in example.snippets:
            try:
                parser.parse(snippet)
            except UnexpectedToken as error:
                index.setdefault(_signature(error), example)
            except Exception:  # noqa: BLE001 - other errors carry no signature
                pass
    return index


def match_example(error: UnexpectedToken) -> SyntaxExample | None:
    return _example_index(get_parser()).get(_signature(error))


# ---------------------------------------------------------------- diagnostics


@dataclass(frozen=True, slots=True)
class SyntaxProblem:
    """A diagnostic plus the 1-based chunk line to skip when recovering."""

    diagnostic: Diagnostic
    line: int


def diagnose(error: Exception, text: str, builder: AstBuilder) -> SyntaxProblem:
    """Turn any Lark error raised while parsing ``text`` (one chunk) into a diagnostic."""
    if isinstance(error, IndentationProblem):
        return _dedent_problem(error, builder)
    if isinstance(error, UnexpectedCharacters):
        return _character_problem(error, text, builder)
    if isinstance(error, UnexpectedToken):
        return _token_problem(error, text, builder)
    return _fallback_problem(error, builder)


def _diagnostic(code: Code, message: str, builder: AstBuilder, line: int, col: int,
                length: int, pos: int) -> Diagnostic:
    span = Span(builder.file, line + builder.line_offset, col, line + builder.line_offset,
                col + max(length, 1), pos + builder.pos_offset,
                pos + builder.pos_offset + max(length, 1))
    return Diagnostic(code, message, span)


def _dedent_problem(error: IndentationProblem, builder: AstBuilder) -> SyntaxProblem:
    token = error.token
    message = (f"this line's indentation (column {error.column + 1}) matches no enclosing "
               f"block (expected column {error.expected + 1})")
    diagnostic = _diagnostic(codes.BAD_INDENTATION, message, builder, token.end_line, 1,
                             token.end_column - 1, token.end_pos - token.end_column + 1)
    return SyntaxProblem(diagnostic, token.end_line)


def _character_problem(error: UnexpectedCharacters, text: str,
                       builder: AstBuilder) -> SyntaxProblem:
    char = text[error.pos_in_stream] if error.pos_in_stream < len(text) else ""
    if char == '"':
        line_end = text.find("\n", error.pos_in_stream)
        length = (line_end if line_end >= 0 else len(text)) - error.pos_in_stream
        diagnostic = _diagnostic(codes.UNTERMINATED_STRING,
                                 "this string is not closed on its line (missing '\"')",
                                 builder, error.line, error.column, length, error.pos_in_stream)
    else:
        diagnostic = _diagnostic(codes.UNEXPECTED_CHARACTER, f"unexpected character {char!r}",
                                 builder, error.line, error.column, 1, error.pos_in_stream)
    return SyntaxProblem(diagnostic, error.line)


def _token_problem(error: UnexpectedToken, text: str, builder: AstBuilder) -> SyntaxProblem:
    token = error.token
    expected = set(error.accepts or error.expected)
    if token.type == "_INDENT":
        return _indent_problem(token, builder)
    if "_INDENT" in expected:
        return _missing_block_problem(token, text, builder)
    line = token.line if token.type != "$END" else _last_content_line(text, text.count("\n"))
    glued = _glued_number(text, builder)
    if glued is not None:
        return SyntaxProblem(glued, line)
    if "_SPLIT" in expected:
        return SyntaxProblem(_unknown_statement(token, builder, text), line)
    example = match_example(error)
    if example is not None:
        message = f"{example.message}, got {describe_token(token)}"
        return SyntaxProblem(_token_diagnostic(example.code, message, token, builder), line)
    return SyntaxProblem(_generic_token_diagnostic(token, expected, builder), line)


#: Tokens a number can be glued to when the lexer splits ``0x10`` into ``0`` and ``x10``.
_NUMBER_TOKENS = frozenset({"NUMBER", "INT"})
_WORD_TOKENS = frozenset({"NAME", "WORD", "PATH", "VALUE_PATH"})


def _glued_number(text: str, builder: AstBuilder) -> Diagnostic | None:
    """A number with a word glued to it (``lr=0x10``, ``dp=2k``) in a statement that fails
    to parse: the parser read the number, then the word as the next part of the statement,
    and failed further on at a place that says nothing of the cause. The statement is lexed
    again, as the parser lexed it, up to the error; the last glued pair is the diagnostic.
    Where a glued word is legal (the schedule ``1f1b``) it is one token and never matches."""
    previous, found = None, None
    try:
        for token in get_parser().parse_interactive(text).iter_parse():
            if previous is not None and previous.type in _NUMBER_TOKENS and \
                    token.type in _WORD_TOKENS and previous.end_pos == token.start_pos:
                found = (previous, token)
            previous = token
    except Exception:  # noqa: BLE001 (the error being reported, met again)
        pass
    if found is None:
        return None
    number, word = found
    glued = text[number.start_pos:word.end_pos]
    message = (f"{quote(glued)} is not a number: numbers are decimal (16, 0.5, 3e-4) or an "
               f"expression of them (1/8); it was read as {quote(str(number))} followed by "
               f"{quote(str(word))}")
    return _diagnostic(codes.GLUED_NUMBER, message, builder, number.line or 1,
                       number.column or 1, len(glued), number.start_pos or 0)


def _token_diagnostic(code: Code, message: str, token: Token, builder: AstBuilder) -> Diagnostic:
    length = 1 if token.type.startswith(("_NL", "_DEDENT", "$")) else len(token)
    return _diagnostic(code, message, builder, token.line or 1, token.column or 1, length,
                       token.start_pos or 0)


def _generic_token_diagnostic(token: Token, expected: set[str],
                              builder: AstBuilder) -> Diagnostic:
    wanted = describe_expected(expected)
    if token.type == "_NL":
        message = f"the line ends too early: expected {wanted}"
        return _token_diagnostic(codes.UNEXPECTED_END_OF_LINE, message, token, builder)
    message = f"unexpected {describe_token(token)}: expected {wanted}"
    return _token_diagnostic(codes.UNEXPECTED_TOKEN, message, token, builder)


def _unknown_statement(token: Token, builder: AstBuilder, text: str = "") -> Diagnostic:
    word = str(token)
    # the word as written (`spec-all-reduce`, `all-reduce-grad(params)`): the lexer may have
    # cut a keyword off its front, and suggesting that keyword back would say nothing
    start = token.start_pos if isinstance(token.start_pos, int) else None
    match = re.match(r"[^\s(\[]+", text[start:]) if start is not None else None
    written = match.group(0) if match else word
    shown = quote(written) if written != word else describe_token(token)
    message = f"unknown statement {shown}: expected a statement keyword"
    close = difflib.get_close_matches(written.lower(), STATEMENT_KEYWORDS, n=1, cutoff=0.6)
    if close and written and close[0] != written:
        message += f"; did you mean '{close[0]}'?"
    return _token_diagnostic(codes.UNKNOWN_STATEMENT, message, token, builder)


def _indent_problem(token: Token, builder: AstBuilder) -> SyntaxProblem:
    """An indented line where no block is open. The _INDENT token borrows the position of
    the newline before it; the offending line is where that newline token ends."""
    message = "unexpected indentation: no 'for' or 'template' block is open here"
    diagnostic = _diagnostic(codes.BAD_INDENTATION, message, builder, token.end_line, 1,
                             token.end_column - 1, token.end_pos - token.end_column + 1)
    return SyntaxProblem(diagnostic, token.end_line)


def _missing_block_problem(token: Token, text: str, builder: AstBuilder) -> SyntaxProblem:
    synthetic = token.type in ("_NL", "_DEDENT", "$END")
    start = token.line if synthetic else token.line - 1
    header = _last_content_line(text, start)
    line_text = text.split("\n")[header - 1].rstrip("\r")
    pos = sum(len(line) + 1 for line in text.split("\n")[:header - 1])
    message = "expected an indented block after this line (a 'for' or 'template' body)"
    indent = len(line_text) - len(line_text.lstrip(" \t"))
    diagnostic = _diagnostic(codes.EXPECTED_INDENTED_BLOCK, message, builder, header,
                             indent + 1, len(line_text.strip()) or 1, pos + indent)
    return SyntaxProblem(diagnostic, header)


def _last_content_line(text: str, line: int) -> int:
    """The last line at or before ``line`` (1-based) holding more than blanks/comments."""
    lines = text.split("\n")
    for number in range(min(line, len(lines)), 0, -1):
        stripped = lines[number - 1].strip()
        if stripped and not stripped.startswith("#"):
            return number
    return 1


def _fallback_problem(error: Exception, builder: AstBuilder) -> SyntaxProblem:
    """Any other Lark error: report it at the start of the chunk rather than crash."""
    line = getattr(error, "line", 1) or 1
    column = getattr(error, "column", 1) or 1
    message = f"cannot parse this statement ({type(error).__name__})"
    diagnostic = _diagnostic(codes.UNEXPECTED_TOKEN, message, builder, line, column, 1, 0)
    return SyntaxProblem(diagnostic, line)
