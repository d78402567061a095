"""The exact symbolic domain: every IR op on tensors of ``check/terms.py`` values.

Float tensors are numpy object arrays of ``Poly`` (or ``Inf`` where a program masks with
``-inf``); integer and boolean tensors are ordinary numpy arrays when their values are known
(token ids, positions, masks built from ``arange``) and object arrays of symbolic booleans
otherwise. ``ENCODINGS`` holds one entry per op of the registry (``ir/ops.py``): either
``NUMPY`` (the registry's own numpy evaluation is exact on object arrays: views, slicing,
indexing by known integers, concatenation, data-moving collectives, ``+ - * /``) or a
function giving the op's exact meaning. An op whose entry raises ``Unsupported`` for the
values at hand (``topk`` of symbolic scores, an index that depends on a symbolic value) makes
the verdict ``inconclusive`` with the reason, never ``verified``.

``SymbolicDomain`` plugs this into the IR interpreter (``ir/interp.py``), so the parallel
program and the reference step run here with exactly the meaning they have numerically.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from trainverify_dsl.check import terms as t
from trainverify_dsl.check.terms import INF, NEG_INF, Inf, NonReal, Poly
from trainverify_dsl.ir.graph import Node
from trainverify_dsl.ir.interp import NUMERIC, Domain
from trainverify_dsl.ir.ops import OPS, norm_dim
from trainverify_dsl.ir.ops import _gelu as _gelu_numeric
from trainverify_dsl.ir.types import TensorType, is_float


class Unsupported(Exception):
    """The op has no exact meaning for these values here (the verdict is inconclusive)."""


#: The op's numpy evaluation is exact on object arrays (the registry's own meaning).
NUMPY = "numpy"

Encoding = Callable[[tuple[Any, ...], Mapping[str, Any], Node], Any]


# -- helpers ----------------------------------------------------------------------------------


def _symbolic(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == object


def _obj(x: Any, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``x`` as an object array (a scalar result of ``frompyfunc`` becomes 0-d)."""
    if isinstance(x, np.ndarray) and x.dtype == object:
        return x
    if isinstance(x, np.ndarray):
        out = np.empty(x.shape, dtype=object)
        out[...] = x
        return out
    out = np.empty((), dtype=object)
    out[()] = x
    return out


def _number(x: Any) -> Any:
    """A float element as a term: ``Poly`` constant, ``Inf``; a term unchanged."""
    if isinstance(x, (Poly, Inf)):
        return x
    if isinstance(x, t.Term):
        return t.ite(x, t.ONE, t.ZERO)  # a symbolic boolean used as a number
    if isinstance(x, (bool, np.bool_)):
        return t.ONE if x else t.ZERO
    value = float(x) if not isinstance(x, (int, np.integer, Fraction)) else x
    if isinstance(value, float):
        if math.isnan(value):
            raise NonReal("a NaN constant")
        if math.isinf(value):
            return INF if value > 0 else NEG_INF
    return Poly.constant(value)


_to_number = np.frompyfunc(_number, 1, 1)


def floats(x: Any) -> np.ndarray:
    """A float tensor of terms (numbers converted exactly)."""
    return _obj(_to_number(np.asarray(x, dtype=object) if not isinstance(x, np.ndarray)
                           else x))


def _map(fn: Callable[..., Any], *arrays: Any) -> np.ndarray:
    return _obj(np.frompyfunc(fn, len(arrays), 1)(*arrays))


def _concrete_bools(x: np.ndarray) -> np.ndarray:
    """Booleans as a bool array when every one is known, else an object array."""
    if x.dtype == object and all(isinstance(v, (bool, np.bool_)) for v in x.flat):
        return x.astype(bool)
    return x


def _rows(x: np.ndarray, dims: tuple[int, ...]) -> tuple[np.ndarray, tuple[int, ...]]:
    """``x`` with ``dims`` moved last and flattened: ``(rows, shape of the kept dims)``."""
    dims = tuple(sorted(norm_dim(d, x.ndim) for d in dims))
    kept = tuple(d for d in range(x.ndim) if d not in dims)
    moved = np.transpose(x, kept + dims)
    kept_shape = tuple(x.shape[d] for d in kept)
    return moved.reshape((math.prod(kept_shape), -1)), kept_shape


