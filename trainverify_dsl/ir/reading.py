"""A one-line reading of a confirmed difference, with the values behind it.

A counterexample names the first tensor that differs; this module says *how* it differs, from
the numbers alone: the check that found it is run again on the same evaluated pair with a
comparator that records every rank's value of that tensor (``collect``), and ``read`` tries
the readings below in order, each a numeric fact about the recorded values (tolerance
``TOLERANCE``, relative to the spec's largest entry):

1. the rank holds zeros where the spec does not (the value never reached it);
2. the rank holds the spec's value times a constant ``k`` (named when ``k`` or ``1/k`` is the
   size of a group of mesh axes or the microbatch count: over-counted by that group, or
   divided by it once too often);
3. the rank holds a partial sum: the sum over its group along some mesh axes is the spec's
   value (the plan uses it as complete);
4. the rank holds the piece the layout gives another rank (blocks in another order, a value
   sent to the wrong stage);
5. otherwise: the relative error and the largest differing element.

Every reading shows that element: the spec's value beside the rank's (and its group's, for a
partial sum). Numeric only (numpy); a reading is an explanation of a difference already
confirmed, never evidence for one.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from trainverify_dsl.ir.compare import CHECKS, Comparison, Mismatch, Pair

#: relative tolerance of a reading's numeric facts (float64 round-off of the step)
TOLERANCE = 1e-7


@dataclass(frozen=True)
class Reading:
    """``text``: the one-line reading; ``index``: the element shown; ``spec``: the spec's
    value there; ``ranks``: ``(coordinates, value)`` of the rank (and its group, for a partial
    sum) at that element."""

    text: str
    index: tuple[int, ...]
    spec: float
    ranks: tuple[tuple[str, float], ...]

    def values_line(self) -> str:
        where = f"[{', '.join(map(str, self.index))}]" if self.index else "the value"
        ranks = ", ".join(f"{c}: {v:.6g}" for c, v in self.ranks)
        return f"at {where}: spec {self.spec:.6g}; {ranks}"


class _Recorder:
    """A comparator that records every value of one tensor and calls everything equal (so
    the check runs over every rank)."""

    def __init__(self, tensor: str) -> None:
        self.tensor = tensor
        self.values: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}

    def equal(self, got: Any, want: Any, where: Comparison) -> tuple[bool, float]:
        if where.tensor == self.tensor:
            self.values.setdefault((where.rank, where.detail), (
                np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)))
        return True, 0.0


def collect(pair: Pair, mismatch: Mismatch) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Every rank's ``(value, spec's value)`` of the mismatch's tensor as its check compares
    them (same detail: the same microbatch of a lineage)."""
    check = dict(CHECKS).get(mismatch.check)
    if check is None:
        return {}
    recorder = _Recorder(mismatch.tensor)
    check(dataclasses.replace(pair, comparator=recorder, mismatches=[],
                              lineage_mismatches=[], compared=0, worst=0.0))
    return {rank: v for (rank, detail), v in recorder.values.items()
            if detail == mismatch.detail}


def coords_text(coords: Mapping[str, int]) -> str:
    return ", ".join(f"{a}={k}" for a, k in coords.items())


def read(pair: Pair, mismatch: Mismatch) -> Reading | None:
    """The reading of ``mismatch`` (a numeric difference found on ``pair``); ``None`` for a
    structural finding (no values: a missing gradient, a recipe)."""
    values = collect(pair, mismatch)
    if mismatch.rank not in values:
        return None
    got, want = values[mismatch.rank]
    if got.shape != want.shape or not np.all(np.isfinite(want)):
        return None
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1e-300)
    close = lambda a, b: bool(np.all(np.abs(a - b) <= TOLERANCE * scale))  # noqa: E731
    diff = np.abs(np.nan_to_num(got - want, nan=np.inf))
    index = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), got.shape)) \
        if got.ndim else ()
    who = _who(pair, mismatch.rank)
    summed = _summed_over(pair, mismatch)
    if summed:
        who = f"the sum over the {', '.join(summed)} group of {who} (a partial-sum layout)"
    shown = [(who, float(got[index]))]
    spec = float(want[index])
    text = None
    if close(got, 0.0 * got) and not close(want, 0.0 * want):
        text = f"{who} holds zeros where the spec has values: the value never reached it"
    if text is None:
        text = _factor(pair, got, want, who, close)
    if text is None:
        found = None if summed else _partial(pair, mismatch.rank, values, want, close)
        if found is not None:
            axes, group = found
            text = (f"{who} holds a partial sum over {', '.join(axes)}: the sum over its "
                    f"{', '.join(axes)} group is the spec's value, but the plan uses it as "
                    f"complete (reduce it over {', '.join(axes)} first)")
            shown = [(_who(pair, r), float(values[r][0][index])) for r in group]
    if text is None:
        other = next((r for r, (_, w) in sorted(values.items())
                      if r != mismatch.rank and w.shape == got.shape and close(got, w)
                      and not close(w, want)), None)
        if other is not None:
            text = (f"{who} holds the piece that belongs to {_who(pair, other)}: blocks in "
                    "another order, or a value sent to the wrong place")
    if text is None and not np.any(want):  # no largest entry to be relative to
        text = f"{who} differs from the spec's value, which is zero everywhere (largest " \
               f"difference {float(np.max(diff)):.3g}, absolute)"
    if text is None:
        rel = float(np.max(diff)) / scale
        text = f"{who} differs from the spec's value (largest difference {rel:.3g} of the " \
               f"spec's largest entry)"
    return Reading(text, index, spec, tuple(shown))


