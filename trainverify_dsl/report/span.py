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

# A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``; the parser
# makes a hundred thousand spans for a 10,000-line plan, so ``new_span`` fills the slots with
# their own setters instead, in half the time. The span is the same
# (``tests/test_report_span.py``).
_new_object = object.__new__
(_set_file, _set_line, _set_col, _set_end_line, _set_end_col, _set_start_pos,
 _set_end_pos) = (getattr(Span, name).__set__ for name in (
    "file", "line", "col", "end_line", "end_col", "start_pos", "end_pos"))


def new_span(file: str, line: int, col: int, end_line: int, end_col: int, start_pos: int,
             end_pos: int) -> Span:
    """``Span(file, line, col, end_line, end_col, start_pos, end_pos)``, made faster."""
    span = _new_object(Span)
    _set_file(span, file)
    _set_line(span, line)
    _set_col(span, col)
    _set_end_line(span, end_line)
    _set_end_col(span, end_col)
    _set_start_pos(span, start_pos)
    _set_end_pos(span, end_pos)
    return span
