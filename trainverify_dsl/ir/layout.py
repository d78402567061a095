"""Layouts (lineages): which block of the spec tensor a rank holds in the local program.

A tensor dimension is a sequence of **factors**, outermost first; each factor has a global size
and the mesh axes that split it into equal blocks (docs/semantics.md §2.1, axes in block order,
first outermost). A plain dimension is one factor; a reshape that merges dimensions concatenates
their factors, so ``[b, h]`` split over ``dp`` and ``tp`` merges into one ``b*h`` dimension whose
local piece is still exactly described (it is no longer one contiguous block, but its lineage
is). ``@mb`` is the microbatch pseudo-axis: outermost on the batch dimension (Rule 4.1, Megatron's
sampler order).

A factor's blocks are contiguous, or in **zigzag** order (docs/semantics.md §2.6, the
load-balanced layout of context parallelism): the factor is cut into ``2N`` equal chunks and
block ``k`` holds chunks ``k`` and ``2N-1-k``, in that order. Per-position ops are blind to the
order; everything that carves, compares or reshapes pieces reads it from here.

``partial`` is ``(op, axes)`` when the local pieces must be combined with ``op`` over the
group along ``axes`` to give the spec value (§2.2). ``const`` marks values computed from
constants and buffers only (Rule 4.2 positions). ``cause`` is the plan span responsible for
the partial sum, for diagnostics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from trainverify_dsl.report.span import Span

MICROBATCH_AXIS = "@mb"


@dataclass(frozen=True, slots=True)
class Factor:
    size: int
    axes: tuple[str, ...] = ()
    #: made by ``expand`` from size 1: every index holds the same values, so any block of it
    #: is the same as a shorter broadcast (an operand may be cut to fit a split partner)
    broadcast: bool = field(default=False, compare=False)
    #: blocks in zigzag order: block ``k`` of ``N`` holds chunks ``k`` and ``2N-1-k`` of ``2N``
    zigzag: bool = False

    def label(self) -> str:
        """``8``, ``8/cp``, ``8/zigzag(cp)``: the factor as layouts print it."""
        if not self.axes:
            return f"{self.size}"
        axes = ",".join(self.axes)
        return f"{self.size}/zigzag({axes})" if self.zigzag else f"{self.size}/{axes}"


Dim = tuple[Factor, ...]


def broadcast_dim(dim: Dim) -> bool:
    """One factor ``expand`` made from size 1, unsplit: one value repeated, so any block of
    it is a shorter broadcast (an operand may be cut to fit a split partner) and an op
    reading it does not run along it (its gradient sums over the dimension)."""
    return len(dim) == 1 and dim[0].broadcast and not dim[0].axes


class LayoutError(ValueError):
    """A layout that cannot be propagated (the message says why). ``axes``: the mesh axes
    whose splits disagree, when known: the lowering blames the statement that brought them
    into the operands, not the last statement it read."""

    def __init__(self, message: str, axes: tuple[str, ...] = (),
                 operand: int | None = None) -> None:
        super().__init__(message)
        self.axes = axes
        #: the op's argument whose split the others lack, when a rule knows it (a
        #: contraction split on one side only): the statement behind it is blamed
        self.operand = operand


@dataclass(frozen=True, slots=True)
class TLayout:
    dims: tuple[Dim, ...]
    partial: tuple[str, tuple[str, ...]] | None = None
    const: bool = False
    cause: Span | None = None

    # -- construction ---------------------------------------------------------------------

    @staticmethod
    def replicated(shape: Sequence[int], const: bool = False) -> TLayout:
        return TLayout(tuple((Factor(int(n)),) for n in shape), None, const)

    @staticmethod
    def split(shape: Sequence[int], dim_axes: Mapping[int, tuple[str, ...]]) -> TLayout:
        return TLayout(tuple((Factor(int(n), tuple(dim_axes.get(d, ()))),)
                             for d, n in enumerate(shape)))

    def with_partial(self, partial: tuple[str, tuple[str, ...]] | None,
                     cause: Span | None = None) -> TLayout:
        return replace(self, partial=partial, cause=cause if partial else None)

    # -- queries --------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return len(self.dims)

    def global_shape(self) -> tuple[int, ...]:
        return tuple(math.prod(f.size for f in d) for d in self.dims)

    def local_shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(math.prod(f.size // ways(f.axes, sizes) for f in d) for d in self.dims)

    def dim_axes(self, d: int) -> tuple[str, ...]:
        return tuple(a for f in self.dims[d] for a in f.axes)

    def shard_axes(self) -> set[str]:
        return {a for d in self.dims for f in d for a in f.axes}

    def is_sharded(self, d: int) -> bool:
        return any(f.axes for f in self.dims[d])

    def is_zigzag(self, d: int) -> bool:
        """Dimension ``d`` holds blocks in zigzag order (its pieces are not contiguous)."""
        return any(f.zigzag for f in normalize_dim(self.dims[d]))

    def simple_dim(self, d: int) -> bool:
        """The dimension is one block-split factor (possibly after merging unsplit ones)."""
        return len(normalize_dim(self.dims[d])) == 1

    def describe(self) -> str:
        parts = []
        for d in self.dims:
            inner = " x ".join(f.label() for f in normalize_dim(d))
            parts.append(inner or "1")
        text = "[" + ", ".join(parts) + "]"
        if self.partial:
            text += f" partial({self.partial[0]} over {','.join(self.partial[1])})"
        return text


def ways(axes: Sequence[str], sizes: Mapping[str, int]) -> int:
    return math.prod(sizes[a] for a in axes)


def normalize_dim(dim: Dim) -> Dim:
    """Drop size-1 factors and merge an unsplit factor into the factor before it: a block of
    ``n/N`` rows of ``(n, A)`` followed by all ``m`` of ``(m, ())`` is block ``k`` of
    ``(n*m, A)`` (indices ``k*(n*m/N) .. (k+1)*(n*m/N)``), so both describe the same piece."""
    out: list[Factor] = []
    for f in dim:
        if f.size == 1:  # one index: split only over axes of size 1 (Rule 2.1), so unsplit
            continue
        if f.zigzag and not f.axes:  # one block: chunks 0 and 1, in order
            f = Factor(f.size)
        if out and not f.axes:
            # chunk c of a zigzag (n, A) followed by all m: chunk c of (n*m, A), so the order
            # carries over
            out[-1] = Factor(out[-1].size * f.size, out[-1].axes, zigzag=out[-1].zigzag)
        else:
            out.append(f)
    return tuple(out)


def same_dim(a: Dim, b: Dim) -> bool:
    return normalize_dim(a) == normalize_dim(b)


def append_axes(dim: Dim, axes: Sequence[str]) -> Dim:
    """``dim`` further split over ``axes``, innermost (a reduce-scatter's or ZeRO's blocks):
    the axes join the outermost factor."""
    factors = list(normalize_dim(dim)) or [Factor(1)]
    outer = factors[0]
    if outer.zigzag:
        raise LayoutError("the dimension is split in zigzag order: its blocks cannot be cut "
                          "further")
    return (Factor(outer.size, outer.axes + tuple(axes)),) + tuple(factors[1:])


# -- reshape -------------------------------------------------------------------------------


def reshape_dims(dims: Sequence[Dim], shape: Sequence[int],
                 sizes: Mapping[str, int]) -> tuple[Dim, ...]:
    """The factors of a reshape of a tensor with ``dims`` to the global ``shape``."""
    flat = [f for d in dims for f in normalize_dim(d)]
    out: list[Dim] = []
    i = 0

    def mismatch() -> LayoutError:
        # the spec's reshape meets a value of another size: a collective before it (an
        # all-to-all or a gather on the wrong dimension) changed the value's shape
        given = TLayout(tuple(dims))
        total = math.prod(given.global_shape())
        return LayoutError(f"reshape to {tuple(shape)} ({math.prod(int(n) for n in shape)} "
                           f"elements) does not match its input, laid out "
                           f"{given.describe()} ({total} elements): a collective before it "
                           f"changed the value's shape")

    for n in shape:
        need, got = int(n), []
        while need > 1:
            if i >= len(flat):
                raise mismatch()
            f = flat[i]
            if f.size <= need and need % f.size == 0:
                got.append(f)
                need //= f.size
                i += 1
            elif f.size % need == 0:
                # split the factor: the outer part keeps the axes (and the order: zigzag
                # chunks of the outer part are whole rows of the inner one when 2N divides it)
                blocks = ways(f.axes, sizes) * (2 if f.zigzag else 1)
                if f.axes and need % blocks != 0:
                    raise LayoutError(f"reshape splits a dimension of size {f.size} split over "
                                      f"{', '.join(f.axes)} into {need} x {f.size // need}; "
                                      f"{need} is not divisible by {blocks}"
                                      + (" (two zigzag chunks per block)" if f.zigzag else ""))
                got.append(Factor(need, f.axes, zigzag=f.zigzag))
                flat[i] = Factor(f.size // need)
                need = 1
            else:
                raise LayoutError(f"reshape to {tuple(shape)} regroups a split dimension")
        out.append(tuple(got) or (Factor(1),))
    if any(f.size != 1 or f.axes for f in flat[i:]):
        raise mismatch()
    return tuple(out)


# -- boxes and logical values ---------------------------------------------------------------


def factor_index(f: Factor, coords: Mapping[str, int], sizes: Mapping[str, int]) -> int:
    k = 0
    for a in f.axes:
        k = k * sizes[a] + coords[a]
    return k


def local_indices(dim: Dim, coords: Mapping[str, int], sizes: Mapping[str, int]) -> np.ndarray:
    """Global indices (along one dimension) of a rank's local elements, in local order."""
    index = np.zeros(1, dtype=np.int64)
    for f in dim:
        own = block_indices(f, factor_index(f, coords, sizes), ways(f.axes, sizes))
        index = (index[:, None] * f.size + own[None, :]).reshape(-1)
    return index


def block_indices(f: Factor, k: int, n: int) -> np.ndarray:
    """Indices (into the factor) of block ``k`` of ``n``: contiguous, or zigzag chunks ``k``
    and ``2n-1-k`` of ``2n``."""
    block = f.size // n
    if not f.zigzag:
        return k * block + np.arange(block)
    chunk = block // 2
    return np.concatenate([k * chunk + np.arange(chunk), (2 * n - 1 - k) * chunk +
                           np.arange(chunk)])


def take_local(value: np.ndarray, layout: TLayout, coords: Mapping[str, int],
               sizes: Mapping[str, int]) -> np.ndarray:
    """The piece of the global ``value`` a rank with ``coords`` holds under ``layout``
    (ignoring ``partial``)."""
    out = value
    for d, dim in enumerate(layout.dims):
        out = np.take(out, local_indices(dim, coords, sizes), axis=d)
    return out
