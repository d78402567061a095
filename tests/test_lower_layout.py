"""``trainverify_dsl.ir.layout`` against numpy: block distribution (docs/semantics.md §2.1),
the factor description of reshaped dimensions, and ``normalize_dim``.

The oracle for a rank's piece is written here from the semantics, independently of
``local_indices``: block ``k_A(c)`` (row-major over the axes in written order) of ``N_d`` equal
blocks per dimension. Property tests draw random meshes, shapes and axis orders with hypothesis.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from trainverify_dsl.ir.layout import (
    MICROBATCH_AXIS,
    Factor,
    LayoutError,
    TLayout,
    local_indices,
    normalize_dim,
    reshape_dims,
    same_dim,
    take_local,
)

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


# -- helpers ----------------------------------------------------------------------------------


def all_coords(sizes: dict[str, int]):
    """Every rank's coordinates of a mesh (row-major, first axis outermost)."""
    names = list(sizes)
    for values in itertools.product(*(range(sizes[a]) for a in names)):
        yield dict(zip(names, values, strict=True))


def group_index(axes: tuple[str, ...], coords: dict[str, int], sizes: dict[str, int]) -> int:
    """``k_A(c)`` of docs/semantics.md §1: row-major over ``axes`` in written order."""
    k = 0
    for a in axes:
        k = k * sizes[a] + coords[a]
    return k


def oracle_piece(x: np.ndarray, dim_axes: dict[int, tuple[str, ...]], coords: dict[str, int],
                 sizes: dict[str, int]) -> np.ndarray:
    """``x[box(r)]`` of §2.1, written from the formula."""
    index = []
    for d, n in enumerate(x.shape):
        axes = dim_axes.get(d, ())
        ways = math.prod(sizes[a] for a in axes)
        k = group_index(axes, coords, sizes)
        index.append(slice(k * n // ways, (k + 1) * n // ways))
    return x[tuple(index)]


@st.composite
def meshes_and_splits(draw, max_axes: int = 3, max_rank: int = 3):
    """A mesh (axis -> size), a tensor shape and, per dimension, the axes splitting it (each
    axis used at most once, in a random order)."""
    n_axes = draw(st.integers(1, max_axes))
    names = ["dp", "tp", "ep", "cp"][:n_axes]
    sizes = {a: draw(st.integers(1, 3)) for a in names}
    rank = draw(st.integers(1, max_rank))
    owner = {a: draw(st.integers(-1, rank - 1)) for a in names}  # -1: replicated
    order = draw(st.permutations(names))
    dim_axes = {d: tuple(a for a in order if owner[a] == d) for d in range(rank)}
    shape = tuple(math.prod(sizes[a] for a in dim_axes[d]) * draw(st.integers(1, 3))
                  for d in range(rank))
    # a size-1 dimension "split" over size-1 axes is covered by its own tests below
    shape = tuple(2 if n == 1 and dim_axes[d] else n for d, n in enumerate(shape))
    return sizes, shape, {d: axes for d, axes in dim_axes.items() if axes}


# -- block distribution ---------------------------------------------------------------------


def test_semantics_example_dp_ep_block_order() -> None:
    """§2.1: mesh dp=2, ep=2, ``split tokens [(dp, ep), -]``, B = 8."""
    sizes = {"dp": 2, "ep": 2}
    x = np.arange(8 * 3).reshape(8, 3)
    dp_ep = TLayout.split((8, 3), {0: ("dp", "ep")})
    ep_dp = TLayout.split((8, 3), {0: ("ep", "dp")})

    def rows(lay: TLayout, dp: int, ep: int) -> np.ndarray:
        return take_local(x, lay, {"dp": dp, "ep": ep}, sizes)[:, 0] // 3

    assert rows(dp_ep, 1, 0).tolist() == [4, 5]  # rank 2: block 1*2 + 0 = 2
    assert rows(dp_ep, 0, 1).tolist() == [2, 3]  # rank 1: block 1
    assert rows(ep_dp, 0, 1).tolist() == [4, 5]  # under (ep, dp) rank 1 has block 2
    assert rows(ep_dp, 1, 0).tolist() == [2, 3]
    assert dp_ep.local_shape(sizes) == (2, 3)
    assert dp_ep.describe() == "[8/dp,ep, 3]"


def test_take_local_of_a_replicated_layout_is_the_whole_tensor() -> None:
    x = np.random.default_rng(0).normal(size=(3, 4))
    lay = TLayout.replicated(x.shape)
    sizes = {"dp": 2}
    for coords in all_coords(sizes):
        np.testing.assert_array_equal(take_local(x, lay, coords, sizes), x)
    assert lay.shard_axes() == set() and not lay.is_sharded(0)


def test_take_local_matches_a_torch_chunk() -> None:
    """``split [-, tp]`` with tp=4 is ``torch.chunk(x, 4, dim=1)[tp]``."""
    x = torch.arange(2 * 12, dtype=torch.float64).reshape(2, 12)
    lay = TLayout.split((2, 12), {1: ("tp",)})
    sizes = {"tp": 4}
    for t in range(4):
        got = take_local(x.numpy(), lay, {"tp": t}, sizes)
        np.testing.assert_array_equal(got, torch.chunk(x, 4, dim=1)[t].numpy())


@SETTINGS
@given(meshes_and_splits())
def test_take_local_tiles_the_tensor_once_per_replica(case) -> None:
    sizes, shape, dim_axes = case
    lay = TLayout.split(shape, dim_axes)
    x = np.arange(math.prod(shape)).reshape(shape)
    used = {a for axes in dim_axes.values() for a in axes}
    replicas = math.prod(n for a, n in sizes.items() if a not in used)
    count = np.zeros(x.size, dtype=np.int64)
    for coords in all_coords(sizes):
        piece = take_local(x, lay, coords, sizes)
        assert piece.shape == lay.local_shape(sizes)
        np.testing.assert_array_equal(piece, oracle_piece(x, dim_axes, coords, sizes))
        np.add.at(count, piece.reshape(-1), 1)
    assert (count == replicas).all()
    # within one replica (fixed coordinates on the unused axes) every element exactly once
    fixed = {a: 0 for a in sizes if a not in used}
    seen = np.zeros(x.size, dtype=np.int64)
    for coords in all_coords(sizes):
        if all(coords[a] == v for a, v in fixed.items()):
            np.add.at(seen, take_local(x, lay, coords, sizes).reshape(-1), 1)
    assert (seen == 1).all()


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3))
def test_two_axes_on_one_dimension_written_order(n_a: int, n_b: int, block: int) -> None:
    """``[(a, b)]`` and ``[(b, a)]``: both tile the dimension; rank (a, b) has block
    ``a*|b| + b`` under the first and ``b*|a| + a`` under the second."""
    sizes = {"a": n_a, "b": n_b}
    n = n_a * n_b * block
    x = np.arange(n)
    ab = TLayout.split((n,), {0: ("a", "b")})
    ba = TLayout.split((n,), {0: ("b", "a")})
    for coords in all_coords(sizes):
        k_ab = coords["a"] * n_b + coords["b"]
        k_ba = coords["b"] * n_a + coords["a"]
        assert take_local(x, ab, coords, sizes).tolist() == list(range(k_ab * block,
                                                                        (k_ab + 1) * block))
        assert take_local(x, ba, coords, sizes).tolist() == list(range(k_ba * block,
                                                                        (k_ba + 1) * block))


