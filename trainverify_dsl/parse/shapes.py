"""Statement shapes: Lark parses each distinct shape of statement once per file, and the builder
calls of that parse are replayed for the other statements of the shape.

A plan is line-oriented and repetitive: a search tool writes the same statements for a
thousand layers, differing in numbers only (``split layers.17.attention.wq.weight [tp, -]``).
The parser (``parser._parse_by_shapes``) hands this module one top-level statement group at a
time, with its *shape*: the group's text with every ASCII digit read as ``0`` (the same
length as the text, so a slice of a file's shape is the shape of that slice).

Why a shape can be replayed. No terminal of the grammar can tell one digit from another:
every character class of its regular expressions holds all ten digits or none, no literal is
a digit, nothing refers back (``digits_are_interchangeable`` checks the terminals of the parser
in use; if the check fails, a shape is the exact text instead). So Lark's contextual lexer
lexes two groups of one shape alike: in every parser state the same terminal matches at the
same place, the ``TvpIndenter`` sees the same indentation, lines and columns are the same. The
terminals being the same, Lark's LALR parser takes the same actions, and its tree builder
calls the same ``build.AstBuilder`` methods, in the same order, with the same tokens and
results in the same places; only the tokens' values differ (in their digits).

So the first group of a shape is parsed by ``Lark.parse``, with an observer on the builder
(``build.InlineCallbacks.observer``) recording every builder call (``Shape``): the method, and
where each of its children came from (a token, recorded with its type and positions, or the
result of an earlier call). A later group of the shape gets the recorded tokens, with values
from its own text, and the recorded calls are made again on them: Lark's lexer, its automaton
and its tree-building wrappers are skipped, the builder runs as always.

Nothing here makes a diagnostic: any exception (a syntax error, a ``BuildError``) propagates,
and the caller parses the file the plain way, which reports it (a shape is recorded only from
a parse that succeeded).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lark import Lark, Token

from trainverify_dsl.parse.build import InlineCallbacks

#: Every ASCII digit read as ``0``.
_DIGITS_AS_ZERO = str.maketrans("123456789", "000000000")

#: ``Token(...)``: Lark 1.2+ forwards its constructor to ``_future_new`` (to warn about the
#: deprecated ``type_`` keyword), which makes the same token without that second call.
_new_token = getattr(Token, "_future_new", Token)

#: (type, value or None for "the group's text from start to end", start, line, column,
#: end line, end column, end): a token as Lark fed it to the builder.
RecordedToken = tuple[str, str | None, Any, Any, Any, Any, Any, Any]
#: (builder method, where each raw child comes from: ``k`` is the k-th of the recorded tokens
#: followed by the calls' results; the positions of the meaningful children in raw).
Call = tuple[Callable[[list[Any], list[Any]], Any], tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class Shape:
    """What the builder was asked to do for one statement group; the last call's result is
    the parse's."""

    tokens: tuple[RecordedToken, ...]
    calls: tuple[Call, ...]


class ShapeParser:
    """Parses the statement groups of one file, each shape through Lark once (not
    thread-safe: Lark's parser and the builder are shared, ``grammar.get_parser_and_builder``
    says how that is serialised)."""

    def __init__(self, parser: Lark, callbacks: InlineCallbacks) -> None:
        self.parser = parser
        self.callbacks = callbacks
        self.digits_interchangeable = _terminals_ignore_digits(parser)
        self.shapes: dict[str, Shape | None] = {}
        #: how many groups were parsed by Lark and how many replayed (for tests and benches)
        self.parsed = self.replayed = 0

    @staticmethod
    def of(parser: Lark) -> ShapeParser | None:
        """A parser for one file's groups; None unless Lark calls ``build.AstBuilder``
        through ``InlineCallbacks`` (the parser of ``grammar.get_parser_and_builder``)."""
        callbacks = getattr(parser.options, "transformer", None)
        return ShapeParser(parser, callbacks) if isinstance(callbacks, InlineCallbacks) else None

    def shape_of(self, text: str) -> str:
        """The shape of ``text`` (the text itself if digits are not interchangeable); of the
        same length, so a slice of it is the shape of the same slice of ``text``."""
        if self.digits_interchangeable:
            return text.translate(_DIGITS_AS_ZERO)
        return text

    def parse(self, text: str, shape: str) -> Any:
        """What ``Lark.parse(text)`` returns (for a group: its statements)."""
        known = self.shapes.get(shape)
        if known is not None:
            self.replayed += 1
            return _replay(known, text)
        recorder = _Recorder(text)
        self.callbacks.observer = recorder.observe
        try:
            result = self.parser.parse(text)
        finally:
            self.callbacks.observer = None
        self.parsed += 1
        self.shapes[shape] = recorder.shape(result)
        return result


