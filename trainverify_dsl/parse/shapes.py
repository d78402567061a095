"""Statement shapes: Lark parses each distinct shape of statement once per file, and its parse
is replayed for the other statements of that shape.

A plan is line-oriented and repetitive: a search tool writes the same statements for a
thousand layers, differing in numbers only (``split layers.17.attention.wq.weight [tp, -]``).
The parser (``parser._parse_by_shapes``) hands this module one top-level statement group at a
time, with its *shape*: the group's text with every digit read as ``0``.

The first group of a shape is parsed by Lark (its LALR parse table, its contextual lexer's
scanners, the ``TvpIndenter`` postlexer, the callbacks Lark built around ``build.AstBuilder``),
driven the way ``Lark.parse`` drives them, while recording what happened (``Shape``): for every
token, the parser state it was lexed in and its terminal; the terminals after the postlexer;
the parser's actions (shift, or reduce: this callback over this many values).

A later group of the same shape is lexed with Lark's scanner of each recorded state, as Lark's
contextual lexer would (ignored terminals skipped, lines and columns counted as
``lark.lexer.LineCounter`` does), and run through the postlexer. If every terminal is the
recorded one and the text ends where it did, Lark's parse of this group takes exactly the
recorded actions, because an LALR parser's actions depend on the terminals alone (and the
parser states the lexer was asked in are then the recorded ones, by induction over the tokens).
So the actions are replayed: the same callbacks, in the same order, over the new tokens; only
the automaton's table look-ups are skipped. Any difference sends the group back to Lark (and
the new parse replaces the recorded shape).

Nothing here makes a diagnostic: any exception (a syntax error, a ``BuildError``) propagates,
and the caller parses the file the plain way, which reports it. ``ShapeParser.of`` returns
None for a Lark whose internals are not the ones relied on here (``lark`` 1.3), and the
caller then parses the plain way too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lark import Lark, Token

#: Every digit read as ``0``: statements that differ in their numbers have one shape.
_DIGITS_AS_ZERO = str.maketrans("123456789", "000000000")

#: The action "shift the next token" in ``Shape.actions`` (a reduction is a pair).
SHIFT = None

Action = tuple[Callable[[list[Any]], Any], int] | None


def shape_of(text: str) -> str:
    """The shape of ``text``; slices of it are the shapes of the slices (same length)."""
    return text.translate(_DIGITS_AS_ZERO)


@dataclass(frozen=True, slots=True)
class Shape:
    """What Lark did with one statement group."""

    #: (the lexer of the parser state it was asked in, terminal) for every token it produced
    lexemes: tuple[tuple[_StateLexer, str], ...]
    #: the lexer of the parser state in which it found nothing but ignored text up to the end
    end_lexer: _StateLexer
    #: the terminals the parser was fed, after the postlexer (``_INDENT``, ``_DEDENT`` added)
    terminals: tuple[str, ...]
    #: the parser's actions in order: ``SHIFT``, or (callback, number of values reduced)
    actions: tuple[Action, ...]


@dataclass(frozen=True, slots=True)
class _StateLexer:
    """The contextual lexer's lexer for one parser state (``lark.lexer.BasicLexer``): its
    scanner's match (``Scanner.match``: the terminals' alternation in Lark's priority order,
    the first alternative that matches wins) and its ignored and newline terminals."""

    match: Callable[[str, int], re.Match[str] | None]
    ignore_types: frozenset[str]
    newline_types: frozenset[str]


def _first_match(patterns: tuple[re.Pattern[str], ...]) -> Callable[[str, int], Any]:
    """``Scanner.match`` over several alternations (Lark splits one past 100 groups)."""
    if len(patterns) == 1:
        return patterns[0].match

    def match(text: str, pos: int) -> re.Match[str] | None:
        for pattern in patterns:
            found = pattern.match(text, pos)
            if found is not None:
                return found
        return None
    return match


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
    lark_lexers: dict[int, Any]
    #: parser state -> the same lexer's parts, for lexing a recorded shape again
    lexers: _StateLexers
    postlexer: Any

    @staticmethod
    def of(parser: Lark) -> _LarkParts | None:
        try:
            from lark.lexer import BasicLexer, ContextualLexer, LexerState
            from lark.parser_frontends import PostLexConnector
            from lark.parsers.lalr_parser_state import ParseConf, ParserState
            from lark.utils import TextSlice

            frontend = parser.parser
            connector, lalr = frontend.lexer, frontend.parser.parser
            contextual = connector.lexer
            lexers = contextual.lexers
            if not (isinstance(connector, PostLexConnector)
                    and isinstance(contextual, ContextualLexer)
                    and all(type(each) is BasicLexer for each in lexers.values())):
                return None
            if any(isinstance(key, str) for key in lalr.callbacks):
                return None  # callbacks on shifted terminals (none in our grammar)
            _state_lexer(lexers[lalr.parse_table.start_states["start"]])  # Lark's scanner?
        except (ImportError, AttributeError, TypeError, KeyError):
            return None
        return _LarkParts(ParseConf, ParserState, LexerState, TextSlice, lalr.parse_table,
                          lalr.callbacks, lexers, _StateLexers(lexers), connector.postlexer)


class _StateLexers(dict[int, _StateLexer]):
    """Made on first use, as Lark builds a state's scanner on first use (compiling all 90 of
    them would add 30 ms to every command)."""

    def __init__(self, lark_lexers: dict[int, Any]) -> None:
        super().__init__()
        self.lark_lexers = lark_lexers

    def __missing__(self, state: int) -> _StateLexer:
        self[state] = lexer = _state_lexer(self.lark_lexers[state])
        return lexer


def _state_lexer(lexer: Any) -> _StateLexer:
    """Raises TypeError for a lexer this module cannot follow: the group is then parsed the
    plain way (terminal callbacks, none in our grammar, would retype tokens)."""
    patterns = tuple(lexer.scanner._mres)
    if lexer.callback or not all(isinstance(pattern, re.Pattern) for pattern in patterns):
        raise TypeError("a lexer with terminal callbacks or without Python regexes")
    return _StateLexer(_first_match(patterns), frozenset(lexer.ignore_types),
                       frozenset(lexer.newline_types))


@lru_cache(maxsize=2)
def _lark_parts(parser: Lark) -> _LarkParts | None:
    return _LarkParts.of(parser)


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

    def parse(self, text: str, shape: str) -> Any:
        """What ``Lark.parse(text)`` returns (for a group: its statements)."""
        known = self.shapes.get(shape)
        if known is not None:
            tokens = self._relex(text, known)
            if tokens is not None:
                self.replayed += 1
                return _replay(known.actions, tokens)
        result, self.shapes[shape] = self._parse(text)
        self.parsed += 1
        return result

    # ------------------------------------------------------------ parsing with Lark

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
        lexemes: list[tuple[_StateLexer, str]] = []
        end_lexer: list[_StateLexer] = []

        def lexed() -> Iterator[Token]:
            while True:
                position = state.position
                try:
                    token = parts.lark_lexers[position].next_token(lexer_state, state)
                except EOFError:
                    end_lexer.append(parts.lexers[position])
                    return
                lexemes.append((parts.lexers[position], token.type))
                yield token

        self.recorded.clear()
        terminals: list[str] = []
        token = None
        for token in parts.postlexer.process(lexed()):
            terminals.append(token.type)
            state.feed_token(token)
            self.recorded.append(SHIFT)
        end = Token.new_borrow_pos("$END", "", token) if token else Token("$END", "", 0, 1, 1)
        result = state.feed_token(end, True)
        shape = Shape(tuple(lexemes), end_lexer[0], tuple(terminals), tuple(self.recorded))
        return result, shape

    # ------------------------------------------------------------ replaying

    def _relex(self, text: str, shape: Shape) -> list[Token] | None:
        """The tokens Lark would feed its parser for ``text`` if it lexes like ``shape``
        (else None): the lexer's tokens, then the postlexer's stream."""
        tokens = _lex(text, shape)
        if tokens is None:
            return None
        try:
            stream = list(self.parts.postlexer.process(iter(tokens)))
        except Exception:  # noqa: BLE001 - the indenter refuses: Lark will say why
            return None
        if tuple(token.type for token in stream) != shape.terminals:
            return None
        return stream


def _lex(text: str, shape: Shape) -> list[Token] | None:
    """``BasicLexer.next_token`` with each recorded state's lexer: the same scanner, ignored
    terminals skipped, positions as ``LineCounter.feed`` counts them. None when a terminal
    differs or text is left over. (A long function: it is the lexer's inner loop.)"""
    pos, line, line_start = 0, 1, 0
    tokens: list[Token] = []
    for lexer, terminal in shape.lexemes:
        while True:
            found = lexer.match(text, pos)
            if found is None:
                return None
            value, kind = found.group(), found.lastgroup
            start, start_line, start_column = pos, line, pos - line_start + 1
            if kind in lexer.newline_types and "\n" in value:
                line += value.count("\n")
                line_start = pos + value.rindex("\n") + 1
            pos = found.end()
            if kind not in lexer.ignore_types:
                break
        if kind != terminal:
            return None
        tokens.append(Token(kind, value, start, start_line, start_column, line,
                            pos - line_start + 1, pos))
    lexer = shape.end_lexer
    while pos < len(text):
        found = lexer.match(text, pos)
        if found is None or found.lastgroup not in lexer.ignore_types:
            return None
        pos = found.end()
    return tokens


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