def _reduce(x: np.ndarray, dims: tuple[int, ...], keepdim: bool,
            fn: Callable[[list[Any]], Any]) -> np.ndarray:
    rows, kept_shape = _rows(x, dims)
    out = np.empty(rows.shape[0], dtype=object)
    for i in range(rows.shape[0]):
        out[i] = fn(list(rows[i]))
    out = out.reshape(kept_shape)
    if keepdim:
        for d in sorted(norm_dim(d, x.ndim) for d in dims):
            out = np.expand_dims(out, d)
    return out


def _sum(values: list[Any]) -> Any:
    infinite = [v for v in values if isinstance(v, Inf)]
    if infinite:
        total = infinite[0]
        for v in infinite[1:]:
            total = total + v
        return total
    return Poly.sum(values)


def _along(x: np.ndarray, dim: int, fn: Callable[[list[Any]], list[Any]]) -> np.ndarray:
    """``fn`` on each 1-d slice along ``dim`` (softmax and its family)."""
    dim = norm_dim(dim, x.ndim)
    moved = np.moveaxis(x, dim, -1)
    flat = moved.reshape((-1, moved.shape[-1]))
    out = np.empty(flat.shape, dtype=object)
    for i in range(flat.shape[0]):
        out[i, :] = fn(list(flat[i]))
    return np.moveaxis(out.reshape(moved.shape), -1, dim)


# -- elementwise ------------------------------------------------------------------------------