def test_microbatch_axis_is_innermost_on_the_batch() -> None:
    """Rule 4.1: B = 8, ``split x [dp, -]``, dp = 2, microbatches 2 -> rows (0,1) (2,3) (4,5)
    (6,7) for (dp, mb) = (0,0) (0,1) (1,0) (1,1)."""
    sizes = {"dp": 2, MICROBATCH_AXIS: 2}
    lay = TLayout.split((8, 1), {0: ("dp", MICROBATCH_AXIS)})
    x = np.arange(8).reshape(8, 1)
    rows = {(dp, mb): take_local(x, lay, {"dp": dp, MICROBATCH_AXIS: mb}, sizes)[:, 0].tolist()
            for dp in range(2) for mb in range(2)}
    assert rows == {(0, 0): [0, 1], (0, 1): [2, 3], (1, 0): [4, 5], (1, 1): [6, 7]}


# -- reshape ------------------------------------------------------------------------------------


def test_merge_batch_and_heads_then_split_back() -> None:
    """``[b/dp, h/tp] -> [b*h]`` keeps both factors; splitting back restores the layout; the
    merged dimension's local piece is the non-contiguous set the factors describe."""
    sizes = {"dp": 2, "tp": 3}
    dims = ((Factor(4, ("dp",)),), (Factor(6, ("tp",)),))
    merged = reshape_dims(dims, (24,), sizes)
    assert merged == ((Factor(4, ("dp",)), Factor(6, ("tp",))),)
    assert TLayout(merged).local_shape(sizes) == (4,)
    assert reshape_dims(merged, (4, 6), sizes) == dims
    x = np.arange(24).reshape(4, 6)
    for coords in all_coords(sizes):
        piece = take_local(x, TLayout(dims), coords, sizes)
        flat = take_local(x.reshape(24), TLayout(merged), coords, sizes)
        np.testing.assert_array_equal(flat, piece.reshape(-1))
    # rank (dp=1, tp=2): rows 2, 3 and columns 4, 5 -> flat 16, 17, 22, 23
    assert local_indices(merged[0], {"dp": 1, "tp": 2}, sizes).tolist() == [16, 17, 22, 23]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_a_split_dimension_into_heads(tp: int) -> None:
    """``64/tp -> (4/tp, 16)``: the heads keep the split, the head dimension is whole."""
    sizes = {"tp": tp}
    dims = reshape_dims(((Factor(64, ("tp",)),),), (4, 16), sizes)
    assert dims == ((Factor(4, ("tp",)),), (Factor(16),))
    assert TLayout(dims).local_shape(sizes) == (4 // tp, 16)
    back = reshape_dims(dims, (64,), sizes)
    assert same_dim(back[0], (Factor(64, ("tp",)),))


def test_split_a_split_dimension_not_divisible_is_an_error() -> None:
    with pytest.raises(LayoutError, match=r"4 is not divisible by 8"):
        reshape_dims(((Factor(64, ("tp",)),),), (4, 16), {"tp": 8})


def test_reshape_errors() -> None:
    sizes = {"dp": 2}
    with pytest.raises(LayoutError, match="does not match"):
        reshape_dims(((Factor(6),),), (12,), sizes)
    with pytest.raises(LayoutError):
        reshape_dims(((Factor(6),),), (4,), sizes)
    with pytest.raises(LayoutError, match="does not match"):
        reshape_dims(((Factor(6),),), (2,), sizes)
    with pytest.raises(LayoutError, match="regroups a split dimension"):
        reshape_dims(((Factor(6, ("dp",)),), (Factor(4),)), (4, 6), sizes)


def test_reshape_with_unit_dimensions() -> None:
    sizes = {"tp": 2}
    dims = reshape_dims(((Factor(8, ("tp",)),),), (1, 8, 1), sizes)
    assert [normalize_dim(d) for d in dims] == [(), (Factor(8, ("tp",)),), ()]
    assert TLayout(dims).local_shape(sizes) == (1, 4, 1)


def test_reshape_keeps_a_size_one_split_factor_in_place() -> None:
    """A size-1 dimension "split" over axes of size 1 is one index on every rank: unsplit,
    and it stays on its own dimension."""
    sizes = {MICROBATCH_AXIS: 1}
    dims = ((Factor(1, (MICROBATCH_AXIS,)),), (Factor(4),))
    out = reshape_dims(dims, (1, 4), sizes)
    assert [normalize_dim(d) for d in out] == [(), (Factor(4),)]


def test_reshape_drops_a_trailing_size_one_split_factor() -> None:
    dims = reshape_dims(((Factor(4),), (Factor(1, ("tp",)),)), (4,), {"tp": 1})
    assert TLayout(dims).global_shape() == (4,)


@st.composite
def reshape_cases(draw):
    """A mesh, a split layout (one factor per dimension) and two further shapes made by
    regrouping the same *atoms*: each dimension ``(n, A)`` is cut into an outer atom that keeps
    the axes (a multiple of ``|A|``) and unsplit inner atoms."""
    sizes, shape, dim_axes = draw(meshes_and_splits(max_rank=3))
    atoms: list[int] = []
    for d, n in enumerate(shape):
        ways = math.prod(sizes[a] for a in dim_axes.get(d, ()))
        rest = n // ways
        divisors = [k for k in range(1, rest + 1) if rest % k == 0]
        outer = ways * draw(st.sampled_from(divisors))
        atoms.append(outer)
        inner = n // outer
        while inner > 1:
            k = draw(st.sampled_from([q for q in range(2, inner + 1) if inner % q == 0]))
            atoms.append(k)
            inner //= k

    def grouping() -> tuple[int, ...]:
        cuts = draw(st.lists(st.booleans(), min_size=len(atoms) - 1, max_size=len(atoms) - 1))
        out, cur = [], atoms[0]
        for atom, cut in zip(atoms[1:], cuts, strict=True):
            if cut:
                out.append(cur)
                cur = atom
            else:
                cur *= atom
        out.append(cur)
        if draw(st.booleans()):
            out.insert(draw(st.integers(0, len(out))), 1)
        return tuple(out)

    return sizes, shape, dim_axes, grouping(), grouping()


@SETTINGS
@given(reshape_cases())
def test_local_reshape_of_the_piece_is_the_piece_of_the_reshape(case) -> None:
    """The defining property of ``reshape_dims``: for every rank,
    ``take_local(x.reshape(s), reshape_dims(dims, s)) == take_local(x, dims).reshape(local)``,
    for a reshape of a split layout and for a second reshape of the (multi-factor) result."""
    sizes, shape, dim_axes, shape2, shape3 = case
    lay = TLayout.split(shape, dim_axes)
    x = np.arange(math.prod(shape)).reshape(shape)
    dims2 = reshape_dims(lay.dims, shape2, sizes)
    lay2 = TLayout(dims2)
    assert lay2.global_shape() == shape2
    dims3 = reshape_dims(dims2, shape3, sizes)
    lay3 = TLayout(dims3)
    assert lay3.global_shape() == shape3
    assert lay3.shard_axes() == lay.shard_axes()
    for coords in all_coords(sizes):
        piece = take_local(x, lay, coords, sizes)
        piece2 = take_local(x.reshape(shape2), lay2, coords, sizes)
        np.testing.assert_array_equal(piece2, piece.reshape(lay2.local_shape(sizes)))
        piece3 = take_local(x.reshape(shape3), lay3, coords, sizes)
        np.testing.assert_array_equal(piece3, piece2.reshape(lay3.local_shape(sizes)))
    # reshaping back to the original shape gives back an equivalent layout
    back = reshape_dims(dims3, shape, sizes)
    assert all(same_dim(a, b) for a, b in zip(back, lay.dims, strict=True))


def test_reshape_piece_matches_torch_view_of_heads() -> None:
    """The attention head split of a column-parallel projection, in torch: rank t's local
    ``q.view(b, s, H/tp, hd)`` is the global view's heads ``t*H/tp ...``."""
    b, s, heads, hd, tp = 2, 3, 4, 2, 2
    sizes = {"tp": tp}
    q = torch.arange(b * s * heads * hd, dtype=torch.float64).reshape(b, s, heads * hd)
    lay = TLayout.split(q.shape, {2: ("tp",)})
    dims = reshape_dims(lay.dims, (b, s, heads, hd), sizes)
    view = q.view(b, s, heads, hd).numpy()
    for t in range(tp):
        local = torch.from_numpy(take_local(q.numpy(), lay, {"tp": t}, sizes))
        local_view = local.view(TLayout(dims).local_shape(sizes)).numpy()
        np.testing.assert_array_equal(local_view,
                                      take_local(view, TLayout(dims), {"tp": t}, sizes))
        np.testing.assert_array_equal(local_view, view[:, :, t * 2:(t + 1) * 2, :])


# -- normalize_dim ------------------------------------------------------------------------------


def test_normalize_dim_examples() -> None:
    assert normalize_dim((Factor(4, ("dp",)), Factor(3))) == (Factor(12, ("dp",)),)
    assert normalize_dim((Factor(1), Factor(4, ("dp",)), Factor(1))) == (Factor(4, ("dp",)),)
    assert normalize_dim((Factor(2), Factor(3))) == (Factor(6),)
    assert normalize_dim((Factor(3), Factor(4, ("dp",)))) == (Factor(3), Factor(4, ("dp",)))
    assert normalize_dim((Factor(1),)) == ()
    lay = TLayout(((Factor(4, ("dp",)), Factor(3)),))
    assert lay.simple_dim(0)
    assert not TLayout(((Factor(3), Factor(4, ("dp",))),)).simple_dim(0)


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 4),
       st.integers(1, 4), st.booleans())
