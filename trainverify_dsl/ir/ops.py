"""The op registry: one entry per IR op, holding everything about it.

Each ``OpDef`` holds the op's name, its group, a one-line meaning, its arity and attribute
schema, its shape/dtype rule and its numeric semantics (numpy; floats in float64, integers in
int64). The fields the checker will fill later are present now and ``None`` until then:

- ``z3_encoding``: turns z3 operand terms into the result terms (check/ only).
- ``layout_rule``: how split/replicate/partial layouts propagate through the op (lower/).
- ``reduction_class``: the shape-reduction class (``REDUCTION_CLASSES``: ``elementwise``,
  ``reduction``, ``contraction``...); ``None`` means the op's dimensions may not be shrunk,
  and a proof at reduced sizes of a step holding it is inconclusive (``check/reduce.py``).
- ``min_sizes``: the minimum size of each dimension the op reduces, where the full size has
  at least that (``REDUCTION_MINIMUM``).

Ops are close to Core ATen. Scalars are 0-d ``full`` constants, so every operand is a tensor.
Collectives (group ``collective``) evaluate on the list of per-rank arrays of one group
(ordered by rank within the group) and return the list of per-rank results.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainverify_dsl.ir.types import ALL_DTYPES, TensorType, category, is_float, promote

Attrs = Mapping[str, Any]
ShapeRule = Callable[[tuple[TensorType, ...], Attrs], TensorType]
Evaluate = Callable[..., Any]


class ShapeError(ValueError):
    """An op's operands or attributes are inconsistent with its shape rule."""


@dataclass(frozen=True, slots=True)
class OpDef:
    name: str
    group: str
    meaning: str
    #: Number of tensor operands; ``None`` means variadic (at least ``min_arity``).
    arity: int | None
    attrs: tuple[str, ...]
    shape_rule: ShapeRule
    #: ``evaluate(args: tuple[np.ndarray, ...], attrs) -> np.ndarray``; for collectives
    #: ``evaluate(per_rank: list[tuple[np.ndarray, ...]], attrs) -> list[np.ndarray]``.
    evaluate: Evaluate
    min_arity: int = 1
    collective: bool = False
    z3_encoding: Callable[..., Any] | None = None
    layout_rule: Callable[..., Any] | None = None
    reduction_class: str | None = None
    min_sizes: tuple[int, ...] | None = None
    #: How the op runs on all ranks of a stage at once (``ir/batched.py``): ``shared``,
    #: ``elementwise``, ``dims``, ``view``, ``matmul``, ``collective`` or ``loop``.
    rank_batch: str = "loop"


# ---------------------------------------------------------------------------------------------
# Shape-rule helpers


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ShapeError(message)


def norm_dim(dim: int, rank: int) -> int:
    """A dimension index in ``[0, rank)`` (negative indices count from the end)."""
    _require(-max(rank, 1) <= dim < max(rank, 1), f"dimension {dim} out of range for rank {rank}")
    return dim % max(rank, 1)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError as error:
        raise ShapeError(f"shapes {list(shapes)} do not broadcast") from error


