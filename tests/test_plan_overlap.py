"""Conflicts between overlapping layout patterns: the indexed search against all pairs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainverify_dsl.plan import parse_pattern
from trainverify_dsl.plan.model import (
    GlobSeg,
    IndexSeg,
    Layout,
    NameSeg,
    Origin,
    Partial,
    PatternSegment,
    PlacementKind,
    Replicate,
    Shard,
    SliceSeg,
    TensorPattern,
)
from trainverify_dsl.plan.overlap import find_overlap_conflicts, patterns_may_overlap
from trainverify_dsl.report.span import Span

AXES = ("dp", "tp")


def make_layout(target: TensorPattern | str, line: int,
                stated: dict[str, PlacementKind]) -> Layout:
    """A layout told apart from equal ones by its origin line."""
    pattern = parse_pattern(target) if isinstance(target, str) else target
    placements = tuple((axis, stated.get(axis, Replicate())) for axis in AXES)
    origin = Origin(Span("t.tvp", line, 1, line, 2))
    return Layout(pattern, placements, (), (origin,), None, tuple(stated))


def found_lines(layouts: list[Layout]) -> list[tuple[int, int, str]]:
    return sorted((c.first.origins[0].span.line, c.second.origins[0].span.line, c.axis)
                  for c in find_overlap_conflicts(tuple(layouts)))


def conflicts_of(first: str, second: str, *, same: bool = False) -> list[tuple[int, int, str]]:
    """Conflicts between ``first`` split on dim 0 and ``second`` on dim 1 (or also dim 0)."""
    return found_lines([make_layout(first, 1, {"tp": Shard(0)}),
                        make_layout(second, 2, {"tp": Shard(0 if same else 1)})])


def test_concrete_against_glob() -> None:
    assert conflicts_of("layers.*.wq.weight", "layers.3.wq.weight") == [(1, 2, "tp")]
    assert conflicts_of("layers.3.wq.weight", "layers.*.wq.weight") == [(1, 2, "tp")]
    assert conflicts_of("layers.*.wq.weight", "layers.3.wk.weight") == []
    assert conflicts_of("layers.*.w*", "layers.3.wk") == [(1, 2, "tp")]


def test_concrete_against_slice() -> None:
    assert conflicts_of("layers[0:4].w", "layers.3.w") == [(1, 2, "tp")]
    assert conflicts_of("layers[0:4].w", "layers.4.w") == []
    assert conflicts_of("layers[1::2].w", "layers.1000001.w") == [(1, 2, "tp")]
    assert conflicts_of("layers[-2:].w", "layers.3.w") == []


def test_short_slice_among_many_indices() -> None:
    """A slice with fewer indices than the plan has looks its own indices up."""
    layouts = [make_layout(f"layers.{k}.w", k, {"tp": Shard(1)}) for k in range(8)]
    layouts += [make_layout("layers[2:4].w", 10, {"tp": Shard(0)}),
                make_layout("layers[:7:3].w", 11, {"tp": Shard(0)}),
                make_layout("layers[5:5].w", 12, {"tp": Shard(0)})]
    assert found_lines(layouts) == [(0, 11, "tp"), (2, 10, "tp"), (3, 10, "tp"),
                                    (3, 11, "tp"), (6, 11, "tp")]


def test_slice_against_slice() -> None:
    assert conflicts_of("layers[0:4].w", "layers[3:8].w") == [(1, 2, "tp")]
    assert conflicts_of("layers[0:4].w", "layers[4:8].w") == []
    assert conflicts_of("layers[0::2].w", "layers[1::2].w") == []
    assert conflicts_of("layers[0::2].w", "layers[3::3].w") == [(1, 2, "tp")]


def test_glob_against_slice() -> None:
    assert conflicts_of("layers[0:4].w", "layers.1*.w") == [(1, 2, "tp")]
    assert conflicts_of("layers.1*.w", "layers[2:4].w") == []
    assert conflicts_of("layers.*.w", "layers[5:].w") == [(1, 2, "tp")]


def test_nested_index_positions() -> None:
    concrete = "blocks.2.experts.5.w"
    assert conflicts_of("blocks.2.experts.*.w", concrete) == [(1, 2, "tp")]
    assert conflicts_of("blocks[0:4].experts[4:8].w", concrete) == [(1, 2, "tp")]
    assert conflicts_of("blocks[0:4].experts[6:8].w", concrete) == []
    assert conflicts_of("blocks.3.experts[0:8].w", concrete) == []
    assert conflicts_of("blocks.*.experts[0:8].w", "blocks[1:3].experts.*.w") == [(1, 2, "tp")]


def test_grad_and_non_grad_never_conflict() -> None:
    assert conflicts_of("grad(layers.*.w)", "layers.1.w") == []
    assert conflicts_of("layers[0:4].w", "grad(layers[0:4].w)") == []
    assert conflicts_of("grad(layers.*.w)", "grad(layers.1.w)") == [(1, 2, "tp")]


def test_only_a_common_axis_with_different_placements_conflicts() -> None:
    assert conflicts_of("layers.*.w", "layers.1.w", same=True) == []
    unstated = [make_layout("layers.*.w", 1, {"tp": Shard(0)}),
                make_layout("layers.1.w", 2, {"dp": Shard(1)})]
    assert found_lines(unstated) == []
    partial = [make_layout("layers.*.w", 1, {"dp": Shard(0), "tp": Shard(0)}),
               make_layout("layers.1.w", 2, {"dp": Shard(0), "tp": Partial()})]
    assert found_lines(partial) == [(1, 2, "tp")]


def test_params_default_is_not_compared() -> None:
    assert conflicts_of("params", "w") == []


def test_no_conflict_is_dropped_in_large_plans() -> None:
    """450 globs times 900 layouts were past the old bound of 200,000 compared pairs."""
    layouts = [make_layout(f"layers.*.v{k}", k, {"tp": Shard(0)}) for k in range(450)]
    layouts += [make_layout(f"layers.{k}.u", 450 + k, {"tp": Shard(1)}) for k in range(449)]
    layouts.append(make_layout("layers.7.v449", 899, {"tp": Shard(1)}))
    assert found_lines(layouts) == [(449, 899, "tp")]


# ---------------------------------------------------------------- against all pairs


def naive_conflicts(layouts: list[Layout]) -> list[tuple[int, int, str]]:
    """Every pair with a wildcard, in the same bucket (grad, length), compared directly."""
    compared = [lay for lay in layouts if lay.target.segments != (NameSeg("params"),)]
    found = []
    for i, first in enumerate(compared):
        for second in compared[i + 1:]:
            a, b = first.target, second.target
            if (a.is_concrete and b.is_concrete) or (a.grad, len(a.segments)) != (
                    b.grad, len(b.segments)):
                continue
            axes = [axis for axis in first.stated_axes if axis in second.stated_axes
                    and first.placement(axis) != second.placement(axis)]
            if axes and patterns_may_overlap(a, b):
                found.append((first.origins[0].span.line, second.origins[0].span.line, axes[0]))
    return sorted(found)


#: Few values, so that patterns often meet (and sometimes only almost).
BOUNDS = st.none() | st.integers(-1, 5)
SEGMENTS: st.SearchStrategy[PatternSegment] = st.one_of(
    st.sampled_from([NameSeg("a"), NameSeg("b"), NameSeg("3")]),
    st.builds(IndexSeg, st.integers(0, 4)),
    st.builds(SliceSeg, BOUNDS, BOUNDS, st.none() | st.integers(-1, 3)),
    st.sampled_from([GlobSeg(p) for p in ("*", "*", "a*", "?", "1*", "*b", "[0-3]")]),
)
#: Short patterns, mostly not grad, so that many pairs share a bucket.
PATTERNS = st.builds(TensorPattern, st.lists(SEGMENTS, min_size=1, max_size=2).map(tuple),
                     st.sampled_from([False, False, False, True])) | st.just(
    TensorPattern((NameSeg("params"),)))
PLACEMENTS = st.sampled_from([Shard(0), Shard(1), Replicate(), Partial()])
STATED = st.dictionaries(st.sampled_from(AXES), PLACEMENTS, min_size=1, max_size=2)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(PATTERNS, STATED), min_size=4, max_size=30))
def test_indexed_search_finds_the_pairs_all_pairs_finds(
        items: list[tuple[TensorPattern, dict[str, PlacementKind]]]) -> None:
    layouts = [make_layout(pattern, line, stated) for line, (pattern, stated) in enumerate(items)]
    assert found_lines(layouts) == naive_conflicts(layouts)
