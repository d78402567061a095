"""FX (Core ATen) graphs to IR graphs.

One converter per ATen overload packet, in ``CONVERTERS``. A converter receives the op's
arguments bound by name from its schema (tensors as ``V`` value handles, scalars as Python
values) and emits IR nodes through the ``Ctx``. Python scalars become 0-d ``full`` constants.
ATen's "all dims" conventions (``dim=[]``, ``None``, negative dims, ``end=2**63-1``) are
normalised here so the IR only holds explicit, in-range values.

Ops with no converter are collected (op name, module path) before anything is built, so one
trace reports every unsupported op at once.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainverify_dsl.ir.collectives import IR_OPS
from trainverify_dsl.ir.graph import GraphBuilder, Origin
from trainverify_dsl.ir.types import TensorType, is_float
from trainverify_dsl.spec.marks import POINT

DTYPES: dict[torch.dtype, str] = {
    torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
    torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32",
    torch.int64: "i64", torch.bool: "bool",
}


class UnsupportedOp(Exception):
    """An ATen op (or argument combination) the IR cannot express."""


@dataclass(frozen=True, slots=True)
class V:
    """Handle of an IR value inside a converter (distinct from Python ints)."""

    id: int


def tensor_type(val: Any) -> TensorType:
    if val.dtype not in DTYPES:
        raise UnsupportedOp(f"dtype {val.dtype}")
    return TensorType(tuple(int(s) for s in val.shape), DTYPES[val.dtype])


def module_path(meta: dict[str, Any]) -> tuple[str, str]:
    """(module path, phase) of an FX node from its ``nn_module_stack`` metadata."""
    if "fwd_nn_module_stack" in meta:
        stack, phase = meta["fwd_nn_module_stack"], "backward"
    else:
        stack, phase = meta.get("nn_module_stack"), "forward"
    if not stack:
        return "", phase
    path = list(stack.values())[-1][0]
    return (path if isinstance(path, str) else ""), phase


class Ctx:
    """Emission context of one FX node."""

    def __init__(self, builder: GraphBuilder, out: Any, origin: Origin) -> None:
        self.builder = builder
        self.out_val = out
        self.origin = origin

    @property
    def out(self) -> TensorType:
        val = self.out_val[0] if isinstance(self.out_val, (tuple, list)) else self.out_val
        return tensor_type(val)

    def type(self, v: V) -> TensorType:
        return self.builder.value_type(v.id)

    def emit(self, op: str, inputs: tuple[V, ...], attrs: dict[str, Any] | None = None,
             type_: TensorType | None = None) -> V:
        ids = tuple(v.id for v in inputs)
        return V(self.builder.add(op, ids, attrs, type_, self.origin))

    def const(self, value: Any, dtype: str, shape: tuple[int, ...] = ()) -> V:
        value = bool(value) if dtype == "bool" else (
            float(value) if is_float(dtype) else int(value))
        return self.emit("full", (), {"shape": shape, "value": value, "dtype": dtype})

    def operand(self, x: Any, other: TensorType) -> V:
        """A tensor handle for ``x``; Python scalars become constants matching ``other``."""
        if isinstance(x, V):
            return x
        return self.const(x, scalar_dtype(x, other.dtype))


def scalar_dtype(x: Any, other: str) -> str:
    """The dtype torch gives a Python scalar next to a tensor of dtype ``other``."""
    if isinstance(x, bool):
        return other
    if isinstance(x, int):
        return "i64" if other == "bool" else other
    return other if is_float(other) else "f32"


def _dims(dims: Any, rank: int) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({d % max(rank, 1) for d in dims}))


def _dim(dim: int, rank: int) -> int:
    return dim % max(rank, 1)


Converter = Callable[[Ctx, dict[str, Any]], Any]
CONVERTERS: dict[str, Converter] = {}


def converts(*names: str) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for name in names:
            assert name not in CONVERTERS, name
            CONVERTERS[name] = fn
        return fn

    return register


# -- identities --------------------------------------------------------------------------------


@converts("aten.clone", "aten.alias", "aten.detach", "aten.lift_fresh_copy", "aten.contiguous")
def _identity(cx: Ctx, a: dict[str, Any]) -> V:
    return a["self"]


# -- constants ---------------------------------------------------------------------------------


@converts("aten.full", "aten.full_like", "aten.scalar_tensor", "aten.new_full")
def _full(cx: Ctx, a: dict[str, Any]) -> V:
    value = a.get("fill_value", a.get("s"))
    return cx.const(value, cx.out.dtype, cx.out.shape)


@converts("aten.zeros", "aten.zeros_like", "aten.new_zeros")
def _zeros(cx: Ctx, a: dict[str, Any]) -> V:
    return cx.const(0, cx.out.dtype, cx.out.shape)


@converts("aten.ones", "aten.ones_like", "aten.new_ones")
def _ones(cx: Ctx, a: dict[str, Any]) -> V:
    return cx.const(1, cx.out.dtype, cx.out.shape)


@converts("aten.arange")
def _arange(cx: Ctx, a: dict[str, Any]) -> V:
    start = a.get("start", 0) if "end" in a else 0
    end = a["end"] if "end" in a else a["start"]
    step = a.get("step", 1)
    return cx.emit("arange", (), {"start": start, "end": end, "step": step,
                                  "dtype": cx.out.dtype})


# -- elementwise -------------------------------------------------------------------------------

_UNARY = {"neg": "neg", "abs": "abs", "sign": "sign", "exp": "exp", "log": "log",
          "log1p": "log1p", "sqrt": "sqrt", "rsqrt": "rsqrt", "reciprocal": "reciprocal",
          "sin": "sin", "cos": "cos", "tanh": "tanh", "sigmoid": "sigmoid", "erf": "erf",
          "relu": "relu", "isnan": "isnan", "logical_not": "logical_not",
          "bitwise_not": "bitwise_not"}


def _unary_converter(op: str) -> Converter:
    return lambda cx, a: cx.emit(op, (a["self"],))


for _aten, _op in _UNARY.items():
    converts(f"aten.{_aten}")(_unary_converter(_op))

_BINARY = {"mul": "mul", "pow": "pow", "maximum": "maximum", "minimum": "minimum",
           "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
           "logical_and": "logical_and", "logical_or": "logical_or",
           "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or",
           "bitwise_xor": "bitwise_xor"}


def _pair(cx: Ctx, x: Any, y: Any) -> tuple[V, V]:
    if not isinstance(x, V):
        return cx.operand(x, cx.type(y)), y
    return x, cx.operand(y, cx.type(x))


def _binary_converter(op: str) -> Converter:
    def convert(cx: Ctx, a: dict[str, Any]) -> V:
        x, y = _pair(cx, a["self"], a["other"] if "other" in a else a["exponent"])
        return cx.emit(op, (x, y))

    return convert


for _aten, _op in _BINARY.items():
    converts(f"aten.{_aten}")(_binary_converter(_op))


def _scaled(cx: Ctx, y: V, alpha: Any) -> V:
    if alpha is None or alpha == 1:
        return y
    return cx.emit("mul", (y, cx.operand(alpha, cx.type(y))))


@converts("aten.add", "aten.sub")
def _add_sub(cx: Ctx, a: dict[str, Any]) -> V:
    x, y = _pair(cx, a["self"], a["other"])
    op = "add" if cx.origin.source.startswith("aten.add") else "sub"
    return cx.emit(op, (x, _scaled(cx, y, a.get("alpha"))))


@converts("aten.rsub")
def _rsub(cx: Ctx, a: dict[str, Any]) -> V:
    x, y = _pair(cx, a["self"], a["other"])
    return cx.emit("sub", (y, _scaled(cx, x, a.get("alpha"))))


@converts("aten.div")
def _div(cx: Ctx, a: dict[str, Any]) -> V:
    if a.get("rounding_mode") is not None:
        raise UnsupportedOp(f"div with rounding_mode={a['rounding_mode']!r}")
    x, y = _pair(cx, a["self"], a["other"])
    return cx.emit("div", (x, y))


@converts("aten.where")
def _where(cx: Ctx, a: dict[str, Any]) -> V:
    x, y = a["self"], a["other"]
    like = cx.type(x) if isinstance(x, V) else cx.type(y) if isinstance(y, V) else cx.out
    return cx.emit("where", (a["condition"], cx.operand(x, like), cx.operand(y, like)))


@converts("aten.clamp", "aten.clamp_min", "aten.clamp_max")
def _clamp(cx: Ctx, a: dict[str, Any]) -> V:
    low, high = a.get("min"), a.get("max")
    if isinstance(low, V) or isinstance(high, V):
        raise UnsupportedOp("clamp with tensor bounds")
    return cx.emit("clamp", (a["self"],), {"min": low, "max": high})


@converts("aten.gelu")
def _gelu(cx: Ctx, a: dict[str, Any]) -> V:
    return cx.emit("gelu", (a["self"],), {"approximate": a.get("approximate", "none")})


@converts("aten._assert_tensor_metadata", "aten._assert_scalar", "aten._assert_async",
          "aten.sym_constrain_range")
def _no_value(cx: Ctx, a: dict[str, Any]) -> None:
    return None


@converts("aten._to_copy", "aten.to")
def _to_copy(cx: Ctx, a: dict[str, Any]) -> V:
    x = a["self"]
    if cx.type(x).dtype == cx.out.dtype:
        return x
    return cx.emit("convert", (x,), {"dtype": cx.out.dtype})


@converts("aten.copy")
def _copy(cx: Ctx, a: dict[str, Any]) -> V:
    src, out = a["src"], cx.out
    if cx.type(src).shape != out.shape:
        src = cx.emit("expand", (src,), {"shape": out.shape})
    if cx.type(src).dtype != out.dtype:
        src = cx.emit("convert", (src,), {"dtype": out.dtype})
    return src


# -- reductions --------------------------------------------------------------------------------


def _reduction(op: str) -> Converter:
    def convert(cx: Ctx, a: dict[str, Any]) -> V:
        x = a["self"]
        if a.get("dtype") is not None and DTYPES[a["dtype"]] != cx.type(x).dtype:
            x = cx.emit("convert", (x,), {"dtype": DTYPES[a["dtype"]]})
        dims = _dims(a.get("dim"), cx.type(x).rank)
        if not dims:
            return x
        return cx.emit(op, (x,), {"dims": dims, "keepdim": bool(a.get("keepdim", False))})

    return convert


converts("aten.sum")(_reduction("sum"))
converts("aten.mean")(_reduction("mean"))
converts("aten.any")(_reduction("any"))


def _variance(cx: Ctx, a: dict[str, Any]) -> tuple[V, V]:
    """(var, mean) over dims: sum((x - mean)^2) / (N - correction), as IR arithmetic."""
    x, t = a["self"], cx.type(a["self"])
    dims = _dims(a.get("dim"), t.rank)
    keep = bool(a.get("keepdim", False))
    correction = a.get("correction")
    correction = 1 if correction is None else correction
    count = 1
    for d in dims:
        count *= t.shape[d]
    mean_kept = cx.emit("mean", (x,), {"dims": dims, "keepdim": True})
    centered = cx.emit("sub", (x, mean_kept))
    squares = cx.emit("mul", (centered, centered))
    total = cx.emit("sum", (squares,), {"dims": dims, "keepdim": keep})
    var = cx.emit("div", (total, cx.const(count - correction, t.dtype)))
    mean = mean_kept if keep else cx.emit("squeeze", (mean_kept,), {"dims": dims})
    return var, mean


@converts("aten.var_mean")
def _var_mean(cx: Ctx, a: dict[str, Any]) -> tuple[V, V]:
    return _variance(cx, a)


@converts("aten.var")
def _var(cx: Ctx, a: dict[str, Any]) -> V:
    return _variance(cx, a)[0]


@converts("aten.amax", "aten.amin")
def _amax(cx: Ctx, a: dict[str, Any]) -> V:
    op = "amax" if cx.origin.source.startswith("aten.amax") else "amin"
    dims = _dims(a.get("dim"), cx.type(a["self"]).rank)
    return cx.emit(op, (a["self"],), {"dims": dims, "keepdim": bool(a.get("keepdim", False))})


@converts("aten.max")
def _max(cx: Ctx, a: dict[str, Any]) -> Any:
    x = a["self"]
    if "other" in a:
        return cx.emit("maximum", _pair(cx, x, a["other"]))
    if "dim" not in a:
        return cx.emit("amax", (x,), {"dims": _dims(None, cx.type(x).rank), "keepdim": False})
    dim, keep = _dim(a["dim"], cx.type(x).rank), bool(a.get("keepdim", False))
    return (lambda: cx.emit("amax", (x,), {"dims": (dim,), "keepdim": keep}),
            lambda: cx.emit("argmax", (x,), {"dim": dim, "keepdim": keep}))


@converts("aten.argmax")
def _argmax(cx: Ctx, a: dict[str, Any]) -> V:
    if a.get("dim") is None:
        raise UnsupportedOp("argmax without dim")
    dim = _dim(a["dim"], cx.type(a["self"]).rank)
    return cx.emit("argmax", (a["self"],), {"dim": dim, "keepdim": bool(a.get("keepdim"))})


@converts("aten.cumsum")
def _cumsum(cx: Ctx, a: dict[str, Any]) -> V:
    x = a["self"]
    if a.get("dtype") is not None and DTYPES[a["dtype"]] != cx.type(x).dtype:
        x = cx.emit("convert", (x,), {"dtype": DTYPES[a["dtype"]]})
    return cx.emit("cumsum", (x,), {"dim": _dim(a["dim"], cx.type(x).rank)})


# -- contractions ------------------------------------------------------------------------------


@converts("aten.mm", "aten.bmm")
def _mm(cx: Ctx, a: dict[str, Any]) -> V:
    op = "bmm" if cx.origin.source.startswith("aten.bmm") else "mm"
    return cx.emit(op, (a["self"], a["mat2"]))


@converts("aten.addmm")
def _addmm(cx: Ctx, a: dict[str, Any]) -> V:
    product = _scaled(cx, cx.emit("mm", (a["mat1"], a["mat2"])), a.get("alpha"))
    return cx.emit("add", (_scaled(cx, a["self"], a.get("beta")), product))


# -- views -------------------------------------------------------------------------------------


@converts("aten.view", "aten._unsafe_view", "aten.reshape", "aten.view_copy")
def _reshape(cx: Ctx, a: dict[str, Any]) -> V:
    if cx.type(a["self"]).shape == cx.out.shape:
        return a["self"]
    return cx.emit("reshape", (a["self"],), {"shape": cx.out.shape})


@converts("aten.expand")
def _expand(cx: Ctx, a: dict[str, Any]) -> V:
    if cx.type(a["self"]).shape == cx.out.shape:
        return a["self"]
    return cx.emit("expand", (a["self"],), {"shape": cx.out.shape})


@converts("aten.repeat")
def _repeat(cx: Ctx, a: dict[str, Any]) -> V:
    """x.repeat(k0, k1, ...) as reshape (size-1 dim before each) + expand + reshape."""
    x, repeats = a["self"], tuple(a["repeats"])
    shape = (1,) * (len(repeats) - cx.type(x).rank) + cx.type(x).shape
    spread = tuple(v for s in shape for v in (1, s))
    tiled = tuple(v for k, s in zip(repeats, shape, strict=True) for v in (k, s))
    x = cx.emit("reshape", (x,), {"shape": spread}) if spread != cx.type(x).shape else x
    x = cx.emit("expand", (x,), {"shape": tiled})
    return cx.emit("reshape", (x,), {"shape": cx.out.shape})


@converts("aten.permute")
def _permute(cx: Ctx, a: dict[str, Any]) -> V:
    rank = cx.type(a["self"]).rank
    return cx.emit("permute", (a["self"],), {"dims": tuple(_dim(d, rank) for d in a["dims"])})


@converts("aten.transpose", "aten.t")
def _transpose(cx: Ctx, a: dict[str, Any]) -> V:
    rank = cx.type(a["self"]).rank
    dims = list(range(rank))
    d0, d1 = _dim(a.get("dim0", 0), rank), _dim(a.get("dim1", 1 if rank > 1 else 0), rank)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return cx.emit("permute", (a["self"],), {"dims": tuple(dims)})


@converts("aten.unsqueeze")
def _unsqueeze(cx: Ctx, a: dict[str, Any]) -> V:
    return cx.emit("unsqueeze", (a["self"],), {"dim": a["dim"] % (cx.type(a["self"]).rank + 1)})


@converts("aten.squeeze")
def _squeeze(cx: Ctx, a: dict[str, Any]) -> V:
    shape = cx.type(a["self"]).shape
    dims = tuple(d for d in _dims(a.get("dim"), len(shape)) if shape[d] == 1)
    if not dims:
        return a["self"]
    return cx.emit("squeeze", (a["self"],), {"dims": dims})


@converts("aten.flip")
def _flip(cx: Ctx, a: dict[str, Any]) -> V:
    return cx.emit("flip", (a["self"],), {"dims": _dims(a["dims"], cx.type(a["self"]).rank)})


# -- slicing and indexing ----------------------------------------------------------------------


def _slice_attrs(size: int, a: dict[str, Any], dim: int) -> dict[str, Any]:
    start, end, step = slice(a.get("start"), a.get("end"), a.get("step") or 1).indices(size)
    end = max(start, end)
    return {"dim": dim, "start": start, "end": end, "step": step}


@converts("aten.slice")
def _slice(cx: Ctx, a: dict[str, Any]) -> V:
    t = cx.type(a["self"])
    dim = _dim(a.get("dim", 0), t.rank)
    attrs = _slice_attrs(t.shape[dim], a, dim)
    if (attrs["start"], attrs["end"], attrs["step"]) == (0, t.shape[dim], 1):
        return a["self"]
    return cx.emit("slice", (a["self"],), attrs)


@converts("aten.slice_scatter")
def _slice_scatter(cx: Ctx, a: dict[str, Any]) -> V:
    t = cx.type(a["self"])
    dim = _dim(a.get("dim", 0), t.rank)
    return cx.emit("slice_scatter", (a["self"], a["src"]), _slice_attrs(t.shape[dim], a, dim))


def _select_attrs(cx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    t = cx.type(a["self"])
    dim = _dim(a["dim"], t.rank)
    return {"dim": dim, "index": a["index"] % t.shape[dim]}


@converts("aten.split_with_sizes", "aten.split", "aten.unsafe_split")
def _split(cx: Ctx, a: dict[str, Any]) -> tuple[Callable[[], V], ...]:
    x, t = a["self"], cx.type(a["self"])
    dim = _dim(a.get("dim", 0), t.rank)
    sizes = a.get("split_sizes", a.get("split_size"))
    if isinstance(sizes, int):
        sizes = [min(sizes, t.shape[dim] - s) for s in range(0, t.shape[dim], sizes)]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]

    def piece(start: int, size: int) -> Callable[[], V]:
        attrs = {"dim": dim, "start": start, "end": start + size, "step": 1}
        return lambda: cx.emit("slice", (x,), attrs)

    return tuple(piece(start, size) for start, size in zip(starts, sizes, strict=True))


@converts("aten.select")
def _select(cx: Ctx, a: dict[str, Any]) -> V:
    return cx.emit("select", (a["self"],), _select_attrs(cx, a))


@converts("aten.select_scatter")
def _select_scatter(cx: Ctx, a: dict[str, Any]) -> V:
    return cx.emit("select_scatter", (a["self"], a["src"]), _select_attrs(cx, a))


@converts("aten.cat")
def _cat(cx: Ctx, a: dict[str, Any]) -> V:
    tensors = tuple(t for t in a["tensors"] if cx.type(t).shape != (0,))
    if len(tensors) == 1:
        return tensors[0]
    return cx.emit("cat", tensors, {"dim": _dim(a.get("dim", 0), cx.out.rank)})


@converts("aten.gather")
def _gather(cx: Ctx, a: dict[str, Any]) -> V:
    dim = _dim(a["dim"], cx.type(a["self"]).rank)
    return cx.emit("gather", (a["self"], a["index"]), {"dim": dim})


@converts("aten.scatter", "aten.scatter_add")
def _scatter(cx: Ctx, a: dict[str, Any]) -> V:
    if a.get("reduce") is not None:
        raise UnsupportedOp(f"scatter with reduce={a['reduce']!r}")
    dest, index = a["self"], a["index"]
    src = a.get("src", a.get("value"))
    if not isinstance(src, V):
        src = cx.const(src, cx.type(dest).dtype, cx.type(index).shape)
    op = "scatter_add" if cx.origin.source.startswith("aten.scatter_add") else "scatter"
    return cx.emit(op, (dest, index, src), {"dim": _dim(a["dim"], cx.type(dest).rank)})


@converts("aten.scatter_reduce")
def _scatter_reduce(cx: Ctx, a: dict[str, Any]) -> V:
    if a["reduce"] != "sum" or not a.get("include_self", True):
        raise UnsupportedOp(f"scatter_reduce with reduce={a['reduce']!r}")
    dim = _dim(a["dim"], cx.type(a["self"]).rank)
    return cx.emit("scatter_add", (a["self"], a["index"], a["src"]), {"dim": dim})


def _adjacent_indices(indices: Any) -> tuple[int, tuple[V, ...]]:
    """(number of leading full slices, the index tensors): ``x[:, :, i, j]``."""
    indices = list(indices)
    while indices and indices[-1] is None:
        indices.pop()
    skip = 0
    while skip < len(indices) and indices[skip] is None:
        skip += 1
    if any(i is None for i in indices[skip:]):
        raise UnsupportedOp("advanced indexing with non-adjacent index tensors")
    return skip, tuple(indices[skip:])


@converts("aten.index")
def _index(cx: Ctx, a: dict[str, Any]) -> V:
    skip, indices = _adjacent_indices(a["indices"])
    return cx.emit("index", (a["self"],) + indices, {"skip": skip})


@converts("aten.index_put")
def _index_put(cx: Ctx, a: dict[str, Any]) -> V:
    skip, indices = _adjacent_indices(a["indices"])
    return cx.emit("index_put", (a["self"], a["values"]) + indices,
                   {"accumulate": bool(a.get("accumulate", False)), "skip": skip})


@converts("aten.index_select")
def _index_select(cx: Ctx, a: dict[str, Any]) -> V:
    dim = _dim(a["dim"], cx.type(a["self"]).rank)
    return cx.emit("index_select", (a["self"], a["index"]), {"dim": dim})


@converts("aten.embedding")
def _embedding(cx: Ctx, a: dict[str, Any]) -> V:
    return cx.emit("embedding", (a["weight"], a["indices"]))


# -- softmax family ----------------------------------------------------------------------------


@converts("aten._softmax", "aten._log_softmax")
def _softmax(cx: Ctx, a: dict[str, Any]) -> V:
    op = "log_softmax" if "log" in cx.origin.source else "softmax"
    x = a["self"]
    if cx.type(x).dtype != cx.out.dtype:
        x = cx.emit("convert", (x,), {"dtype": cx.out.dtype})
    return cx.emit(op, (x,), {"dim": _dim(a["dim"], cx.type(x).rank)})


@converts("aten._softmax_backward_data", "aten._log_softmax_backward_data")
def _softmax_backward(cx: Ctx, a: dict[str, Any]) -> V:
    op = "log_softmax_backward" if "log" in cx.origin.source else "softmax_backward"
    dim = _dim(a["dim"], cx.type(a["output"]).rank)
    return cx.emit(op, (a["grad_output"], a["output"]), {"dim": dim})


# -- ordering ----------------------------------------------------------------------------------


@converts("aten.topk")
def _topk(cx: Ctx, a: dict[str, Any]) -> tuple[Callable[[], V], ...]:
    x = a["self"]
    attrs = {"k": a["k"], "dim": _dim(a.get("dim", -1), cx.type(x).rank),
             "largest": bool(a.get("largest", True))}
    return (lambda: cx.emit("topk_values", (x,), attrs),
            lambda: cx.emit("topk_indices", (x,), attrs))


@converts("aten.sort")
def _sort(cx: Ctx, a: dict[str, Any]) -> tuple[Callable[[], V], ...]:
    x = a["self"]
    attrs = {"dim": _dim(a.get("dim", -1), cx.type(x).rank),
             "descending": bool(a.get("descending", False))}
    return (lambda: cx.emit("sort_values", (x,), attrs),
            lambda: cx.emit("sort_indices", (x,), attrs))


# -- collectives of lowered local programs (trainverify_dsl.lower.collectives) -------------------

#: ``tvp.collective`` kind -> IR op (``ir/collectives.py``; the IR's ``scatter`` is the index op,
#: hence ``local_scatter``)
_COLLECTIVE_OPS = IR_OPS


@converts("tvp.collective")
def _collective(cx: Ctx, a: dict[str, Any]) -> V:
    x, kind = a["x"], a["kind"]
    if kind == "identity":
        return x
    if kind not in _COLLECTIVE_OPS:
        raise UnsupportedOp(f"tvp.collective of kind {kind!r}")
    rank = cx.type(x).rank
    attrs: dict[str, Any] = {"axis": a["axes"], "group_size": a["group_size"]}
    if kind in ("all_reduce", "reduce_scatter"):
        attrs["op"] = a["op"]
    if kind == "all_to_all":
        attrs["split_dim"] = _dim(a["dim"], rank)
        attrs["concat_dim"] = _dim(a["dim2"], rank)
    elif kind != "all_reduce":
        attrs["dim"] = _dim(a["dim"], rank)
    return cx.emit(_COLLECTIVE_OPS[kind], (x,), attrs)


# -- marked points (trainverify_dsl.spec.marks) -------------------------------------------------


@converts("tvp.mark")
def _mark(cx: Ctx, a: dict[str, Any]) -> V:
    """An identity whose value is the graph output ``point:<point>``; a module called twice
    marks its point twice, and the last call's value is the point's (as a forward hook
    recording it would see)."""
    x = a["x"]
    cx.builder.set_output(f"{POINT}{a['point']}", x.id)
    return x


# -- driver ------------------------------------------------------------------------------------


def packet_name(target: Any) -> str:
    """``aten.add`` for ``aten.add.Tensor``; ``getitem`` for ``operator.getitem``."""
    if target is operator.getitem:
        return "getitem"
    packet = getattr(target, "overloadpacket", None)
    if packet is None:
        return str(target)
    return f"{packet._qualified_op_name.replace('::', '.')}"


def bind_arguments(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The op's arguments by schema name (absent optional arguments get their defaults)."""
    bound: dict[str, Any] = {}
    for i, argument in enumerate(target._schema.arguments):
        if i < len(args):
            bound[argument.name] = args[i]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
    return bound


def convert_call(builder: GraphBuilder, target: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any], out: Any, origin: Origin) -> Any:
    """Emit the IR for one ATen call; returns a ``V`` (or lazy tuple for multi-output ops)."""
    name = packet_name(target)
    converter = CONVERTERS.get(name)
    if converter is None:
        raise UnsupportedOp(name)
    ctx = Ctx(builder, out, origin)
    result = converter(ctx, bind_arguments(target, args, kwargs))
    if isinstance(result, V) and out is not None and not isinstance(out, (tuple, list)):
        produced = builder.value_type(result.id)
        expected = tensor_type(out)
        if produced != expected:
            raise UnsupportedOp(f"{name}: converted type {produced} differs from {expected}")
    return result
