"""Ranks, coordinates and groups of a mesh, written again from docs/semantics.md §1.

The oracle does not reuse ``ir.mesh``: an error in the project's group arithmetic must show
up as a disagreement, not be shared by both sides. Global ranks are row-major over the mesh
(first axis outermost); the group of a rank over an ordered axis list holds the ranks that
agree with it off those axes, ordered row-major over the axes **in the written order**.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mesh:
    axes: tuple[tuple[str, int], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.axes)

    @property
    def world_size(self) -> int:
        return math.prod(size for _, size in self.axes)

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a global rank (row-major: the last axis varies fastest)."""
        strides = self._strides()
        return {name: rank // strides[name] % size for name, size in self.axes}

    def rank(self, coords: dict[str, int]) -> int:
        strides = self._strides()
        return sum(coords[name] * strides[name] for name in self.names)

    def _strides(self) -> dict[str, int]:
        strides, step = {}, 1
        for name, size in reversed(self.axes):
            strides[name] = step
            step *= size
        return strides

    def group(self, rank: int, axes: Sequence[str]) -> list[int]:
        """The group of ``rank`` over ``axes``, in group order (first axis outermost)."""
        base = self.coords(rank)
        sizes = self.sizes
        members = []
        for values in itertools.product(*(range(sizes[a]) for a in axes)):
            members.append(self.rank({**base, **dict(zip(axes, values, strict=True))}))
        return members

    def groups(self, axes: Sequence[str]) -> list[list[int]]:
        """Every group over ``axes`` (in group order), by smallest member."""
        found: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            members = self.group(rank, axes)
            found.setdefault(tuple(sorted(members)), members)
        return [found[key] for key in sorted(found)]
