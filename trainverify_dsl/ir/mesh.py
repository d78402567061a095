"""Mesh coordinates, global ranks and collective groups (docs/semantics.md §1).

A mesh is a tuple of ``(axis, size)`` pairs, outermost axis first. Global ranks are row-major
over the mesh coordinates. The group of rank ``r`` over an ordered axis list ``A`` is every rank
that agrees with ``r`` on all axes not in ``A``; inside the group, members are ordered
row-major over ``A`` **in the written order** (first axis outermost), so ``("tp", "dp")`` and
``("dp", "tp")`` name the same set of ranks in different orders.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Mesh = tuple[tuple[str, int], ...]


class MeshGroups:
    """Rank <-> coordinate arithmetic and the groups of a device mesh."""

    def __init__(self, mesh: Sequence[tuple[str, int]]) -> None:
        self.mesh: Mesh = tuple((str(axis), int(size)) for axis, size in mesh)
        names = [axis for axis, _ in self.mesh]
        if len(set(names)) != len(names):
            raise ValueError(f"mesh axis repeated in {names}")
        if any(size < 1 for _, size in self.mesh):
            raise ValueError(f"mesh axis sizes must be positive: {self.mesh}")
        self.sizes: dict[str, int] = dict(self.mesh)
        self.axes: tuple[str, ...] = tuple(names)
        self.world_size: int = math.prod(self.sizes.values())

    def __repr__(self) -> str:
        return f"MeshGroups({self.mesh!r})"

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for a mesh of {self.world_size} ranks")

    def _check_axes(self, axes: Sequence[str]) -> tuple[str, ...]:
        axes = tuple(axes)
        unknown = [a for a in axes if a not in self.sizes]
        if unknown:
            raise ValueError(f"unknown mesh axes {unknown} (mesh has {list(self.axes)})")
        if len(set(axes)) != len(axes):
            raise ValueError(f"axis repeated in {list(axes)}")
        return axes

    def coords(self, rank: int) -> dict[str, int]:
        """The mesh coordinates of a global rank, in mesh order."""
        self._check_rank(rank)
        out: dict[str, int] = {}
        for axis, size in reversed(self.mesh):
            out[axis] = rank % size
            rank //= size
        return {axis: out[axis] for axis in self.axes}

    def rank_of(self, coords: dict[str, int]) -> int:
        """The global rank of full mesh coordinates (row-major, first axis outermost)."""
        rank = 0
        for axis, size in self.mesh:
            c = coords[axis]
            if not 0 <= c < size:
                raise ValueError(f"coordinate {axis}={c} out of range (size {size})")
            rank = rank * size + c
        return rank

    def group_index(self, rank: int, axes: Sequence[str]) -> int:
        """The index of ``rank`` inside its group over ``axes`` (row-major in written order)."""
        axes = self._check_axes(axes)
        coords = self.coords(rank)
        index = 0
        for axis in axes:
            index = index * self.sizes[axis] + coords[axis]
        return index

    def group_size(self, axes: Sequence[str]) -> int:
        """The number of ranks in every group over ``axes``."""
        return math.prod(self.sizes[a] for a in self._check_axes(axes))

    def group(self, rank: int, axes: Sequence[str]) -> list[int]:
        """The group of ``rank`` over ``axes``, in group order."""
        axes = self._check_axes(axes)
        base = self.coords(rank)
        members = [0] * self.group_size(axes)
        for k in range(len(members)):
            coords = dict(base)
            rest = k
            for axis in reversed(axes):
                coords[axis] = rest % self.sizes[axis]
                rest //= self.sizes[axis]
            members[k] = self.rank_of(coords)
        return members

    def groups(self, axes: Sequence[str]) -> list[list[int]]:
        """Every distinct group over ``axes``, each in group order, by smallest member."""
        seen: set[int] = set()
        out: list[list[int]] = []
        for rank in range(self.world_size):
            if rank not in seen:
                members = self.group(rank, axes)
                seen.update(members)
                out.append(members)
        return out