def _unary(fn: Callable[[Any], Any]) -> Encoding:
    def encode(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
        return _map(fn, floats(args[0]))
    return encode


def _app(name: str, at_neg_inf: Any = None, at_inf: Any = None) -> Callable[[Any], Any]:
    def fn(x: Any) -> Any:
        if isinstance(x, Inf):
            value = at_inf if x.sign > 0 else at_neg_inf
            if value is None:
                raise NonReal(f"{name}({x!r})")
            return value
        return t.app(name, x)
    return fn


def _exp(x: Any) -> Any:
    if isinstance(x, Inf):
        return INF if x.sign > 0 else t.ZERO
    return t.exp(x)


def _sqrt(x: Any) -> Any:
    if isinstance(x, Inf):
        raise NonReal("sqrt of an infinity")
    return t.app("sqrt", x)


def _rsqrt(x: Any) -> Any:
    return _sqrt(x).inverse()


def _reciprocal(x: Any) -> Any:
    if isinstance(x, Inf):
        return t.ZERO
    return x.inverse()


def _pow(x: Any, y: Any) -> Any:
    if isinstance(x, Inf) or isinstance(y, Inf):
        raise NonReal("a power of an infinity")
    if y.is_const and y.const.denominator == 1:
        return x.power(int(y.const))
    if y.is_const and y.const == Fraction(1, 2):
        return _sqrt(x)
    return t.app("pow", x, y)


def _gelu(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
    return _map(_app(f"gelu[{a['approximate']}]"), floats(args[0]))


def _lattice2(kind: str) -> Encoding:
    def encode(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
        if not is_float(node.dtype):
            return _numeric(node, args)
        return _map(lambda x, y: t.lattice(kind, (x, y)), floats(args[0]), floats(args[1]))
    return encode


def _clamp(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
    def fn(x: Any) -> Any:
        if a["min"] is not None:
            x = t.lattice("max", (x, _number(a["min"])))
        if a["max"] is not None:
            x = t.lattice("min", (x, _number(a["max"])))
        return x
    return _map(fn, floats(args[0]))


def _compare(op: str) -> Encoding:
    def encode(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
        x, y = args
        if not _symbolic(x) and not _symbolic(y):
            return _numeric(node, args)
        return _concrete_bools(_map(lambda p, q: t.compare(op, _number(p), _number(q)), x, y))
    return encode


def _as_bool(x: Any) -> Any:
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (Poly, Inf)):
        return t.compare("!=", _number(x), t.ZERO)
    if isinstance(x, t.Term):
        return x
    return bool(x)


def _logical(op: str) -> Encoding:
    def encode(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
        if not any(_symbolic(x) for x in args):
            return _numeric(node, args)
        if node.dtype != "bool" and op != "not":
            raise Unsupported(f"{node.op} of symbolic integers")
        if op == "not":
            return _concrete_bools(_map(lambda p: t.negate(_as_bool(p)), args[0]))
        return _concrete_bools(_map(lambda p, q: t.bool_op(op, _as_bool(p), _as_bool(q)),
                                    args[0], args[1]))
    return encode


def _where(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
    cond, x, y = args
    if not is_float(node.dtype):
        if _symbolic(x) or _symbolic(y) or _symbolic(cond):
            raise Unsupported("an integer `where` on symbolic values")
        return _numeric(node, args)
    x, y = floats(x), floats(y)
    if not _symbolic(cond):
        return _obj(np.where(cond, x, y))
    return _map(lambda c, p, q: t.ite(_as_bool(c), p, q), cond, x, y)


def _isnan(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
    if not _symbolic(args[0]):
        return _numeric(node, args)
    return np.zeros(args[0].shape, dtype=bool)  # no real number is NaN (an assumption)


def _convert(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
    x, dtype = args[0], a["dtype"]
    if is_float(dtype):
        return floats(x)
    if not _symbolic(x):
        return _numeric(node, args)
    if dtype == "bool":
        return _concrete_bools(_map(_as_bool, x))
    raise Unsupported(f"converting a symbolic value to {dtype}")


def _relu(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
    return _map(lambda x: t.lattice("max", (x, t.ZERO)), floats(args[0]))


def _arith(op: str) -> Encoding:
    """``add sub mul div``: exact on terms, numeric on known integers."""
    fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
          "div": lambda x, y: x / y}[op]

    def encode(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
        if not is_float(node.dtype):
            if any(_symbolic(x) for x in args):
                raise Unsupported(f"integer `{op}` of symbolic values")
            return _numeric(node, args)
        return _map(fn, floats(args[0]), floats(args[1]))
    return encode


# -- reductions, contractions, softmax -----------------------------------------------------------


def _reduction(kind: str) -> Encoding:
    def encode(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
        x = args[0]
        if not _symbolic(x) and not is_float(node.dtype):
            return _numeric(node, args)
        dims, keep = tuple(a["dims"]), a["keepdim"]
        if kind == "any":
            def fn(vals: list[Any]) -> Any:
                out: Any = False
                for v in vals:
                    out = t.bool_op("or", out, _as_bool(v))
                return out
            return _concrete_bools(_reduce(x, dims, keep, fn))
        if not is_float(node.dtype):
            raise Unsupported(f"{node.op} of symbolic integers")
        x = floats(x)
        if kind == "sum":
            return _reduce(x, dims, keep, _sum)
        if kind == "mean":
            n = math.prod(x.shape[norm_dim(d, x.ndim)] for d in dims)
            return _reduce(x, dims, keep, lambda vals: _sum(vals) / n)
        return _reduce(x, dims, keep, lambda vals: t.lattice(kind, vals))
    return encode


def _matmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    m, k = x.shape
    n = y.shape[1]
    out = np.empty((m, n), dtype=object)
    columns = [list(y[:, j]) for j in range(n)]
    for i in range(m):
        row = list(x[i])
        for j in range(n):
            col = columns[j]
            total = t.dot(row, col)
            out[i, j] = total if total is not None else _sum([row[p] * col[p]
                                                                for p in range(k)])
    return out


def _mm(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
    return _matmul(floats(args[0]), floats(args[1]))


def _bmm(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
    x, y = floats(args[0]), floats(args[1])
    return np.stack([_matmul(x[b], y[b]) for b in range(x.shape[0])]) if x.shape[0] else \
        np.empty(node.shape, dtype=object)


def _softmax_row(row: list[Any]) -> list[Any]:
    top = t.lattice("max", row)
    e = [_exp(v - top) for v in row]
    total = _sum(e)
    return [v / total for v in e]


def _log_softmax_row(row: list[Any]) -> list[Any]:
    top = t.lattice("max", row)
    shifted = [v - top for v in row]
    log_total = t.app("log", _sum([_exp(v) for v in shifted]))
    return [v - log_total for v in shifted]


def _softmax(kind: str) -> Encoding:
    def encode(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
        x = floats(args[0])
        if kind == "softmax":
            return _along(x, a["dim"], _softmax_row)
        if kind == "log_softmax":
            return _along(x, a["dim"], _log_softmax_row)
        grad, out = floats(args[0]), floats(args[1])
        dim = norm_dim(a["dim"], grad.ndim)
        if kind == "softmax_backward":  # out * (grad - sum(grad * out))
            prod = _map(lambda g, o: g * o, grad, out)
            total = _reduce(prod, (dim,), True, _sum)
            return _map(lambda g, o, s: o * (g - s), grad, out, total)
        total = _reduce(grad, (dim,), True, _sum)  # grad - exp(out) * sum(grad)
        return _map(lambda g, o, s: g - _exp(o) * s, grad, out, total)
    return encode


def _ordering(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
    if _symbolic(args[0]):
        raise Unsupported(f"`{node.op}` of symbolic values (an order that depends on the "
                          "values is a case split the checker does not make)")
    return _numeric(node, args)


def _integer_only(args: tuple[Any, ...], a: Mapping[str, Any], node: Node) -> Any:
    if any(_symbolic(x) for x in args):
        raise Unsupported(f"`{node.op}` of symbolic values")
    return _numeric(node, args)


def _numeric(node: Node, args: tuple[Any, ...]) -> Any:
    """Known integers and booleans: the registry's exact numpy evaluation."""
    from trainverify_dsl.ir.interp import run_node

    return run_node(node, args)


ENCODINGS: dict[str, str | Encoding] = {
    "full": NUMPY, "arange": NUMPY, "literal": NUMPY,
    "neg": _unary(lambda x: -x), "abs": _unary(_app("abs", INF, INF)),
    "sign": _unary(_app("sign", Poly.constant(-1), Poly.constant(1))),
    "exp": _unary(_exp), "log": _unary(_app("log", None, INF)),
    "log1p": _unary(_app("log1p", None, INF)), "sqrt": _unary(_sqrt),
    "rsqrt": _unary(_rsqrt), "reciprocal": _unary(_reciprocal),
    "sin": _unary(_app("sin")), "cos": _unary(_app("cos")),
    "tanh": _unary(_app("tanh", Poly.constant(-1), Poly.constant(1))),
    "sigmoid": _unary(_app("sigmoid", t.ZERO, t.ONE)),
    "erf": _unary(_app("erf", Poly.constant(-1), Poly.constant(1))),
    "relu": _relu, "isnan": _isnan,
    "logical_not": _logical("not"), "bitwise_not": _logical("not"),
    "gelu": _gelu, "clamp": _clamp, "convert": _convert,
    "add": _arith("add"), "sub": _arith("sub"), "mul": _arith("mul"), "div": _arith("div"),
    "pow": lambda args, a, node: _map(_pow, floats(args[0]), floats(args[1]))
    if is_float(node.dtype) else _integer_only(args, a, node),
    "maximum": _lattice2("max"), "minimum": _lattice2("min"),
    "eq": _compare("=="), "ne": _compare("!="), "lt": _compare("<"), "le": _compare("<="),
    "gt": _compare(">"), "ge": _compare(">="),
    "logical_and": _logical("and"), "logical_or": _logical("or"),
    "bitwise_and": _logical("and"), "bitwise_or": _logical("or"),
    "bitwise_xor": _logical("xor"),
    "where": _where,
    "sum": _reduction("sum"), "mean": _reduction("mean"), "amax": _reduction("max"),
    "amin": _reduction("min"), "any": _reduction("any"),
    "argmax": _ordering, "cumsum": NUMPY,
    "mm": _mm, "bmm": _bmm,
    "reshape": NUMPY, "expand": NUMPY, "permute": NUMPY, "unsqueeze": NUMPY,
    "squeeze": NUMPY, "flip": NUMPY,
    "slice": NUMPY, "slice_scatter": NUMPY, "select": NUMPY, "select_scatter": NUMPY,
    "cat": NUMPY, "gather": NUMPY, "scatter": NUMPY, "scatter_add": NUMPY, "index": NUMPY,
    "index_put": NUMPY, "index_select": NUMPY, "embedding": NUMPY,
    "softmax": _softmax("softmax"), "log_softmax": _softmax("log_softmax"),
    "softmax_backward": _softmax("softmax_backward"),
    "log_softmax_backward": _softmax("log_softmax_backward"),
    "topk_values": _ordering, "topk_indices": _ordering, "sort_values": _ordering,
    "sort_indices": _ordering,
    "all_reduce": NUMPY, "all_gather": NUMPY, "reduce_scatter": NUMPY, "all_to_all": NUMPY,
    "local_scatter": NUMPY, "send_recv": NUMPY,
}

#: Ops whose integer operands must be known (an index that is a symbolic value would need a
#: case split): checked before their numpy evaluation runs.
_INDEX_OPERANDS = {"gather": (1,), "scatter": (1,), "scatter_add": (1,), "index_select": (1,),
                   "embedding": (1,)}


def _combine(per_rank: list[tuple[Any, ...]], op: str) -> Any:
    arrays = [floats(args[0]) for args in per_rank]
    stacked = np.stack(arrays)
    if op in ("sum", "avg"):
        total = _reduce(stacked, (0,), False, _sum)
        return _map(lambda v: v / len(arrays), total) if op == "avg" else total
    if op in ("max", "min"):
        return _reduce(stacked, (0,), False, lambda vals: t.lattice(op, vals))
    raise Unsupported(f"reduce op {op!r}")


#: The ordering ops, and the op giving the order a values op takes (``None``: the op gives
#: indices itself).
ORDERINGS = {"topk_values": "topk_indices", "topk_indices": None,
             "sort_values": "sort_indices", "sort_indices": None, "argmax": None}

#: Two scores closer than this (relative) are a tie: the order is not decided by the witness.
TIE = 1e-9


#: The uninterpreted functions' numeric meaning, to evaluate a term at the witness.
NUMERIC_FUNCTIONS: dict[str, Callable[..., float]] = {
    "exp": math.exp, "log": math.log, "log1p": math.log1p, "sqrt": math.sqrt,
    "sin": math.sin, "cos": math.cos, "tanh": math.tanh, "erf": math.erf,
    "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)), "abs": abs,
    "sign": lambda x: float(np.sign(x)), "pow": lambda x, y: x ** y,
    "gelu[none]": lambda x: float(_gelu_numeric(np.array(x), "none")),
    "gelu[tanh]": lambda x: float(_gelu_numeric(np.array(x), "tanh")),
}


class SymbolicDomain(Domain):
    """Exact values (``ir/interp.Domain``): every op through ``ENCODINGS``.

    ``witness`` (variable name -> number: the numeric pre-check's values) lets an ordering
    of computed values (top-k routing, a sort, an argmax) take the order those values have
    at the witness: the selected elements stay exact terms, the indices are the witness's.
    The proof then holds where every such order is the witnessed one (the verdict says so,
    ``assumed_orders`` counts them); a near-tie at the witness is ``Unsupported``."""

    approximate = False

    def __init__(self, witness: Mapping[str, float] | None = None) -> None:
        #: free values handed out (Rule 5.2): each a fresh variable
        self.free_count = 0
        self.witness = witness
        #: ordering nodes decided by the witness
        self.assumed_orders = 0
        self._memo: dict[int, Any] = {}

    def _at_witness(self, x: np.ndarray) -> np.ndarray:
        out = np.empty(x.shape, dtype=float)
        for index in np.ndindex(*x.shape):
            term = x[index]
            if isinstance(term, Inf):
                out[index] = math.inf * term.sign
                continue
            try:
                out[index] = float(t.evaluate(term, self.witness, NUMERIC_FUNCTIONS, self._memo))
            except KeyError as error:  # a free value: no witness for it
                raise Unsupported(f"an order of values that depend on {error} (no drawn "
                                  "value)") from None
            except (ValueError, OverflowError, ZeroDivisionError) as error:
                raise Unsupported(f"an order of values not computable at the drawn values: "
                                  f"{error}") from None
        return out

    def _ordered(self, node: Node, args: tuple[Any, ...]) -> Any:
        """An ordering op on symbolic values, in the witness's order."""
        x = floats(args[0])
        numeric = self._at_witness(x)
        attrs = node.attr_map()
        _require_separated(node.op, numeric, attrs)
        self.assumed_orders += 1
        indices_op = ORDERINGS[node.op]
        if indices_op is None:
            return np.asarray(OPS[node.op].evaluate((numeric,), attrs)).astype(np.int64)
        order = np.asarray(OPS[indices_op].evaluate((numeric,), attrs))
        return np.take_along_axis(x, order, axis=attrs["dim"])

    def _extreme_test(self, node: Node, args: tuple[Any, ...]) -> Any:
        """``x == max(..., x, ...)`` (and ``!=``, and ``min``) elementwise, decided at the
        witness, or ``None`` when some element is not such a test. The backward of ``amax``
        (``logsumexp``'s stable form, a max-pool) marks the entries equal to the maximum
        and counts them: wherever the order is the witnessed one, with the extreme apart
        from the next value, exactly the witness's extreme entry passes. Counted as an
        assumed order (``assumed_orders``), like top-k routing."""
        x, y = np.broadcast_arrays(np.asarray(args[0], dtype=object),
                                   np.asarray(args[1], dtype=object))
        out = np.empty(x.shape, dtype=bool)
        for index in np.ndindex(*x.shape):
            found = self._is_extreme(x[index], y[index])
            if found is None:
                found = self._is_extreme(y[index], x[index])
            if found is None:
                return None
            out[index] = found if node.op == "eq" else not found
        self.assumed_orders += 1
        return out

    def _is_extreme(self, value: Any, extreme: Any) -> bool | None:
        """Whether ``value`` is the argument ``extreme`` (a ``max``/``min`` poly) takes at the
        witness; ``None`` when ``extreme`` is no such poly of ``value``."""
        if not isinstance(value, Poly) or not isinstance(extreme, Poly):
            return None
        lattice = extreme.single_factor()
        if not isinstance(lattice, t.Lattice) or value not in lattice.args:
            return None
        members = list(lattice.args)
        table = np.empty(len(members), dtype=object)
        for k, member in enumerate(members):
            table[k] = member
        numbers = self._at_witness(table)
        order = np.argsort(numbers)
        if lattice.kind == "max":
            order = order[::-1]
        first, second = numbers[order[0]], numbers[order[1]]
        if first == second or (math.isfinite(first) and math.isfinite(second) and
                               abs(first - second) <= TIE * max(1.0, abs(first), abs(second))):
            raise Unsupported(f"`{lattice.kind}` of computed values that nearly tie at the "
                              "drawn values (its backward's choice is not decided there)")
        return members[int(order[0])] == value

    def bind(self, array: object, type_: TensorType) -> Any:
        value = array if isinstance(array, np.ndarray) else np.asarray(array)
        if value.shape != type_.shape:
            from trainverify_dsl.ir.interp import InterpError

            raise InterpError(f"expected shape {type_.shape}, got {value.shape}")
        if is_float(type_.dtype):
            return floats(value)
        if value.dtype == object:
            return value
        from trainverify_dsl.ir.types import numpy_dtype

        return value.astype(numpy_dtype(type_.dtype))

    def run(self, node: Node, args: tuple[Any, ...]) -> Any:
        t.check_deadline()
        if node.op in ORDERINGS and self.witness is not None and _symbolic(args[0]):
            return self._ordered(node, args)
        if node.op in ("eq", "ne") and self.witness is not None and \
                any(_symbolic(x) for x in args):
            decided = self._extreme_test(node, args)
            if decided is not None:
                return decided
        encoding = ENCODINGS.get(node.op)
        if encoding is None:
            raise Unsupported(f"the op `{node.op}` has no exact encoding")
        for k in _INDEX_OPERANDS.get(node.op, ()):
            if _symbolic(args[k]):
                raise Unsupported(f"`{node.op}` with an index that depends on symbolic values")
        if node.op in ("index", "index_put"):
            first = 1 if node.op == "index" else 2
            if any(_symbolic(x) for x in args[first:]):
                raise Unsupported(f"`{node.op}` with an index that depends on symbolic values")
        if not is_float(node.dtype) and not any(_symbolic(x) for x in args):
            return _numeric(node, args)  # known integers and booleans: exact as they are
        try:
            if encoding == NUMPY:
                operands = tuple(floats(x) if is_float(node.dtype) and
                                 np.asarray(x).dtype.kind == "f" else x for x in args)
                out = OPS[node.op].evaluate(operands, node.attr_map())
            else:
                out = encoding(args, node.attr_map(), node)  # type: ignore[operator]
            return floats(out) if is_float(node.dtype) else out  # a NaN result: NonReal
        except NonReal as error:
            raise Unsupported(f"`{node.op}`: {error} (no real-number meaning)") from None

    def collective(self, op: str, per_rank: list[tuple[Any, ...]], attrs: Mapping[str, Any]
                   ) -> list[Any]:
        if len(per_rank) != attrs["group_size"]:
            raise ValueError(f"collective over {attrs['group_size']} ranks got "
                             f"{len(per_rank)} arrays")
        arrays = [np.asarray(a) for args in per_rank for a in args]
        if arrays and all(a.dtype.kind in "biu" for a in arrays):
            # known integers or booleans (token counts, masks): the numeric meaning, cast back
            # to their dtype as the numeric domain does (an integer `avg` truncates, a boolean
            # `sum` is an or), not exact rationals
            outs = NUMERIC.collective(op, per_rank, attrs)
            return [np.asarray(out).astype(arrays[0].dtype, copy=False) for out in outs]
        if op == "all_reduce":
            total = _combine(per_rank, attrs["op"])
            return [total for _ in per_rank]
        if op == "reduce_scatter":
            total = _combine(per_rank, attrs["op"])
            return list(np.split(total, attrs["group_size"], axis=attrs["dim"]))
        out = OPS[op].evaluate([tuple(floats(a) for a in args) for args in per_rank], attrs)
        return [floats(x) for x in out]

    def fill(self, shape: tuple[int, ...], value: Any) -> Any:
        out = np.empty(shape, dtype=object)
        out[...] = Poly.constant(value)
        return out

    def known(self, value: Any) -> Any:
        """A constant poly's number (a count of integer data: ``nll_loss``'s total weight
        sums constants picked by the known labels), else ``None``."""
        item = np.asarray(value, dtype=object).reshape(()).item()
        if isinstance(item, Poly):
            return item.const if not item.terms else None
        return super().known(value)

    def free(self, shape: tuple[int, ...], key: tuple[Any, ...]) -> np.ndarray:
        """A free value (Rule 5.2: whatever the receive buffer held): fresh variables, so a
        plan that reads one is proven for every value it could hold, or refuted."""
        self.free_count += 1
        stage, value, rank, m = key
        return variables(f"free[{stage}:{value}:r{rank}:m{m}]", shape)


def _require_separated(op: str, numeric: np.ndarray, attrs: Mapping[str, Any]) -> None:
    """The witness decides the order only if the values it ranks are apart: for top-k the
    first ``k + 1`` in order (which ``k`` win, and their order), for argmax the first two,
    for a sort every neighbour."""
    dim = attrs["dim"]
    descending = attrs.get("largest", attrs.get("descending", op == "argmax"))
    ranked = np.sort(numeric, axis=dim)
    if descending:
        ranked = np.flip(ranked, axis=dim)
    n = numeric.shape[dim]
    count = {"topk_values": attrs.get("k", 0) + 1, "topk_indices": attrs.get("k", 0) + 1,
             "argmax": 2}.get(op, n)
    head = np.take(ranked, np.arange(min(count, n)), axis=dim)
    if head.shape[dim] < 2:
        return
    a = np.take(head, np.arange(head.shape[dim] - 1), axis=dim)
    b = np.take(head, np.arange(1, head.shape[dim]), axis=dim)
    with np.errstate(invalid="ignore"):
        gap = np.abs(a - b)
        scale = np.maximum(1.0, np.maximum(np.abs(a), np.abs(b)))
        # a finite value is apart from an infinite one (a group masked with -inf): only two
        # equal infinities tie, which `a == b` finds
        tied = (a == b) | (np.isfinite(a) & np.isfinite(b) & (gap <= TIE * scale))
    if np.any(tied):
        raise Unsupported(f"`{op}` of computed values that nearly tie at the drawn values "
                          "(the order is not decided there)")


def variables(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A tensor of fresh variables ``name[i,j,...]``."""
    out = np.empty(shape, dtype=object)
    for index in np.ndindex(*shape):
        out[index] = t.var(f"{name}[{','.join(map(str, index))}]")
    return out


def encoding_problems() -> list[str]:
    """Ops of the registry without an entry here, and entries for unknown ops (the table's
    completeness, tested)."""
    missing = [f"op {name} has no symbolic encoding" for name in OPS if name not in ENCODINGS]
    unknown = [f"encoding for unknown op {name}" for name in ENCODINGS if name not in OPS]
    return missing + unknown
