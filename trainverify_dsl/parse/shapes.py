"""Statement shapes: Lark parses each distinct shape of statement once per file, and its parse
is replayed for the other statements of that shape.

A plan is line-oriented and repetitive: a search tool writes the same statements for a
thousand layers, differing in numbers only (``split layers.17.attention.wq.weight [tp, -]``).
The parser (``parser._parse_by_shapes``) hands this module one top-level statement group at a
time, with its *shape*: the group's text with every ASCII digit read as ``0`` (``shape_of``;
the same length as the text, so a slice of a file's shape is the shape of the slice).

Why a shape can be replayed. No terminal of the grammar can tell one digit from another:
every character class in its regular expressions holds all ten digits or none, and no literal
is a digit (``digits_are_interchangeable`` checks this on the terminals of the parser in use;
if it failed, shapes would be the exact texts instead). So two groups of one shape are lexed
alike by Lark's contextual lexer: in every parser state the same terminals match at the same
positions, the ``TvpIndenter`` sees the same indentation, lines and columns are the same.
Their terminals being the same, Lark's LALR parser takes the same actions on both. Only the
token values differ, in their digits.

So the first group of a shape is parsed by Lark (its parse table, its contextual lexer, the
postlexer, the callbacks Lark built around ``build.AstBuilder``), driven the way
``Lark.parse`` drives them, while recording the tokens it fed the parser (``Shape.tokens``)
and its actions (shift, or reduce: this callback over this many values). A later group of
the shape gets the recorded tokens with its own text in their values, and the recorded
actions are replayed: the same callbacks, in the same order, on the new tokens. Lexing and
the automaton's table look-ups are skipped; building the AST is not.

Nothing here makes a diagnostic: any exception (a syntax error, a ``BuildError``) propagates,
and the caller parses the file the plain way, which reports it (a shape is recorded only
from a parse that succeeded). ``ShapeParser.of`` returns None for a Lark whose internals are
not the ones used here (``lark`` 1.3), and the caller then parses the plain way too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lark import Lark, Token

#: Every ASCII digit read as ``0``.
_DIGITS_AS_ZERO = str.maketrans("123456789", "000000000")

#: ``Token(...)``: Lark 1.2+ forwards its constructor to ``_future_new`` (to warn about the
#: deprecated ``type_`` keyword), which makes the same token without that second call.
_new_token = getattr(Token, "_future_new", Token)

#: The action "shift the next token" in ``Shape.actions`` (a reduction is a pair).
SHIFT = None

Action = tuple[Callable[[list[Any]], Any], int] | None

#: (type, value or None for "the group's text from start to end", start, line, column,
#: end line, end column, end): a token as Lark fed it to the parser.
RecordedToken = tuple[str, str | None, int, int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class Shape:
    """What Lark did with one statement group."""

    #: the tokens the parser was fed, after the postlexer (its ``_INDENT`` and ``_DEDENT``
    #: carry their own value; a lexer token's value is the group's text at its place)
    tokens: tuple[RecordedToken, ...]
    #: the parser's actions in order: ``SHIFT``, or (callback, number of values reduced)
    actions: tuple[Action, ...]


# ---------------------------------------------------------------- which texts share a shape


def digits_are_interchangeable(regexps: Iterable[str]) -> bool:
    """Whether none of these regular expressions can tell one ASCII digit from another: no
    literal digit, no back-reference, and every character class (``[0-9]``, ``\\w``, ``.``,
    ``[^"]``...) holds all ten digits or none. Then a match never changes when digits are
    swapped for other digits. Anything not understood counts as telling digits apart."""
    try:
        from re import _parser  # the parser ``re.compile`` uses (Lark reads it too)

        return all(_uniform(_parser.parse(regexp)) for regexp in regexps)
    except Exception:  # noqa: BLE001 - a pattern or Python this check does not know
        return False


#: Whether a character category (``\d``, ``\w``, ``\s``... in any of its flavours) holds the
#: digits.
_CATEGORY_HOLDS_DIGITS = {
    "DIGIT": True, "NOT_DIGIT": False, "WORD": True, "NOT_WORD": False,
    "SPACE": False, "NOT_SPACE": True, "LINEBREAK": False, "NOT_LINEBREAK": True,
}
_DIGIT_CODES = range(ord("0"), ord("9") + 1)


def _uniform(pattern: Any) -> bool:
    """``digits_are_interchangeable`` for one parsed pattern (``re._parser.SubPattern``).
    One branch per opcode of the parsed form; the list is long, the logic is not."""
    for opcode, argument in pattern:
        name = str(opcode)
        if name in ("LITERAL", "NOT_LITERAL"):
            ok = argument not in _DIGIT_CODES
        elif name == "IN":
            ok = _uniform_class(argument)
        elif name in ("ANY", "AT"):
            ok = True  # any character; positions (a digit is a word character, like all)
        elif name == "SUBPATTERN":  # (group, add flags, del flags, pattern)
            ok = _uniform(argument[3])
        elif name == "BRANCH":  # (None, [pattern, ...])
            ok = all(_uniform(branch) for branch in argument[1])
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):  # (min, max, pattern)
            ok = _uniform(argument[2])
        elif name in ("ASSERT", "ASSERT_NOT"):  # (direction, pattern)
            ok = _uniform(argument[1])
        elif name == "ATOMIC_GROUP":
            ok = _uniform(argument)
        else:
            ok = False  # a back-reference compares text; anything else is unknown
        if not ok:
            return False
    return True


def _uniform_class(items: Any) -> bool:
    """A character class holds all ten digits or none (negation keeps that)."""
    held = set()
    for opcode, argument in items:
        name = str(opcode)
        if name == "NEGATE":
            continue
        if name == "LITERAL":
            held.update({argument} & set(_DIGIT_CODES))
        elif name == "RANGE":
            low, high = argument
            held.update(code for code in _DIGIT_CODES if low <= code <= high)
        elif name == "CATEGORY":
            category = str(argument).removeprefix("CATEGORY_")
            category = category.removeprefix("UNI_").removeprefix("LOC_")
            if _CATEGORY_HOLDS_DIGITS[category]:
                held.update(_DIGIT_CODES)
        else:
            return False
    return len(held) in (0, len(_DIGIT_CODES))


# ---------------------------------------------------------------- Lark's parts


@dataclass(frozen=True, slots=True)
class _LarkParts:
    """The pieces of a Lark LALR parser with a contextual lexer that a parse is made of."""

    parse_conf_type: type
    parser_state_type: type
    lexer_state_type: type
    text_slice_type: type
    parse_table: Any
    callbacks: dict[Any, Callable[[list[Any]], Any]]
    #: parser state -> the contextual lexer's lexer for it (``lark.lexer.BasicLexer``)
    lexers: dict[int, Any]
    postlexer: Any
    #: whether texts that differ in their digits only are lexed alike (module docstring)
    digits_interchangeable: bool

    @staticmethod
    def of(parser: Lark) -> _LarkParts | None:
        try:
            from lark.lexer import ContextualLexer, LexerState
            from lark.parser_frontends import PostLexConnector
            from lark.parsers.lalr_parser_state import ParseConf, ParserState
            from lark.utils import TextSlice

            frontend = parser.parser
            connector, lalr = frontend.lexer, frontend.parser.parser
            contextual = connector.lexer
            if not (isinstance(connector, PostLexConnector)
                    and isinstance(contextual, ContextualLexer)):
                return None
            if any(isinstance(key, str) for key in lalr.callbacks):
                return None  # callbacks on shifted terminals (none in our grammar)
            regexps = [terminal.pattern.to_regexp() for terminal in parser.terminals]
            return _LarkParts(ParseConf, ParserState, LexerState, TextSlice, lalr.parse_table,
                              lalr.callbacks, contextual.lexers, connector.postlexer,
                              digits_are_interchangeable(regexps))
        except (ImportError, AttributeError):
            return None


@lru_cache(maxsize=2)
def _lark_parts(parser: Lark) -> _LarkParts | None:
    return _LarkParts.of(parser)


# ---------------------------------------------------------------- parsing groups


class ShapeParser:
    """Parses statement groups of one file, each shape through Lark once (not thread-safe:
    the callbacks share one builder, as ``grammar.get_parser_and_builder`` says)."""

    def __init__(self, parts: _LarkParts) -> None:
        self.parts = parts
        self.shapes: dict[str, Shape] = {}
        self.recorded: list[Action] = []
        self.recording = {rule: self._recorder(callback)
                          for rule, callback in parts.callbacks.items()}
        #: how many groups were parsed by Lark and how many replayed (for tests and benches)
        self.parsed = self.replayed = 0

    @staticmethod
    def of(parser: Lark) -> ShapeParser | None:
        """A parser for one file's groups, or None for a Lark this module does not know."""
        parts = _lark_parts(parser)
        return ShapeParser(parts) if parts is not None else None

    def shape_of(self, text: str) -> str:
        """The shape of ``text`` (the text itself if digits are not interchangeable); of the
        same length, so a slice of it is the shape of the same slice of ``text``."""
        if self.parts.digits_interchangeable:
            return text.translate(_DIGITS_AS_ZERO)
        return text

    def parse(self, text: str, shape: str) -> Any:
        """What ``Lark.parse(text)`` returns (for a group: its statements)."""
        known = self.shapes.get(shape)
        if known is not None:
            self.replayed += 1
            return _replay(known.actions, _tokens(known, text))
        result, self.shapes[shape] = self._parse(text)
        self.parsed += 1
        return result

    def _recorder(self, callback: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        recorded = self.recorded

        def record(children: list[Any]) -> Any:
            recorded.append((callback, len(children)))
            return callback(children)
        return record

    def _parse(self, text: str) -> tuple[Any, Shape]:
        """Lark's parse of ``text`` (``lark.parsers.lalr_parser._Parser.parse_from_state``
        fed by ``ContextualLexer.lex`` through the postlexer), recorded."""
        parts = self.parts
        conf = parts.parse_conf_type(parts.parse_table, self.recording, "start")
        state = parts.parser_state_type(conf, None)
        lexer_state = parts.lexer_state_type(parts.text_slice_type(text, 0, len(text)))
        lexed: set[int] = set()  # the tokens the lexer made (the postlexer adds others)

        def lexer_tokens() -> Iterator[Token]:
            while True:
                try:
                    token = parts.lexers[state.position].next_token(lexer_state, state)
                except EOFError:
                    return
                lexed.add(id(token))
                yield token

        self.recorded.clear()
        tokens: list[RecordedToken] = []
        token = None
        for token in parts.postlexer.process(lexer_tokens()):
            state.feed_token(token)
            self.recorded.append(SHIFT)
            tokens.append((token.type, None if id(token) in lexed else token.value,
                           token.start_pos, token.line, token.column, token.end_line,
                           token.end_column, token.end_pos))
        end = Token.new_borrow_pos("$END", "", token) if token else Token("$END", "", 0, 1, 1)
        result = state.feed_token(end, True)
        return result, Shape(tuple(tokens), tuple(self.recorded))


def _tokens(shape: Shape, text: str) -> list[Token]:
    """The tokens Lark feeds its parser for ``text``, a group of this shape."""
    return [_new_token(kind, text[start:end] if value is None else value, start, line,
                       column, end_line, end_column, end)
            for kind, value, start, line, column, end_line, end_column, end in shape.tokens]


def _replay(actions: tuple[Action, ...], tokens: list[Token]) -> Any:
    """The value ``ParserState.feed_token`` would return after these actions."""
    values: list[Any] = []
    shifted = 0
    for action in actions:
        if action is SHIFT:
            values.append(tokens[shifted])
            shifted += 1
            continue
        callback, size = action
        if size:
            children = values[-size:]
            del values[-size:]
        else:
            children = []
        values.append(callback(children))
    return values[-1]
