"""Loading the `.tvp` grammar (``grammar/tvp.lark``) into one cached Lark LALR parser.

The parser is built once per process. Strictness is a property of the grammar file, not of
any input: ``tests/test_parse_grammar.py`` builds it with ``strict=True`` (Lark then rejects
LALR conflicts and, through ``interegular``, terminal collisions), so a grammar that is not
strict fails CI. At run time the same parser is built without repeating that analysis (it adds
checks only; for a grammar that passes them the parser is identical). Lark also runs the
interegular collision analysis in non-strict mode whenever the package is importable, only to
log warnings; ``_without_collision_analysis`` skips that repetition too. Together this takes
parser construction from about 0.8 s to 0.15 s on our 2-core machine, the start-up of every
``tvp lint``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import lru_cache

from lark import Lark, Token
from lark import lexer as lark_lexer
from lark.exceptions import LarkError
from lark.indenter import Indenter

from trainverify_dsl.parse.build import AstBuilder, InlineCallbacks
from trainverify_dsl.resources import RESOURCES

GRAMMAR_FILE = RESOURCES.grammar_file


class IndentationProblem(LarkError):
    """A dedent to a column that no enclosing block uses. ``token`` is the newline token."""

    def __init__(self, token: Token, column: int, expected: int) -> None:
        super().__init__(f"dedent to column {column}, expected {expected}")
        self.token = token
        self.column = column
        self.expected = expected


class TvpIndenter(Indenter):
    """Python-style blocks for ``for`` and ``template``. No implicit line joining: a statement
    is one line, so an unclosed bracket is reported on its own line."""

    NL_type = "_NL"
    OPEN_PAREN_types: list[str] = []
    CLOSE_PAREN_types: list[str] = []
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8

    def handle_NL(self, token: Token) -> Iterator[Token]:  # noqa: N802 (Lark's hook name)
        yield token
        indent_str = token.rsplit("\n", 1)[-1]
        indent = indent_str.count(" ") + indent_str.count("\t") * self.tab_len
        if indent > self.indent_level[-1]:
            self.indent_level.append(indent)
            yield Token.new_borrow_pos(self.INDENT_type, indent_str, token)
            return
        while indent < self.indent_level[-1]:
            self.indent_level.pop()
            yield Token.new_borrow_pos(self.DEDENT_type, indent_str, token)
        if indent != self.indent_level[-1]:
            raise IndentationProblem(token, indent, self.indent_level[-1])


@contextlib.contextmanager
def _without_collision_analysis() -> Iterator[None]:
    """Lark decides on the analysis through the module flag ``lark.lexer.has_interegular``;
    switch it off for one build and restore it (a missing flag means nothing to skip)."""
    saved = getattr(lark_lexer, "has_interegular", None)
    if saved is not None:
        lark_lexer.has_interegular = False
    try:
        yield
    finally:
        if saved is not None:
            lark_lexer.has_interegular = saved


def _build(builder: AstBuilder, strict: bool) -> Lark:
    if strict:
        return _lark(builder, strict=True)
    with _without_collision_analysis():
        return _lark(builder, strict=False)


def _lark(builder: AstBuilder, strict: bool) -> Lark:
    return Lark(
        GRAMMAR_FILE.read_text(encoding="utf-8"),
        parser="lalr",
        lexer="contextual",
        postlex=TvpIndenter(),
        transformer=InlineCallbacks(builder),
        keep_all_tokens=True,
        maybe_placeholders=False,
        strict=strict,
    )


@lru_cache(maxsize=1)
def get_parser_and_builder() -> tuple[Lark, AstBuilder]:
    """The cached parser and the AST builder it calls on every reduction. ``parse()``
    returns the statements directly. Not thread-safe (the builder and the indenter keep
    per-parse state): callers serialise parses (``parse.parser`` holds a lock)."""
    builder = AstBuilder()
    return _build(builder, strict=False), builder


def get_parser() -> Lark:
    return get_parser_and_builder()[0]
