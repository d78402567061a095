"""Conflicts between layouts whose *patterns* differ but can select the same tensor.

``split layers.*.wq.weight [tp, -]`` and ``split layers.3.wq.weight [-, tp]`` both lay out
``layers.3.wq.weight``; giving one mesh axis two placements there is a conflict like any
other. Pattern intersection is decided segment by segment and errs towards "no overlap" when
unsure (two different globs), so no false conflict is reported. ``params`` (every parameter)
is a default, not compared. Only pairs with a wildcard (glob or slice) are compared.

Candidate pairs come from an index, not from a scan of all pairs:

* layouts are bucketed by (grad, segment count): only those can meet;
* per segment position, a bucket maps each name or index (by its text), each decimal index
  (by its value) and each glob or slice to the layouts holding it there. What a wildcard's
  segment can meet at a position is a union of those sets: a name or index is one look-up; a
  slice looks up its indices (or scans the indices present, whichever is fewer); a glob
  tests each distinct name present; every segment tests each distinct glob and slice
  present; ``*`` constrains nothing;
* per (mesh axis, placement), the layouts stating it, so the layouts stating a common axis
  with a different placement are a set difference;
* a wildcard's candidates are the intersection of these sets (smallest first), and each is
  then given the exact pairwise test, so the conflicts and their order are those of an
  all-pairs comparison.

There is no bound on the number of pairs, so no conflict is skipped: the work is one segment
test per pair of distinct globs or slices at a position (a range check first for two slices),
one set intersection per wildcard layout, and one exact test per candidate; a candidate
already meets position by position and has a conflicting axis, so the exact tests are about as
many as the conflicts reported. Slice against slice or glob still enumerates at most
``MAX_ENUMERATED`` indices (``_first``), as before.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from trainverify_dsl.plan import messages
from trainverify_dsl.plan.model import (
    GlobSeg,
    IndexSeg,
    Layout,
    Mesh,
    NameSeg,
    Partial,
    PatternSegment,
    PlacementKind,
    Shard,
    SliceSeg,
    TensorPattern,
)
from trainverify_dsl.report import codes_plan as codes
from trainverify_dsl.report.diagnostics import Diagnostic

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
    found: list[OverlapConflict] = []
    for bucket in _buckets(layouts).values():
        index = _index_bucket(bucket)
        for i, j in _candidate_pairs(bucket, index):
            found += _conflicts(bucket[min(i, j)], bucket[max(i, j)])
    return found


def _buckets(layouts: tuple[Layout, ...]) -> dict[tuple[bool, int], list[Layout]]:
    buckets: dict[tuple[bool, int], list[Layout]] = defaultdict(list)
    for layout in layouts:
        if layout.target.segments != (NameSeg("params"),):
            buckets[(layout.target.grad, len(layout.target.segments))].append(layout)
    return buckets


@dataclass(frozen=True, slots=True)
class _BucketIndex:
    """Positions in one bucket, by what they hold. Per segment position: ``by_text`` maps a
    name or index (as text) to the layouts holding it there, ``digits`` the decimal ones by
    value, ``wild`` each glob and slice. ``placed`` maps (axis, placement) to the layouts
    stating that axis with that placement, ``stating`` an axis to those stating it at all.
    The two caches memoise ``_meeting`` and ``_axis_rivals`` (few distinct keys)."""

    by_text: tuple[dict[str, set[int]], ...]
    digits: tuple[dict[int, set[int]], ...]
    wild: tuple[dict[PatternSegment, set[int]], ...]
    stating: dict[str, set[int]]
    placed: dict[tuple[str, PlacementKind], set[int]]
    meeting_cache: dict[tuple[int, PatternSegment], frozenset[int]]
    rivals_cache: dict[tuple[tuple[str, PlacementKind], ...], frozenset[int]]


def _index_bucket(bucket: list[Layout]) -> _BucketIndex:
    width = len(bucket[0].target.segments)
    index = _BucketIndex(tuple({} for _ in range(width)), tuple({} for _ in range(width)),
                         tuple({} for _ in range(width)), {}, {}, {}, {})
    for number, layout in enumerate(bucket):
        for position, seg in enumerate(layout.target.segments):
            _index_segment(index, position, seg, number)
        for axis in layout.stated_axes:
            index.stating.setdefault(axis, set()).add(number)
            index.placed.setdefault((axis, layout.placement(axis)), set()).add(number)
    return index


def _index_segment(index: _BucketIndex, position: int, seg: PatternSegment, number: int) -> None:
    if isinstance(seg, NameSeg | IndexSeg):
        text = seg.name if isinstance(seg, NameSeg) else str(seg.index)
        _member(index.by_text[position], text, number)
        if text.isdecimal():
            _member(index.digits[position], int(text), number)
    else:
        _member(index.wild[position], seg, number)


def _member(table: dict[Any, set[int]], key: Any, number: int) -> None:
    """Add ``number`` to ``table[key]`` (a set made on first use)."""
    members = table.get(key)
    if members is None:
        table[key] = {number}
    else:
        members.add(number)


def _candidate_pairs(bucket: list[Layout], index: _BucketIndex) -> list[tuple[int, int]]:
    """The pairs (wildcard, other) to test, in the order of an all-pairs scan: wildcards in
    bucket order, each with its candidates in bucket order, a pair of wildcards once."""
    wild = [i for i, layout in enumerate(bucket) if not layout.target.is_concrete]
    is_wild = set(wild)
    pairs: list[tuple[int, int]] = []
    for i in wild:
        pairs += [(i, j) for j in sorted(_candidates(bucket[i], index))
                  if j != i and not (j in is_wild and j < i)]
    return pairs


def _candidates(layout: Layout, index: _BucketIndex) -> frozenset[int]:
    """Layouts that can meet ``layout`` at every position and state a common axis with a
    different placement (a superset of its conflicts; the caller applies the exact test)."""
    sets = [_axis_rivals(layout, index)]
    for position, seg in enumerate(layout.target.segments):
        if seg != GlobSeg("*"):
            sets.append(_meeting(position, seg, index))
    sets.sort(key=len)
    return sets[0].intersection(*sets[1:])


def _axis_rivals(layout: Layout, index: _BucketIndex) -> frozenset[int]:
    key = tuple((axis, layout.placement(axis)) for axis in layout.stated_axes)
    if key not in index.rivals_cache:
        rivals: set[int] = set()
        for axis, placement in key:
            rivals |= index.stating[axis] - index.placed[(axis, placement)]
        index.rivals_cache[key] = frozenset(rivals)
    return index.rivals_cache[key]


def _meeting(position: int, seg: PatternSegment, index: _BucketIndex) -> frozenset[int]:
    """Layouts whose segment at ``position`` can meet ``seg`` (by ``_segments_meet``)."""
    key = (position, seg)
    if key not in index.meeting_cache:
        found: set[int] = set()
        for other, members in index.wild[position].items():
            if _wild_meets(seg, other):
                found |= members
        index.meeting_cache[key] = frozenset(found | _meeting_concrete(position, seg, index))
    return index.meeting_cache[key]


def _wild_meets(seg: PatternSegment, wild: PatternSegment) -> bool:
    """``_segments_meet`` either way round; two slices whose ranges are apart (or that run
    backwards) never meet, which is quick to see and the common case between many slices."""
    if isinstance(seg, SliceSeg) and isinstance(wild, SliceSeg) and not _ranges_touch(seg, wild):
        return False
    return _segments_meet(seg, wild) or _segments_meet(wild, seg)


def _ranges_touch(a: SliceSeg, b: SliceSeg) -> bool:
    """Whether two forward slices' ranges share an integer (necessary for meeting)."""
    if not (_forward(a) and _forward(b)):
        return False
    stops = [stop for stop in (a.stop, b.stop) if stop is not None]
    return not stops or max(a.start or 0, b.start or 0) < min(stops)


def _meeting_concrete(position: int, seg: PatternSegment, index: _BucketIndex) -> set[int]:
    """Layouts with a name or index at ``position`` that ``seg`` meets."""
    texts, digits = index.by_text[position], index.digits[position]
    found: set[int] = set()
    match seg:
        case NameSeg(name) | IndexSeg(index=name):
            found |= texts.get(str(name), set())
        case GlobSeg(pattern):
            for text, members in texts.items():
                if fnmatchcase(text, pattern):
                    found |= members
        case SliceSeg():
            for value in _slice_hits(seg, digits):
                found |= digits[value]
    return found


def _slice_hits(s: SliceSeg, digits: dict[int, set[int]]) -> list[int]:
    """The indices among ``digits`` that ``s`` contains: its own indices looked up when they
    are fewer, else the present ones tested."""
    values: range | dict[int, set[int]] = digits
    if _forward(s) and s.stop is not None:
        own = range(s.start or 0, s.stop, s.step or 1)
        values = own if len(own) <= len(digits) else digits
    return [value for value in values if value in digits and s.contains(value) is True]


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
