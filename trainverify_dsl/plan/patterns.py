"""AST paths to resolved ``TensorPattern``s."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache

from trainverify_dsl.parse import ast
from trainverify_dsl.plan.model import (
    GlobSeg,
    IndexSeg,
    NameSeg,
    PatternSegment,
    SliceSeg,
    TensorPattern,
)
from trainverify_dsl.report.span import Span


def _segment(seg: ast.Segment) -> PatternSegment:
    match seg:
        case ast.Name(name=name):
            return NameSeg(name)
        case ast.Index(index=index):
            return IndexSeg(index)
        case ast.Slice(start=start, stop=stop, step=step):
            return SliceSeg(start, stop, step)
        case ast.Glob(pattern=pattern):
            return GlobSeg(pattern)
    raise AssertionError(f"unknown path segment {seg!r}")


#: Names and indices are values: the same name is one ``NameSeg`` (a plan repeats a few dozen
#: names and indices tens of thousands of times).
_name_segment = lru_cache(maxsize=4096)(NameSeg)
_index_segment = lru_cache(maxsize=4096)(IndexSeg)


def _segments(segments: tuple[ast.Segment, ...]) -> tuple[PatternSegment, ...]:
    """``_segment`` of each, names and indices (nearly all of them) without the ``match``."""
    result: list[PatternSegment] = []
    for seg in segments:
        if isinstance(seg, ast.Name):
            result.append(_name_segment(seg.name))
        elif isinstance(seg, ast.Index):
            result.append(_index_segment(seg.index))
        else:
            result.append(_segment(seg))
    return tuple(result)


def pattern_of(node: ast.Path | ast.GradRef) -> TensorPattern:
    """The resolved pattern of an (already substituted) path or ``grad(path)``."""
    if isinstance(node, ast.GradRef):
        return TensorPattern(_segments(node.path.segments), grad=True)
    return TensorPattern(_segments(node.segments))


#: The largest index a path may name: a module list is a Python sequence, so nothing past
#: ``sys.maxsize`` can exist, and bounds beyond it break ``range``/``len`` downstream.
MAX_INDEX = sys.maxsize


@dataclass(frozen=True, slots=True)
class BadSegment:
    """A path segment that selects nothing sensible, with why and how to fix it."""

    span: Span
    message: str
    help: str


def invalid_segment(node: ast.Path | ast.GradRef) -> BadSegment | None:
    """The first segment that is a ``[a:b:0]`` slice (it selects nothing) or names an
    index beyond ``MAX_INDEX``, if any."""
    path = node.path if isinstance(node, ast.GradRef) else node
    for seg in path.segments:
        if isinstance(seg, ast.Name) or (isinstance(seg, ast.Index)
                                         and abs(seg.index) <= MAX_INDEX):
            continue  # nearly every segment
        if isinstance(seg, ast.Slice) and seg.step == 0:
            return BadSegment(seg.span, "slice step cannot be zero",
                              "use a positive step such as [0:8:2]")
        bounds = (seg.index,) if isinstance(seg, ast.Index) else (
            (seg.start, seg.stop, seg.step) if isinstance(seg, ast.Slice) else ())
        too_large = next((b for b in bounds if b is not None and abs(b) > MAX_INDEX), None)
        if too_large is not None:
            return BadSegment(seg.span, f"index {too_large} is out of range (a module list "
                                        f"index must be at most {MAX_INDEX} in magnitude)",
                              "use the index of an existing layer, or omit the bound")
    return None
