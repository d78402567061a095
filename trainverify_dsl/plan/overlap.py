"""Conflicts between layouts whose *patterns* differ but can select the same tensor.

``split layers.*.wq.weight [tp, -]`` and ``split layers.3.wq.weight [-, tp]`` both lay out
``layers.3.wq.weight``; giving one mesh axis two placements there is a conflict like any
other. Pattern intersection is decided segment by segment and errs towards "no overlap" when
unsure (two different globs), so no false conflict is reported. ``params`` (every parameter)
is a default, not compared. Work is bounded: only pairs with a wildcard are compared, at most
``MAX_PAIRS`` of them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fnmatch import fnmatchcase

from trainverify_dsl.plan import messages
from trainverify_dsl.plan.model import (
    GlobSeg,
    IndexSeg,
    Layout,
    Mesh,
    NameSeg,
    Partial,
    PatternSegment,
    Shard,
    SliceSeg,
    TensorPattern,
)
from trainverify_dsl.report import codes_plan as codes
from trainverify_dsl.report.diagnostics import Diagnostic

MAX_PAIRS = 200_000
#: Slices are compared by enumerating at most this many indices.
MAX_ENUMERATED = 10_000


@dataclass(frozen=True, slots=True)
class OverlapConflict:
    first: Layout
    second: Layout
    axis: str

    def diagnostic(self, mesh: Mesh) -> Diagnostic:
        a, b = self.first.placement(self.axis), self.second.placement(self.axis)
        code = (codes.SPLIT_AND_PARTIAL if {type(a), type(b)} == {Shard, Partial}
                else codes.CONFLICTING_LAYOUT)
        what = ("are both split and partial over mesh axis " f"'{self.axis}'"
                if code is codes.SPLIT_AND_PARTIAL else "have conflicting layouts")
        return messages.conflict(
            code, f"tensors matching both '{self.first.target}' and '{self.second.target}' "
                  f"{what}",
            self.first.origins[0], self.second.origins[0],
            [f"on {mesh.describe()}",
             f"mesh axis '{self.axis}' (of size {mesh.size(self.axis)}) is {a} for "
             f"'{self.first.target}' but {b} for '{self.second.target}'"],
            "narrow one of the patterns, or give both the same placement")


def find_overlap_conflicts(layouts: tuple[Layout, ...]) -> list[OverlapConflict]:
    buckets: dict[tuple[bool, int], list[Layout]] = defaultdict(list)
    for layout in layouts:
        if layout.target.segments != (NameSeg("params"),):
            buckets[(layout.target.grad, len(layout.target.segments))].append(layout)
    found: list[OverlapConflict] = []
    budget = MAX_PAIRS
    for bucket in buckets.values():
        wild = {i for i, lay in enumerate(bucket) if not lay.target.is_concrete}
        for i in sorted(wild):
            for j in range(len(bucket)):
                if j == i or (j in wild and j < i):
                    continue
                budget -= 1
                if budget < 0:
                    return found
                found += _conflicts(bucket[min(i, j)], bucket[max(i, j)])
    return found


def _conflicts(first: Layout, second: Layout) -> list[OverlapConflict]:
    shared = [a for a in first.stated_axes if a in second.stated_axes
              and first.placement(a) != second.placement(a)]
    if not shared or not patterns_may_overlap(first.target, second.target):
        return []
    return [OverlapConflict(first, second, shared[0])]


def patterns_may_overlap(a: TensorPattern, b: TensorPattern) -> bool:
    """Whether some concrete path can match both (``False`` when unsure between globs)."""
    if a.grad != b.grad or len(a.segments) != len(b.segments):
        return False
    return all(_segments_meet(x, y) for x, y in zip(a.segments, b.segments, strict=True))


def _segments_meet(x: PatternSegment, y: PatternSegment) -> bool:
    if isinstance(y, NameSeg | IndexSeg) and not isinstance(x, NameSeg | IndexSeg):
        x, y = y, x
    match x:
        case NameSeg(name) | IndexSeg(index=name):
            return _concrete_meets(str(name), y)
        case SliceSeg():
            return _slice_meets(x, y)
        case GlobSeg(pattern):
            if isinstance(y, SliceSeg):
                return _slice_meets(y, x)
            return "*" in (pattern, y.pattern) or fnmatchcase(pattern, y.pattern) or fnmatchcase(
                y.pattern, pattern)
    return False


def _concrete_meets(text: str, y: PatternSegment) -> bool:
    match y:
        case NameSeg(name) | IndexSeg(index=name):
            return text == str(name)
        case GlobSeg(pattern):
            return fnmatchcase(text, pattern)
        case SliceSeg():
            return text.isdigit() and y.contains(int(text)) is True
    return False


def _slice_meets(s: SliceSeg, y: PatternSegment) -> bool:
    """Slices with negative bounds or steps need the list length: treated as not meeting."""
    if not _forward(s) or (isinstance(y, SliceSeg) and not _forward(y)):
        return False
    if isinstance(y, GlobSeg):
        if y.pattern == "*":
            return True
        return any(fnmatchcase(str(i), y.pattern) for i in _first(s, s.start or 0))
    if isinstance(y, SliceSeg):
        # Both are arithmetic progressions: if they meet, they meet within one common period
        # after the later start.
        start = max(s.start or 0, y.start or 0)
        period = (s.step or 1) * (y.step or 1)
        return any(y.contains(i) is True for i in _first(s, start, period))
    return False


def _forward(s: SliceSeg) -> bool:
    return all(b is None or b >= 0 for b in (s.start, s.stop)) and (s.step or 1) > 0


def _first(s: SliceSeg, start: int, count: int = MAX_ENUMERATED) -> list[int]:
    """Indices of ``s`` from ``start`` on, at most ``count`` (and ``MAX_ENUMERATED``) of them
    (computed, not enumerated, so huge bounds cost nothing)."""
    step, first = s.step or 1, s.start or 0
    begin = first + max(0, -(-(start - first) // step)) * step
    stop = s.stop if s.stop is not None else begin + step * MAX_ENUMERATED
    return list(range(begin, stop, step)[: min(count, MAX_ENUMERATED)])