def _who(pair: Pair, rank: int) -> str:
    if rank < 0:
        return "the logical value"
    return f"rank {rank} ({coords_text(pair.mesh.coords(rank))})"


def _summed_over(pair: Pair, mismatch: Mismatch) -> tuple[str, ...]:
    """The axes a lineage or claim combines the ranks' pieces over before comparing (its
    layout's partial group), so the value shown is that sum, not the rank's own piece."""
    if mismatch.check == "lineages":
        layouts = [lin.layout for lin in pair.program.lineages if lin.point == mismatch.tensor]
    elif mismatch.check == "claims":
        layouts = [c.layout for c in pair.program.claims if c.target == mismatch.tensor]
    else:
        return ()
    partial = layouts[0].partial if layouts else None
    return tuple(a for a in partial[1] if a in pair.mesh.sizes) if partial else ()


def _axis_sets(pair: Pair) -> list[tuple[str, ...]]:
    """Non-empty sets of mesh axes of size > 1, smallest first."""
    axes = [a for a, n in pair.program.mesh if n > 1]
    return [s for k in range(1, len(axes) + 1) for s in itertools.combinations(axes, k)]


def _factor(pair: Pair, got: np.ndarray, want: np.ndarray, who: str, close: Any) -> str | None:
    norm = float(np.sum(want * want))
    if norm == 0.0:
        return None
    k = float(np.sum(got * want)) / norm
    if not np.isfinite(k) or abs(k - 1.0) < 1e-9 or abs(k) < 1e-12 or not close(got, k * want):
        return None
    ratio = Fraction(k).limit_denominator(4096 if got.size > 1 else 64)
    if abs(float(ratio) - k) > 1e-9 * max(1.0, abs(k)):
        # one number is always some multiple of another: only a simple ratio reads as one
        return f"{who} holds the spec's value times {k:.6g}" if got.size > 1 else None
    text = f"{who} holds {_fraction(ratio)} times the spec's value"
    # (once per what, divided by what)
    counts = [((f"rank of its {', '.join(axes)} group", f"the size of its {', '.join(axes)} "
                "group"), pair.mesh.group_size(axes)) for axes in _axis_sets(pair)]
    if pair.program.microbatches > 1:
        counts.append((("microbatch", "the number of microbatches"),
                       pair.program.microbatches))
    over = [f"once per {per} (size {n})" for (per, _), n in counts if ratio == n]
    under = [f"by {size} ({n})" for (_, size), n in counts if ratio == Fraction(1, n)]
    if over:
        return f"{text}: counted {' or '.join(over)}: summed where an average was meant, " \
               "reduced twice, or a loss not divided by that count"
    if under:
        return f"{text}: divided {' or '.join(under)} once too often (averaged where a sum " \
               "was meant, or scaled twice)"
    return text


def _fraction(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def _partial(pair: Pair, rank: int, values: Mapping[int, tuple[np.ndarray, np.ndarray]],
             want: np.ndarray, close: Any) -> tuple[tuple[str, ...], list[int]] | None:
    if rank < 0:
        return None
    for axes in _axis_sets(pair):
        group = pair.mesh.group(rank, axes)
        if not all(r in values and values[r][0].shape == want.shape for r in group):
            continue
        if close(sum(values[r][0] for r in group), want):
            return axes, group
    return None
