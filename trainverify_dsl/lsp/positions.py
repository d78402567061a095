"""Our spans in the editor's coordinates, and back.

A ``Span`` counts 1-based lines and 1-based columns in characters (code points) of the text
as the parser reads it: a leading byte-order mark dropped, ``\\r\\n`` and a lone ``\\r`` ending
a line like ``\\n``. The Language Server Protocol counts 0-based lines and 0-based columns in
*code units* of the negotiated position encoding: UTF-16 unless the client offers another
(``utf-8``, ``utf-32``). Lines end at ``\\n``, ``\\r\\n`` or ``\\r`` in both; never at the other
characters ``str.splitlines`` breaks on (form feed is blank space in a plan).

``DocumentLines`` holds the text the editor has (byte-order mark included, if it sent one) and
converts in both directions; a position past the end of a line or of the text is clamped
into the text, as the protocol asks of both sides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The protocol's position encodings (``PositionEncodingKind`` values).
UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"
BOM = "\ufeff"
LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class Position:
    """0-based line and character offset in code units, as the protocol sends them."""

    line: int
    character: int


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` without their endings, as the protocol numbers them: a text
    ending with a line break has an empty last line."""
    return LINE_END.split(text)


def split_lines_keeping_ends(text: str) -> list[str]:
    """The lines of ``text`` with their endings; ``"".join`` of them is ``text``. A text
    ending with a line break has no empty last element."""
    lines: list[str] = []
    start = 0
    for match in LINE_END.finditer(text):
        lines.append(text[start:match.end()])
        start = match.end()
    if start < len(text):
        lines.append(text[start:])
    return lines


def code_units(text: str, encoding: str = UTF16) -> int:
    """How many code units of ``encoding`` ``text`` takes (an unknown encoding: UTF-16, the
    protocol's default). Lone surrogates count as one unit each, as a JSON string has them."""
    if encoding == UTF32:
        return len(text)
    if encoding == UTF8:
        return len(text.encode("utf-8", errors="surrogatepass"))
    return len(text.encode("utf-16-le", errors="surrogatepass")) // 2


@dataclass(frozen=True, slots=True)
class DocumentLines:
    lines: tuple[str, ...]
    #: The editor's text starts with a byte-order mark (which spans do not count).
    has_bom: bool
    encoding: str = UTF16

    @staticmethod
    def of(text: str, encoding: str = UTF16) -> DocumentLines:
        return DocumentLines(tuple(split_lines(text)), text.startswith(BOM), encoding)

    def _skip(self, index: int) -> int:
        return 1 if index == 0 and self.has_bom else 0

    def to_client(self, line: int, col: int) -> Position:
        """The protocol position of 1-based ``line`` and character ``col`` of a span."""
        index = line - 1
        if index >= len(self.lines):
            return self.end()
        if index < 0:
            return Position(0, 0)
        text = self.lines[index]
        chars = min(max(col - 1, 0) + self._skip(index), len(text))
        return Position(index, code_units(text[:chars], self.encoding))

    def from_client(self, position: Position) -> tuple[int, int]:
        """The 1-based (line, column) of a span at a protocol position (a position inside a
        character's code units counts as that character)."""
        index = min(max(position.line, 0), len(self.lines) - 1)
        text = self.lines[index]
        units = 0
        chars = 0
        while chars < len(text) and units < position.character:
            units += code_units(text[chars], self.encoding)
            chars += 1
        if units > position.character:  # inside a character's units: that character
            chars -= 1
        return index + 1, max(chars - self._skip(index), 0) + 1

    def end(self) -> Position:
        """The position just past the last character of the text."""
        last = len(self.lines) - 1
        return Position(last, code_units(self.lines[last], self.encoding))

    def char_index(self, position: Position) -> tuple[int, int]:
        """(0-based line, 0-based character index into ``lines[line]``) of a position."""
        line, col = self.from_client(position)
        return line - 1, col - 1 + self._skip(line - 1)
