"""Source spans: where in which file a construct stands (1-based lines and columns)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    """A half-open source range. Lines and columns are 1-based; ``end_col`` is exclusive.

    ``file`` is the path as the user gave it (or ``<string>``), so diagnostics print the
    same path the user typed.
    """

    file: str
    line: int
    col: int
    end_line: int
    end_col: int
    #: Character offsets into the file text (``end_pos`` exclusive); -1 when unknown.
    start_pos: int = -1
    end_pos: int = -1

    @staticmethod
    def point(file: str, line: int, col: int) -> Span:
        return Span(file, line, col, line, col + 1)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


#: Span for constructs synthesised by the tool itself (no user source).
NO_SPAN = Span("<generated>", 1, 1, 1, 1)
