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

Building still costs about 0.12 s of every command's start-up, so the built LALR tables are
also kept, as Lark serialises them (JSON, not pickle), in ``grammar/tvp.tables.json``
(``TABLES_FILE``): loading them takes about 0.02 s. The file is generated, never edited
(``python tests/test_parse_grammar.py --update``), and records the SHA-256 of the grammar text,
the Lark version and the options it was built with; when any of them differs from what is
running, the file is ignored and the parser is built from the grammar as before. So a stale
or missing file costs start-up time, never a different parser (``tests/test_parse_grammar.py``
checks that the shipped file is current and loads into the very tables a build makes).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import lark
from lark import Lark, Token
from lark import lexer as lark_lexer
from lark.exceptions import LarkError
from lark.grammar import Rule
from lark.indenter import Indenter
from lark.lexer import TerminalDef

from trainverify_dsl.parse.build import AstBuilder, InlineCallbacks
from trainverify_dsl.resources import RESOURCES

GRAMMAR_FILE = RESOURCES.grammar_file
#: The generated LALR tables of ``GRAMMAR_FILE`` (see the module docstring).
TABLES_FILE = GRAMMAR_FILE.with_name("tvp.tables.json")
#: The Lark options that shape the tables (the transformer and postlexer are passed at load).
TABLE_OPTIONS: dict[str, Any] = {"parser": "lalr", "lexer": "contextual",
                                 "keep_all_tokens": True, "maybe_placeholders": False}


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
        return _load_tables(builder) or _lark(builder, strict=False)


def _lark(builder: AstBuilder, strict: bool) -> Lark:
    return Lark(GRAMMAR_FILE.read_text(encoding="utf-8"), postlex=TvpIndenter(),
                transformer=InlineCallbacks(builder), strict=strict, **TABLE_OPTIONS)


# ---------------------------------------------------------------- generated tables


def tables_stamp(grammar_text: str) -> dict[str, Any]:
    """What the tables were made from; tables are used only where this is unchanged."""
    return {"grammar_sha256": hashlib.sha256(grammar_text.encode("utf-8")).hexdigest(),
            "lark": lark.__version__, "options": TABLE_OPTIONS}


def tables_of(parser: Lark) -> dict[str, Any]:
    """The parser's tables as Lark serialises them (what ``Lark.save`` pickles), stamped."""
    data, memo = parser.memo_serialize([TerminalDef, Rule])
    data["options"] = {name: value for name, value in data["options"].items()
                       if name not in ("transformer", "postlex", "lexer_callbacks")}
    return {"stamp": tables_stamp(GRAMMAR_FILE.read_text(encoding="utf-8")),
            "data": data, "memo": memo}


def write_tables(path: Path = TABLES_FILE) -> None:
    text = json.dumps(tables_of(_lark(AstBuilder(), strict=False)), separators=(",", ":"))
    path.write_text(text + "\n", encoding="utf-8")


def read_tables(path: Path = TABLES_FILE) -> dict[str, Any] | None:
    """The tables in ``path`` if they were made from this grammar, Lark and options."""
    try:
        tables = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_int_keys)
    except (OSError, ValueError):
        return None
    current = tables_stamp(GRAMMAR_FILE.read_text(encoding="utf-8"))
    return tables if tables.get("stamp") == current else None


def _int_keys(pairs: list[tuple[str, Any]]) -> dict[Any, Any]:
    """JSON object keys are strings; Lark's state and memo numbers are ints (no terminal,
    rule or option name is all digits)."""
    return {int(key) if key.isdigit() else key: value for key, value in pairs}


def _load_tables(builder: AstBuilder) -> Lark | None:
    """The parser from ``TABLES_FILE``, or None (stale, missing or unreadable: build it).
    ``Lark._load`` is what Lark's own ``cache=`` option calls with the same dictionary."""
    tables = read_tables()
    if tables is None:
        return None
    try:
        return Lark.__new__(Lark)._load({"data": tables["data"], "memo": tables["memo"]},
                                         postlex=TvpIndenter(),
                                         transformer=InlineCallbacks(builder))
    except Exception:  # noqa: BLE001 - another Lark's internals: build from the grammar
        return None


@lru_cache(maxsize=1)
def get_parser_and_builder() -> tuple[Lark, AstBuilder]:
    """The cached parser and the AST builder it calls on every reduction. ``parse()``
    returns the statements directly. Not thread-safe (the builder and the indenter keep
    per-parse state): callers serialise parses (``parse.parser`` holds a lock)."""
    builder = AstBuilder()
    return _build(builder, strict=False), builder


def get_parser() -> Lark:
    return get_parser_and_builder()[0]