class _Recorder:
    """Watches the builder calls of one ``Lark.parse`` and makes them a ``Shape``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[RecordedToken] = []
        self.calls: list[Call] = []
        #: id of a token or result -> its reference (both kept alive, so ids stay unique)
        self.refs: dict[int, int] = {}
        self.alive: list[Any] = []
        self.complete = True

    def observe(self, method: Callable[[list[Any], list[Any]], Any], raw: list[Any],
                parts: list[Any], result: Any) -> None:
        refs = tuple(self._ref(child) for child in raw)
        positions = _positions(raw, parts)
        self.calls.append((method, refs, positions))
        self.refs[id(result)] = ~(len(self.calls) - 1)  # numbered once all tokens are known
        self.alive.append(result)

    def _ref(self, child: Any) -> int:
        ref = self.refs.get(id(child))
        if ref is not None:
            return ref
        if not isinstance(child, Token):
            self.complete = False  # neither a token nor a builder result: cannot replay
            return 0
        text = self.text[child.start_pos:child.end_pos]
        self.tokens.append((child.type, None if child.value == text else child.value,
                            child.start_pos, child.line, child.column, child.end_line,
                            child.end_column, child.end_pos))
        self.refs[id(child)] = len(self.tokens) - 1
        self.alive.append(child)
        return len(self.tokens) - 1

    def shape(self, result: Any) -> Shape | None:
        """The shape, if every child was accounted for and the last call made the result.
        Results are numbered after the tokens: result ``~k`` becomes ``len(tokens) + k``."""
        if not (self.complete and self.calls and self.refs.get(id(result)) == ~(
                len(self.calls) - 1)):
            return None
        count = len(self.tokens)
        calls = tuple((method, tuple(ref if ref >= 0 else count + ~ref for ref in refs),
                       positions) for method, refs, positions in self.calls)
        return Shape(tuple(self.tokens), calls)


def _positions(raw: list[Any], parts: list[Any]) -> tuple[int, ...]:
    """Where each of ``parts`` (a subsequence of ``raw``) stands in ``raw``."""
    positions, start = [], 0
    for part in parts:
        start = next(i for i in range(start, len(raw)) if raw[i] is part)
        positions.append(start)
        start += 1
    return tuple(positions)


def _replay(shape: Shape, text: str) -> Any:
    """The recorded builder calls on this group's tokens: the last one's result."""
    values = [_new_token(kind, text[start:end] if value is None else value, start, line,
                         column, end_line, end_column, end)
              for kind, value, start, line, column, end_line, end_column, end in shape.tokens]
    for method, refs, positions in shape.calls:  # each result is appended after the tokens
        raw = [values[ref] for ref in refs]
        values.append(method(raw, [raw[i] for i in positions]))
    return values[-1]


# ---------------------------------------------------------------- which texts share a shape


@lru_cache(maxsize=2)
def _terminals_ignore_digits(parser: Lark) -> bool:
    """``digits_are_interchangeable`` for the parser's terminals (once per parser)."""
    return digits_are_interchangeable(terminal.pattern.to_regexp()
                                      for terminal in parser.terminals)


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
