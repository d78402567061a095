"""MeshGroups follows docs/semantics.md §1: row-major ranks, groups ordered by the written axes."""

from __future__ import annotations

import pytest

from trainverify_dsl.ir.mesh import MeshGroups

MESH = MeshGroups((("pp", 2), ("dp", 2), ("tp", 2)))


def test_rank_table() -> None:
    """The §1 table: rank = pp*4 + dp*2 + tp."""
    table = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0),
             (1, 1, 1)]
    for rank, (pp, dp, tp) in enumerate(table):
        assert MESH.coords(rank) == {"pp": pp, "dp": dp, "tp": tp}
        assert MESH.rank_of({"pp": pp, "dp": dp, "tp": tp}) == rank
    assert MESH.world_size == 8


@pytest.mark.parametrize(("axes", "members"), [
    (("tp",), [4, 5]),
    (("dp",), [5, 7]),
    (("dp", "tp"), [4, 5, 6, 7]),
    (("tp", "dp"), [4, 6, 5, 7]),
    (("pp",), [1, 5]),
])
def test_groups_of_rank_5(axes: tuple[str, ...], members: list[int]) -> None:
    """The §1 group table for rank 5 = (1, 0, 1), in group order."""
    assert MESH.group(5, axes) == members
    assert MESH.group_index(5, axes) == members.index(5)
    for k, r in enumerate(members):  # every member sees the same group, at its own index
        assert MESH.group(r, axes) == members
        assert MESH.group_index(r, axes) == k


def test_groups_partition_the_world() -> None:
    for axes in [("tp",), ("dp",), ("pp",), ("dp", "tp"), ("tp", "dp"), ("pp", "dp", "tp"),
                 ("tp", "pp")]:
        groups = MESH.groups(axes)
        assert sorted(r for g in groups for r in g) == list(range(8))
        assert all(len(g) == MESH.group_size(axes) for g in groups)
    assert MESH.groups(("tp", "dp")) == [[0, 2, 1, 3], [4, 6, 5, 7]]
    assert MESH.groups(("pp", "dp", "tp")) == [list(range(8))]
    assert MESH.groups(()) == [[r] for r in range(8)]


def test_group_index_is_row_major_in_written_order() -> None:
    # rank 6 = (1, 1, 0): over (tp, pp) its index is tp*2 + pp = 1
    assert MESH.group_index(6, ("tp", "pp")) == 1
    assert MESH.group_index(6, ("pp", "tp")) == 2


@pytest.mark.parametrize("bad", [
    lambda: MESH.coords(8),
    lambda: MESH.group(0, ("ep",)),
    lambda: MESH.group(0, ("tp", "tp")),
    lambda: MESH.rank_of({"pp": 2, "dp": 0, "tp": 0}),
    lambda: MeshGroups((("dp", 2), ("dp", 2))),
    lambda: MeshGroups((("dp", 0),)),
])
def test_errors(bad) -> None:
    with pytest.raises(ValueError):
        bad()