def test_normalize_dim_is_the_same_index_set(n_a: int, n_b: int, block: int, m: int,
                                             lead: int, two_axes: bool) -> None:
    """``(n, A), (m, ())`` and ``(n*m, A)`` give every rank the same global indices in the same
    order; size-1 factors change nothing; a dimension after a leading unsplit factor too."""
    sizes = {"a": n_a, "b": n_b}
    axes = ("a", "b") if two_axes else ("a",)
    n = math.prod(sizes[x] for x in axes) * block
    assume(n > 1)  # a size-1 factor is one index on every rank: normalize_dim drops it
    dim = (Factor(n, axes), Factor(m))
    flat = (Factor(n * m, axes),)
    assert normalize_dim(dim) == normalize_dim(flat)
    padded = (Factor(1), Factor(lead), Factor(1)) + dim
    for coords in all_coords(sizes):
        got = local_indices(dim, coords, sizes)
        np.testing.assert_array_equal(got, local_indices(flat, coords, sizes))
        np.testing.assert_array_equal(local_indices(normalize_dim(padded), coords, sizes),
                                      local_indices(padded, coords, sizes))
        k = group_index(axes, coords, sizes)
        assert got.tolist() == list(range(k * block * m, (k + 1) * block * m))


def test_local_indices_of_a_non_contiguous_dimension() -> None:
    """``(3, ()), (4, (dp,))`` with dp = 2: rank dp=1 holds columns 2, 3 of every row of a
    ``3 x 4`` view -> 2, 3, 6, 7, 10, 11."""
    sizes = {"dp": 2}
    dim = (Factor(3), Factor(4, ("dp",)))
    assert local_indices(dim, {"dp": 1}, sizes).tolist() == [2, 3, 6, 7, 10, 11]
    assert local_indices(dim, {"dp": 0}, sizes).tolist() == [0, 1, 4, 5, 8, 9]