def _same(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    return ts[0]


def _float_of(t: TensorType) -> str:
    return t.dtype if is_float(t.dtype) else "f32"


def _unary_float(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    return TensorType(ts[0].shape, _float_of(ts[0]))


def _binary(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    return TensorType(broadcast_shapes(*(t.shape for t in ts)), promote(ts))


def _binary_float(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    dtype = promote(ts)
    return TensorType(broadcast_shapes(*(t.shape for t in ts)), dtype if is_float(dtype) else "f32")


def _compare(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    return TensorType(broadcast_shapes(*(t.shape for t in ts)), "bool")


def _bitwise(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    _require(all(category(t.dtype) < 2 for t in ts), "bitwise ops need bool or integer operands")
    return _binary(ts, a)


def _where(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    _require(ts[0].dtype == "bool", "where: condition must be bool")
    shape = broadcast_shapes(*(t.shape for t in ts))
    return TensorType(shape, promote(ts[1:]))


def _constant(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    _require(a["dtype"] in ALL_DTYPES, f"unknown dtype {a['dtype']!r}")
    return TensorType(tuple(a["shape"]), a["dtype"])


def _arange(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    _require(a["step"] != 0, "arange: step must be non-zero")
    length = max(0, math.ceil((a["end"] - a["start"]) / a["step"]))
    return TensorType((length,), a["dtype"])


def _literal(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    t = _constant(ts, a)
    _require(len(a["values"]) == t.numel, f"literal: {len(a['values'])} values for shape "
             f"{t.shape}")
    return t


def _convert(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    _require(a["dtype"] in ALL_DTYPES, f"unknown dtype {a['dtype']!r}")
    return TensorType(ts[0].shape, a["dtype"])


def _reduced_shape(t: TensorType, a: Attrs) -> tuple[int, ...]:
    dims = a["dims"]
    _require(all(0 <= d < t.rank for d in dims), f"reduction dims {dims} out of range")
    _require(list(dims) == sorted(set(dims)), f"reduction dims {dims} must be sorted and unique")
    if a["keepdim"]:
        return tuple(1 if i in dims else s for i, s in enumerate(t.shape))
    return tuple(s for i, s in enumerate(t.shape) if i not in dims)


def _reduce(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    dtype = ts[0].dtype if category(ts[0].dtype) == 2 else "i64"
    return TensorType(_reduced_shape(ts[0], a), dtype)


def _reduce_keep_dtype(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    return TensorType(_reduced_shape(ts[0], a), ts[0].dtype)


def _reduce_float(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    _require(is_float(ts[0].dtype), "mean needs a float operand")
    return TensorType(_reduced_shape(ts[0], a), ts[0].dtype)


def _any(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    return TensorType(_reduced_shape(ts[0], a), "bool")


def _argmax(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    return TensorType(_reduced_shape(ts[0], {"dims": (a["dim"],), "keepdim": a["keepdim"]}),
                      "i64")


def _mm(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    x, y = ts
    _require(x.rank == 2 and y.rank == 2, "mm needs two matrices")
    _require(x.shape[1] == y.shape[0], f"mm: inner sizes {x.shape[1]} and {y.shape[0]} differ")
    return TensorType((x.shape[0], y.shape[1]), promote(ts))


def _bmm(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    x, y = ts
    _require(x.rank == 3 and y.rank == 3, "bmm needs two rank-3 tensors")
    _require(x.shape[0] == y.shape[0], "bmm: batch sizes differ")
    _require(x.shape[2] == y.shape[1], f"bmm: inner sizes {x.shape[2]} and {y.shape[1]} differ")
    return TensorType((x.shape[0], x.shape[1], y.shape[2]), promote(ts))


def _reshape(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    shape = tuple(a["shape"])
    _require(all(s >= 0 for s in shape), "reshape: target shape must be explicit (no -1)")
    _require(TensorType(shape, "f32").numel == ts[0].numel,
             f"reshape: {ts[0].shape} and {shape} have different sizes")
    return TensorType(shape, ts[0].dtype)


def _expand(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    shape, src = tuple(a["shape"]), ts[0].shape
    _require(len(shape) >= len(src), "expand: cannot drop dimensions")
    tail = shape[len(shape) - len(src):]
    _require(all(s == t or s == 1 for s, t in zip(src, tail, strict=True)),
             f"expand: {src} cannot expand to {shape}")
    return TensorType(shape, ts[0].dtype)


def _permute(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    dims = tuple(a["dims"])
    _require(sorted(dims) == list(range(ts[0].rank)), f"permute: {dims} is not a permutation")
    return TensorType(tuple(ts[0].shape[d] for d in dims), ts[0].dtype)


def _unsqueeze(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    dim = a["dim"]
    _require(0 <= dim <= ts[0].rank, f"unsqueeze: dim {dim} out of range")
    shape = ts[0].shape
    return TensorType(shape[:dim] + (1,) + shape[dim:], ts[0].dtype)


def _squeeze(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    dims = a["dims"]
    _require(all(0 <= d < ts[0].rank and ts[0].shape[d] == 1 for d in dims),
             f"squeeze: dims {dims} must be size-1 dimensions")
    return TensorType(tuple(s for i, s in enumerate(ts[0].shape) if i not in dims), ts[0].dtype)


def _flip(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    _require(all(0 <= d < ts[0].rank for d in a["dims"]), "flip: dims out of range")
    return ts[0]


def _slice_len(size: int, a: Attrs) -> int:
    start, end, step = a["start"], a["end"], a["step"]
    _require(0 <= start <= end <= size and step >= 1,
             f"slice [{start}:{end}:{step}] invalid for size {size}")
    return len(range(start, end, step))


def _slice(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    t, dim = ts[0], a["dim"]
    _require(0 <= dim < t.rank, "slice: dim out of range")
    shape = list(t.shape)
    shape[dim] = _slice_len(shape[dim], a)
    return TensorType(tuple(shape), t.dtype)


def _slice_scatter(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    _require(_slice(ts[:1], a).shape == ts[1].shape, "slice_scatter: src shape mismatch")
    return ts[0]


def _select(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    t, dim, index = ts[0], a["dim"], a["index"]
    _require(0 <= dim < t.rank and 0 <= index < t.shape[dim], "select: index out of range")
    return TensorType(t.shape[:dim] + t.shape[dim + 1:], t.dtype)


def _select_scatter(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    _require(_select(ts[:1], a).shape == ts[1].shape, "select_scatter: src shape mismatch")
    return ts[0]


def _cat(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    dim, first = a["dim"], ts[0]
    _require(0 <= dim < first.rank, "cat: dim out of range")
    for t in ts[1:]:
        _require(t.rank == first.rank and all(
            s == u for i, (s, u) in enumerate(zip(t.shape, first.shape, strict=True)) if i != dim),
            f"cat: shapes {first.shape} and {t.shape} differ outside dim {dim}")
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in ts)
    return TensorType(tuple(shape), promote(ts))


def _index_dtype(t: TensorType, what: str) -> None:
    _require(category(t.dtype) == 1, f"{what}: indices must be integers, got {t.dtype}")


def _gather(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    src, index = ts
    _index_dtype(index, "gather")
    _require(src.rank == index.rank and 0 <= a["dim"] < src.rank, "gather: rank mismatch")
    return TensorType(index.shape, src.dtype)


def _scatter(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    dest, index, src = ts
    _index_dtype(index, "scatter")
    _require(dest.rank == index.rank == src.rank and 0 <= a["dim"] < dest.rank,
             "scatter: rank mismatch")
    _require(all(i <= s for i, s in zip(index.shape, src.shape, strict=True)),
             "scatter: index larger than src")
    return dest


def _index(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    src, indices, skip = ts[0], ts[1:], a["skip"]
    for t in indices:
        _index_dtype(t, "index")
    _require(skip >= 0 and skip + len(indices) <= src.rank, "index: too many index tensors")
    batch = broadcast_shapes(*(t.shape for t in indices))
    return TensorType(src.shape[:skip] + batch + src.shape[skip + len(indices):], src.dtype)


def _index_put(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    dest, values = ts[0], ts[1]
    target = _index((dest,) + ts[2:], a)
    broadcast_shapes(values.shape, target.shape)
    _require(broadcast_shapes(values.shape, target.shape) == target.shape,
             f"index_put: values {values.shape} do not broadcast to {target.shape}")
    return dest


def _index_select(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    src, index = ts
    _index_dtype(index, "index_select")
    _require(index.rank == 1 and 0 <= a["dim"] < src.rank, "index_select: bad index or dim")
    shape = list(src.shape)
    shape[a["dim"]] = index.shape[0]
    return TensorType(tuple(shape), src.dtype)


def _embedding(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    weight, index = ts
    _index_dtype(index, "embedding")
    _require(weight.rank == 2, "embedding: weight must be a matrix")
    return TensorType(index.shape + weight.shape[1:], weight.dtype)


def _softmax(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    _require(0 <= a["dim"] < max(ts[0].rank, 1), "softmax: dim out of range")
    _require(is_float(ts[0].dtype), "softmax needs a float operand")
    return ts[0]


def _softmax_backward(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    _require(ts[0].shape == ts[1].shape, "softmax backward: grad and output shapes differ")
    return _softmax(ts[1:], a)


def _topk(ts: tuple[TensorType, ...], a: Attrs, dtype: str | None) -> TensorType:
    t, dim, k = ts[0], a["dim"], a["k"]
    _require(0 <= dim < t.rank and 0 <= k <= t.shape[dim], "topk: bad k or dim")
    shape = list(t.shape)
    shape[dim] = k
    return TensorType(tuple(shape), dtype or t.dtype)


def _sort(ts: tuple[TensorType, ...], a: Attrs, dtype: str | None) -> TensorType:
    _require(0 <= a["dim"] < ts[0].rank, "sort: dim out of range")
    return TensorType(ts[0].shape, dtype or ts[0].dtype)


def _cumsum(ts: tuple[TensorType, ...], a: Attrs) -> TensorType:
    _require(0 <= a["dim"] < max(ts[0].rank, 1), "cumsum: dim out of range")
    return TensorType(ts[0].shape, ts[0].dtype if category(ts[0].dtype) == 2 else "i64")


# ---------------------------------------------------------------------------------------------
# Numeric helpers (numpy, float64 / int64 / bool carriers)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _fill(a: Attrs) -> np.ndarray:
    from trainverify_dsl.ir.types import numpy_dtype

    return np.full(tuple(a["shape"]), a["value"], dtype=numpy_dtype(a["dtype"]))


def _convert_values(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bool":
        return x != 0
    if category(dtype) == 1 and x.dtype == np.float64:
        return np.trunc(x).astype(np.int64)
    return x.astype(np.float64 if is_float(dtype) else np.int64)


def _divide(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(x, y)


def _reduce_np(fn: Callable[..., np.ndarray]) -> Evaluate:
    def evaluate(args: tuple[np.ndarray, ...], a: Attrs) -> np.ndarray:
        return fn(args[0], axis=tuple(a["dims"]), keepdims=a["keepdim"])

    return evaluate


def _index_grid(index: np.ndarray, dim: int) -> tuple[np.ndarray, ...]:
    """Advanced-index tuple addressing ``t[..., index[...], ...]`` along ``dim`` (gather)."""
    grid = list(np.indices(index.shape, sparse=True))
    grid[dim] = index
    return tuple(grid)


def _gather_np(args: tuple[np.ndarray, ...], a: Attrs) -> np.ndarray:
    src, index = args
    return src[_index_grid(index, a["dim"])]


def _scatter_np(args: tuple[np.ndarray, ...], a: Attrs, accumulate: bool) -> np.ndarray:
    dest, index, src = args
    out = dest.copy()
    values = src[tuple(slice(0, s) for s in index.shape)]
    if accumulate:
        np.add.at(out, _index_grid(index, a["dim"]), values)
    else:
        out[_index_grid(index, a["dim"])] = values
    return out


def _index_key(indices: tuple[np.ndarray, ...], a: Attrs) -> tuple[Any, ...]:
    return (slice(None),) * a["skip"] + tuple(indices)


def _index_put_np(args: tuple[np.ndarray, ...], a: Attrs) -> np.ndarray:
    out = args[0].copy()
    key = _index_key(args[2:], a)
    if a["accumulate"]:
        np.add.at(out, key, args[1])
    else:
        out[key] = args[1]
    return out


def _slice_key(rank: int, a: Attrs) -> tuple[slice, ...]:
    key = [slice(None)] * rank
    key[a["dim"]] = slice(a["start"], a["end"], a["step"])
    return tuple(key)


def _slice_scatter_np(args: tuple[np.ndarray, ...], a: Attrs) -> np.ndarray:
    out = args[0].copy()
    out[_slice_key(out.ndim, a)] = args[1]
    return out


def _select_scatter_np(args: tuple[np.ndarray, ...], a: Attrs) -> np.ndarray:
    out = args[0].copy()
    key = [slice(None)] * out.ndim
    key[a["dim"]] = a["index"]
    out[tuple(key)] = args[1]
    return out


def _softmax_np(x: np.ndarray, dim: int) -> np.ndarray:
    shifted = np.exp(x - np.max(x, axis=dim, keepdims=True))
    return shifted / np.sum(shifted, axis=dim, keepdims=True)


def _log_softmax_np(x: np.ndarray, dim: int) -> np.ndarray:
    shifted = x - np.max(x, axis=dim, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True))


def _order(x: np.ndarray, dim: int, descending: bool) -> np.ndarray:
    """Stable sort order along ``dim``; descending keeps equal elements in index order."""
    keys = -x if descending else x
    return np.argsort(keys, axis=dim, kind="stable")


def _topk_order(x: np.ndarray, a: Attrs) -> np.ndarray:
    order = _order(x, a["dim"], a["largest"])
    return np.take(order, np.arange(a["k"]), axis=a["dim"])


# ---------------------------------------------------------------------------------------------
# Collective semantics: lists of per-rank arrays of one group, ordered by rank in the group


def _check_group(per_rank: list[tuple[np.ndarray, ...]], a: Attrs) -> list[np.ndarray]:
    if len(per_rank) != a["group_size"]:
        raise ShapeError(f"collective over {a['group_size']} ranks got {len(per_rank)} arrays")
    return [args[0] for args in per_rank]


def _combine(arrays: list[np.ndarray], op: str) -> np.ndarray:
    stacked = np.stack(arrays)
    if op == "sum":
        return stacked.sum(axis=0)
    if op == "avg":
        return stacked.sum(axis=0) / len(arrays)
    if op == "max":
        return stacked.max(axis=0)
    if op == "min":
        return stacked.min(axis=0)
    raise ShapeError(f"unknown reduce op {op!r}")


def _all_reduce_np(per_rank: list[tuple[np.ndarray, ...]], a: Attrs) -> list[np.ndarray]:
    total = _combine(_check_group(per_rank, a), a["op"])
    return [total.copy() for _ in per_rank]


def _all_gather_np(per_rank: list[tuple[np.ndarray, ...]], a: Attrs) -> list[np.ndarray]:
    whole = np.concatenate(_check_group(per_rank, a), axis=a["dim"])
    return [whole.copy() for _ in per_rank]


def _reduce_scatter_np(per_rank: list[tuple[np.ndarray, ...]], a: Attrs) -> list[np.ndarray]:
    total = _combine(_check_group(per_rank, a), a["op"])
    return list(np.split(total, a["group_size"], axis=a["dim"]))


def _all_to_all_np(per_rank: list[tuple[np.ndarray, ...]], a: Attrs) -> list[np.ndarray]:
    """Rank r sends its j-th chunk (along split_dim) to rank j, which concatenates the chunks
    it receives, in source-rank order, along concat_dim."""
    arrays = _check_group(per_rank, a)
    chunks = [np.split(x, a["group_size"], axis=a["split_dim"]) for x in arrays]
    return [np.concatenate([chunks[src][dst] for src in range(len(arrays))],
                           axis=a["concat_dim"]) for dst in range(len(arrays))]


def _send_recv_np(per_rank: list[tuple[np.ndarray, ...]], a: Attrs) -> list[np.ndarray]:
    """Collective permute (jax.lax.ppermute): for each (src, dst) pair, rank dst receives rank
    src's array; a rank that receives nothing gets zeros."""
    arrays = _check_group(per_rank, a)
    out = [np.zeros_like(x) for x in arrays]
    for src, dst in a["pairs"]:
        out[dst] = arrays[src].copy()
    return out


def _collective_shape(ts: tuple[TensorType, ...], a: Attrs, kind: str) -> TensorType:
    t, size = ts[0], a["group_size"]
    _require(size >= 1, "collective group_size must be positive")
    shape = list(t.shape)
    if kind == "gather":
        shape[norm_dim(a["dim"], t.rank)] *= size
    elif kind == "scatter":
        dim = norm_dim(a["dim"], t.rank)
        _require(shape[dim] % size == 0,
                 f"reduce_scatter: size {shape[dim]} not divisible by {size}")
        shape[dim] //= size
    elif kind == "all_to_all":
        split, concat = a["split_dim"], a["concat_dim"]
        _require(shape[split] % size == 0, f"all_to_all: size {shape[split]} not divisible")
        shape[split] //= size
        shape[concat] *= size
    elif kind == "send_recv":
        pairs = a["pairs"]
        _require(len({d for _, d in pairs}) == len(pairs), "send_recv: a rank receives twice")
        _require(all(0 <= r < size for p in pairs for r in p), "send_recv: rank out of range")
    return TensorType(tuple(shape), t.dtype)


def _collective_rule(kind: str) -> ShapeRule:
    return lambda ts, a: _collective_shape(ts, a, kind)


# ---------------------------------------------------------------------------------------------
# The registry


#: The rank-batching strategy of each group (``OpDef.rank_batch``); an entry may override it.
_RANK_BATCH = {"constant": "shared", "elementwise": "elementwise", "reduction": "dims",
               "contraction": "matmul", "view": "view", "index": "dims", "softmax": "dims",
               "ordering": "dims", "collective": "collective"}


#: The shape-reduction classes (docs/checking.md, "Shape reduction"): what an op's meaning
#: needs of the sizes it runs at, so that a proof at reduced sizes carries to the full ones.
#:
#: - ``elementwise``: each output element from the input elements at the same index (after
#:   broadcasting); uniform in every dimension, no minimum.
#: - ``reduction``: a sum, mean, max, min or any over whole dimensions; each reduced
#:   dimension >= 2 where it is >= 2 at full size.
#: - ``contraction``: a matrix product; the contracted dimension >= 2 likewise.
#: - ``normalised``: softmax and its backward forms, normalised along one dimension >= 2.
#: - ``layout``: moves whole dimensions (reshape, expand, permute, squeeze, flip); a reshape
#:   keeps its factor structure (heads x head_dim) because every factor is a width.
#: - ``block``: moves blocks along a dimension (slice, cat, select, their scatters); its
#:   bounds are block boundaries of the widths (multiples of a width), as the tracer records
#:   them at the reduced sizes.
#: - ``gather``: data-dependent positions (embedding, gather, index, scatter); proven for the
#:   drawn indices, all in range.
#: - ``position``: values that are positions (``arange``, ``cumsum``): the reduced program sees
#:   positions up to the reduced sizes only, so both programs' position arithmetic must be
#:   a function of the widths (offsets by block, never a literal position).
#: - ``ordering``: top-k and sorts, ``argmax``: taken at the drawn values (stated in the
#:   verdict), ``k`` unchanged.
#: - ``constant``: a fill or a literal; no width.
#: - ``collective``: over a mesh axis group (the mesh is never reduced); the dimension it
#:   splits or gathers keeps the group size's factors (the shrinker's divisibility rule).
REDUCTION_CLASSES = ("elementwise", "reduction", "contraction", "normalised", "layout",
                     "block", "gather", "position", "ordering", "constant", "collective")
#: The class of each op group (``OpDef.reduction_class``); an entry may override it.
_REDUCTION = {"constant": "constant", "elementwise": "elementwise", "reduction": "reduction",
              "contraction": "contraction", "view": "layout", "index": "block",
              "softmax": "normalised", "ordering": "ordering", "collective": "collective"}
#: Classes whose reduced dimensions keep at least this size where the full size has it
#: (``OpDef.min_sizes`` of such an op: that minimum for each dimension it reduces).
REDUCTION_MINIMUM = {"reduction": 2, "contraction": 2, "normalised": 2}


def _op(name: str, group: str, meaning: str, arity: int | None, attrs: tuple[str, ...],
        shape_rule: ShapeRule, evaluate: Evaluate, **extra: Any) -> OpDef:
    extra.setdefault("rank_batch", _RANK_BATCH[group])
    extra.setdefault("reduction_class", _REDUCTION[group])
    minimum = REDUCTION_MINIMUM.get(extra["reduction_class"])
    if minimum is not None:
        extra.setdefault("min_sizes", (minimum,))
    return OpDef(name, group, meaning, arity, attrs, shape_rule, evaluate, **extra)


def _unary(name: str, meaning: str, fn: Callable[[np.ndarray], np.ndarray],
           rule: ShapeRule = _unary_float) -> OpDef:
    return _op(name, "elementwise", meaning, 1, (), rule, lambda args, a: fn(args[0]))


def _binary_op(name: str, meaning: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray],
               rule: ShapeRule = _binary) -> OpDef:
    return _op(name, "elementwise", meaning, 2, (), rule, lambda args, a: fn(args[0], args[1]))


_ENTRIES: tuple[OpDef, ...] = (
    # -- constants: no operands ---------------------------------------------------------------
    _op("full", "constant", "tensor of `shape` filled with `value`", 0,
        ("dtype", "shape", "value"), _constant, lambda args, a: _fill(a)),
    _op("arange", "constant", "start, start+step, ... below end", 0,
        ("dtype", "end", "start", "step"), _arange,
        lambda args, a: np.arange(a["start"], a["end"], a["step"]), reduction_class="position"),
    _op("literal", "constant", "small tensor constant: row-major `values` in `shape`", 0,
        ("dtype", "shape", "values"), _literal,
        lambda args, a: np.array(a["values"]).reshape(a["shape"])),
    # -- elementwise unary --------------------------------------------------------------------
    _unary("neg", "-x", np.negative, _same),
    _unary("abs", "|x|", np.abs, _same),
    _unary("sign", "-1, 0 or 1 by the sign of x", np.sign, _same),
    _unary("exp", "e^x", np.exp),
    _unary("log", "natural logarithm", np.log),
    _unary("log1p", "log(1 + x)", np.log1p),
    _unary("sqrt", "square root", np.sqrt),
    _unary("rsqrt", "1 / sqrt(x)", lambda x: 1.0 / np.sqrt(x)),
    _unary("reciprocal", "1 / x", lambda x: 1.0 / x),
    _unary("sin", "sine", np.sin),
    _unary("cos", "cosine", np.cos),
    _unary("tanh", "hyperbolic tangent", np.tanh),
    _unary("sigmoid", "1 / (1 + e^-x)", lambda x: 1.0 / (1.0 + np.exp(-x))),
    _unary("erf", "Gauss error function", _erf),
    _unary("relu", "max(x, 0)", lambda x: np.maximum(x, 0), _same),
    _unary("isnan", "x is NaN (never, over the reals; kept for ATen's NaN guards)", np.isnan,
           lambda ts, a: TensorType(ts[0].shape, "bool")),
    _unary("logical_not", "boolean not of x != 0", np.logical_not,
           lambda ts, a: TensorType(ts[0].shape, "bool")),
    _unary("bitwise_not", "bitwise not (logical not for bool)", np.invert, _same),
    _op("gelu", "elementwise", "x * Phi(x); `approximate` is 'none' (erf) or 'tanh'", 1,
        ("approximate",), _unary_float, lambda args, a: _gelu(args[0], a["approximate"])),
    _op("clamp", "elementwise", "min(max(x, lo), hi); a None bound is absent", 1,
        ("max", "min"), _same,
        lambda args, a: np.clip(args[0], a["min"], a["max"])),
    _op("convert", "elementwise", "convert to `dtype` (float to int truncates)", 1, ("dtype",),
        _convert, lambda args, a: _convert_values(args[0], a["dtype"])),
    # -- elementwise binary (numpy broadcasting) and ternary -------------------------------------
    _binary_op("add", "x + y", np.add),
    _binary_op("sub", "x - y", np.subtract),
    _binary_op("mul", "x * y", np.multiply),
    _binary_op("div", "true division x / y", _divide, _binary_float),
    _binary_op("pow", "x ** y", np.power),
    _binary_op("maximum", "elementwise max", np.maximum),
    _binary_op("minimum", "elementwise min", np.minimum),
    _binary_op("eq", "x == y", np.equal, _compare),
    _binary_op("ne", "x != y", np.not_equal, _compare),
    _binary_op("lt", "x < y", np.less, _compare),
    _binary_op("le", "x <= y", np.less_equal, _compare),
    _binary_op("gt", "x > y", np.greater, _compare),
    _binary_op("ge", "x >= y", np.greater_equal, _compare),
    _binary_op("logical_and", "(x != 0) and (y != 0)", np.logical_and, _compare),
    _binary_op("logical_or", "(x != 0) or (y != 0)", np.logical_or, _compare),
    _binary_op("bitwise_and", "x & y", np.bitwise_and, _bitwise),
    _binary_op("bitwise_or", "x | y", np.bitwise_or, _bitwise),
    _binary_op("bitwise_xor", "x ^ y", np.bitwise_xor, _bitwise),
    _op("where", "elementwise", "cond ? x : y", 3, (), _where,
        lambda args, a: np.where(args[0], args[1], args[2])),
    # -- reductions over sorted `dims` (never empty: the tracer expands "all dims") -------------
    _op("sum", "reduction", "sum over dims", 1, ("dims", "keepdim"), _reduce, _reduce_np(np.sum)),
    _op("mean", "reduction", "mean over dims", 1, ("dims", "keepdim"), _reduce_float,
        _reduce_np(np.mean)),
    _op("amax", "reduction", "max over dims", 1, ("dims", "keepdim"), _reduce_keep_dtype,
        _reduce_np(np.max)),
    _op("amin", "reduction", "min over dims", 1, ("dims", "keepdim"), _reduce_keep_dtype,
        _reduce_np(np.min)),
    _op("any", "reduction", "logical or over dims", 1, ("dims", "keepdim"), _any,
        _reduce_np(np.any)),
    _op("argmax", "reduction", "index of the first max along dim", 1, ("dim", "keepdim"),
        _argmax, lambda args, a: np.argmax(args[0], axis=a["dim"], keepdims=a["keepdim"]),
        reduction_class="ordering"),
    _op("cumsum", "reduction", "inclusive prefix sum along dim", 1, ("dim",), _cumsum,
        lambda args, a: np.cumsum(args[0], axis=a["dim"]), reduction_class="position"),
    # -- contractions ---------------------------------------------------------------------------
    _op("mm", "contraction", "matrix product [m,k] @ [k,n]", 2, (), _mm,
        lambda args, a: args[0] @ args[1]),
    _op("bmm", "contraction", "batched matrix product [b,m,k] @ [b,k,n]", 2, (), _bmm,
        lambda args, a: args[0] @ args[1]),
    # -- views and data movement (no arithmetic) ------------------------------------------------
    _op("reshape", "view", "same elements in row-major order, new shape", 1, ("shape",),
        _reshape, lambda args, a: args[0].reshape(a["shape"])),
    _op("expand", "view", "broadcast to shape (new leading dims, size-1 dims repeated)", 1,
        ("shape",), _expand, lambda args, a: np.broadcast_to(args[0], a["shape"]).copy()),
    _op("permute", "view", "reorder dims: out dim i is input dim dims[i]", 1, ("dims",),
        _permute, lambda args, a: np.transpose(args[0], a["dims"])),
    _op("unsqueeze", "view", "insert a size-1 dim at dim", 1, ("dim",), _unsqueeze,
        lambda args, a: np.expand_dims(args[0], a["dim"])),
    _op("squeeze", "view", "drop the listed size-1 dims", 1, ("dims",), _squeeze,
        lambda args, a: np.squeeze(args[0], axis=tuple(a["dims"]))),
    _op("flip", "view", "reverse the order along dims", 1, ("dims",), _flip,
        lambda args, a: np.flip(args[0], axis=tuple(a["dims"])).copy()),
    # -- slicing, concatenation and indexing ----------------------------------------------------
    _op("slice", "index", "x[start:end:step] along dim (bounds normalised, in range)", 1,
        ("dim", "end", "start", "step"), _slice,
        lambda args, a: args[0][_slice_key(args[0].ndim, a)]),
    _op("slice_scatter", "index", "x with x[start:end:step] along dim replaced by src", 2,
        ("dim", "end", "start", "step"), _slice_scatter, _slice_scatter_np),
    _op("select", "index", "x[index] along dim (dim removed)", 1, ("dim", "index"), _select,
        lambda args, a: np.take(args[0], a["index"], axis=a["dim"])),
    _op("select_scatter", "index", "x with x[index] along dim replaced by src", 2,
        ("dim", "index"), _select_scatter, _select_scatter_np),
    _op("cat", "index", "concatenate operands along dim", None, ("dim",), _cat,
        lambda args, a: np.concatenate(args, axis=a["dim"])),
    _op("gather", "index", "out[i..] = x[i.. with dim replaced by index[i..]]", 2, ("dim",),
        _gather, _gather_np, rank_batch="loop", reduction_class="gather"),
    _op("scatter", "index", "dest with dest[i.. with dim := index[i..]] = src[i..]", 3, ("dim",),
        _scatter, lambda args, a: _scatter_np(args, a, accumulate=False), rank_batch="loop",
        reduction_class="gather"),
    _op("scatter_add", "index", "like scatter, but adds src into dest", 3, ("dim",), _scatter,
        lambda args, a: _scatter_np(args, a, accumulate=True), rank_batch="loop",
        reduction_class="gather"),
    _op("index", "index", "x[:, ..(skip).., i0, i1, ...]: adjacent integer index tensors", None,
        ("skip",), _index, lambda args, a: args[0][_index_key(args[1:], a)], min_arity=2,
        rank_batch="loop", reduction_class="gather"),
    _op("index_put", "index", "dest with dest[:, ..(skip).., i0, ...] = (+= if accumulate) v",
        None, ("accumulate", "skip"), _index_put, _index_put_np, min_arity=3, rank_batch="loop",
        reduction_class="gather"),
    _op("index_select", "index", "rows of x along dim picked by a 1-d index", 2, ("dim",),
        _index_select, lambda args, a: np.take(args[0], args[1], axis=a["dim"]), rank_batch="loop",
        reduction_class="gather"),
    _op("embedding", "index", "weight[indices]: rows of a [num, dim] table", 2, (), _embedding,
        lambda args, a: args[0][args[1]], rank_batch="loop", reduction_class="gather"),
    # -- softmax family and its backward forms (as ATen gives them) -----------------------------
    _op("softmax", "softmax", "exp(x - max) / sum(exp(x - max)) along dim", 1, ("dim",),
        _softmax, lambda args, a: _softmax_np(args[0], a["dim"])),
    _op("log_softmax", "softmax", "x - max - log(sum(exp(x - max))) along dim", 1, ("dim",),
        _softmax, lambda args, a: _log_softmax_np(args[0], a["dim"])),
    _op("softmax_backward", "softmax", "(grad, out) -> out * (grad - sum(grad * out, dim))", 2,
        ("dim",), _softmax_backward,
        lambda args, a: args[1] * (args[0] - np.sum(args[0] * args[1], axis=a["dim"],
                                                    keepdims=True))),
    _op("log_softmax_backward", "softmax", "(grad, out) -> grad - exp(out) * sum(grad, dim)", 2,
        ("dim",), _softmax_backward,
        lambda args, a: args[0] - np.exp(args[1]) * np.sum(args[0], axis=a["dim"],
                                                          keepdims=True)),
    # -- ordering (ties keep index order) -------------------------------------------------------
    _op("topk_values", "ordering", "the k largest (or smallest) values along dim, sorted", 1,
        ("dim", "k", "largest"), lambda ts, a: _topk(ts, a, None),
        lambda args, a: np.take_along_axis(args[0], _topk_order(args[0], a), axis=a["dim"])),
    _op("topk_indices", "ordering", "indices of topk_values", 1, ("dim", "k", "largest"),
        lambda ts, a: _topk(ts, a, "i64"), lambda args, a: _topk_order(args[0], a)),
    _op("sort_values", "ordering", "stable sort along dim", 1, ("descending", "dim"),
        lambda ts, a: _sort(ts, a, None),
        lambda args, a: np.take_along_axis(
            args[0], _order(args[0], a["dim"], a["descending"]), axis=a["dim"])),
    _op("sort_indices", "ordering", "indices of sort_values", 1, ("descending", "dim"),
        lambda ts, a: _sort(ts, a, "i64"),
        lambda args, a: _order(args[0], a["dim"], a["descending"])),
    # -- collectives over the `group_size` ranks of mesh axis `axis` ----------------------------
    _op("all_reduce", "collective", "every rank gets the sum/avg/max of all ranks' arrays", 1,
        ("axis", "group_size", "op"), _collective_rule("same"), _all_reduce_np, collective=True),
    _op("all_gather", "collective", "every rank gets all arrays concatenated along dim", 1,
        ("axis", "dim", "group_size"), _collective_rule("gather"), _all_gather_np,
        collective=True),
    _op("reduce_scatter", "collective", "rank r gets chunk r (along dim) of the reduction", 1,
        ("axis", "dim", "group_size", "op"), _collective_rule("scatter"), _reduce_scatter_np,
        collective=True),
    _op("all_to_all", "collective", "chunk j of rank i goes to rank j, concatenated by source",
        1, ("axis", "concat_dim", "group_size", "split_dim"), _collective_rule("all_to_all"),
        _all_to_all_np, collective=True),
    _op("local_scatter", "collective", "rank r keeps chunk r (along dim) of its own array", 1,
        ("axis", "dim", "group_size"), _collective_rule("scatter"),
        lambda per_rank, a: [np.split(x, a["group_size"], axis=a["dim"])[k].copy()
                             for k, x in enumerate(_check_group(per_rank, a))],
        collective=True),
    _op("send_recv", "collective", "point-to-point: dst receives src's array per (src, dst)", 1,
        ("axis", "group_size", "pairs"), _collective_rule("send_recv"), _send_recv_np,
        collective=True),
)

#: name -> OpDef, in registry order.
OPS: dict[str, OpDef] = {op.name: op for op in _ENTRIES}
assert len(OPS) == len(_ENTRIES), "duplicate op name in the registry"

#: Named op groups, for histograms and for the checker's rule tables.
GROUPS: dict[str, tuple[str, ...]] = {
    group: tuple(op.name for op in _ENTRIES if op.group == group)
    for group in dict.fromkeys(op.group for op in _ENTRIES)
}


def lookup(name: str) -> OpDef:
    """The registry entry of op ``name`` (KeyError for unknown ops)."""
    return OPS[name]
