"""Layout propagation rules, one entry per ATen op of the captured forward graph.

A rule sees the op's arguments (FX nodes replaced by their ``TLayout``s where it needs them)
and returns the output layout and the arguments of the *local* op: shape arguments of views
and expands become local sizes (docs/semantics.md §4.2 item 1); everything else is the spec's
(constants, reduction dimensions, slice bounds: Rule 4.2). A rule raises ``LayoutError`` when
the local program cannot be formed (operands split differently), and reports softer problems
(a partial sum fed into a nonlinear op) through ``ctx.finding`` without stopping.

Ops without a rule run unchanged if every operand is replicated and complete (then every rank
computes the spec's value); otherwise the lowering stops with "no layout rule".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from trainverify_dsl.ir.layout import (
    Dim,
    Factor,
    LayoutError,
    TLayout,
    broadcast_dim,
    normalize_dim,
    reshape_dims,
    same_dim,
)
from trainverify_dsl.report import codes_lower
from trainverify_dsl.report.diagnostics import Code


class RuleCtx(Protocol):
    sizes: dict[str, int]
    #: the plan origin of the most recent statement behind the op's operands' layouts
    current_cause: Any

    def cause_for(self, axes: Any) -> Any:
        """The plan origin of the most recent statement behind ``axes`` in the operands (a
        partial sum made over them is blamed on it)."""

    def layout(self, value: Any) -> TLayout: ...

    def finding(self, code: Code, message: str, layout: TLayout | None = None) -> None: ...

    def adapt(self, value: Any, layout: TLayout, target: TLayout) -> Any: ...


@dataclass(frozen=True, slots=True)
class Result:
    layout: TLayout | tuple[TLayout, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


Rule = Callable[[RuleCtx, tuple[Any, ...], dict[str, Any], Any], Result]
RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for name in names:
            RULES[name] = fn
        return fn
    return register


def is_node(x: Any) -> bool:
    return isinstance(x, torch.fx.Node)


def _ndim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _any_partial(layouts: Sequence[TLayout]) -> TLayout | None:
    return next((lay for lay in layouts if lay.partial), None)


# -- elementwise --------------------------------------------------------------------------

#: Ops linear in every tensor operand jointly (a partial sum stays a partial sum when all
#: tensor operands are partial over the same axes, or when the others are replicated
#: multipliers — see LINEAR_IN_ONE).
ADDITIVE = {"aten.add", "aten.sub", "aten.neg", "aten.clone", "aten.alias", "aten._to_copy",
            "aten.where", "aten.detach"}
#: Linear in one operand when the others are not partial (x * c, x / c).
LINEAR_IN_ONE = {"aten.mul", "aten.div"}


def _broadcast(ctx: RuleCtx, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
               out: Any) -> Result:
    tensors = [a for a in list(args) + list(kwargs.values()) if is_node(a)]
    layouts = [ctx.layout(a) for a in tensors]
    rank = max((lay.rank for lay in layouts), default=0)
    dims: list[Dim] = []
    for d in range(rank):
        chosen: Dim | None = None
        for lay in layouts:
            k = d - (rank - lay.rank)
            if k < 0:
                continue
            dim = lay.dims[k]
            if normalize_dim(dim) == () and lay.global_shape()[k] == 1:
                continue
            if chosen is None or (not any(f.axes for f in chosen) and any(f.axes for f in dim)):
                chosen = dim
        dims.append(chosen or (Factor(1),))
    target_dims = tuple(dims)
    new_args = list(args)
    new_kwargs = dict(kwargs)
    for i, a in enumerate(args):
        if is_node(a):
            new_args[i] = _conform(ctx, a, target_dims)
    for k, a in kwargs.items():
        if is_node(a):
            new_kwargs[k] = _conform(ctx, a, target_dims)
    const = all(lay.const for lay in layouts)
    result = TLayout(target_dims, None, const)
    partials = [lay for lay in layouts if lay.partial]
    if partials:
        first = partials[0]
        if name in ADDITIVE:
            # a number added to a partial sum (``y + 1.0``) enters it once per rank too
            number = next((a for a in args[1:2] if isinstance(a, (int, float)) and
                           not isinstance(a, bool) and a != 0), None) \
                if name in ("aten.add", "aten.sub") else None
            # an average of (x_r + c) is the average of x_r, plus c: a complete operand or a
            # number added to partial averages (a penalty on the parameters added to the
            # local mean losses) enters their average once
            averages = all(p.partial[0] == "avg" for p in partials)
            if not averages and len(partials) < len(layouts) and name != "aten.where":
                ctx.finding(codes_lower.MIXED_PARTIAL, f"{_op(name)} of a partial sum over "
                            f"{', '.join(first.partial[1])} and a complete operand: the "
                            f"complete operand enters the sum once per rank", first)
            elif not averages and number is not None:
                ctx.finding(codes_lower.MIXED_PARTIAL, f"{_op(name)} of a partial sum over "
                            f"{', '.join(first.partial[1])} and the number {number:g}: the "
                            f"number enters the sum once per rank", first)
            if any(p.partial != first.partial for p in partials):
                ctx.finding(codes_lower.PARTIAL_NONLINEAR, f"{_op(name)} of operands partial over "
                            "different axes", first)
            result = result.with_partial(first.partial, first.cause)
        elif name in LINEAR_IN_ONE and len(partials) == 1 and (
                name == "aten.mul" or partials[0] is layouts[0]):
            result = result.with_partial(first.partial, first.cause)
        else:
            kind = PARTIAL_KINDS.get(first.partial[0], first.partial[0])
            ctx.finding(codes_lower.PARTIAL_NONLINEAR, f"{_op(name)} applied to a partial {kind} "
                        f"over {', '.join(first.partial[1])} (each rank holds its own piece's "
                        f"{kind}; the op does not commute with combining them): reduce it first",
                        first)
    return Result(result, tuple(new_args), new_kwargs)


#: how a partial value's combining op reads in a message
PARTIAL_KINDS = {"sum": "sum", "avg": "average", "max": "maximum", "min": "minimum"}


def _op(name: str) -> str:
    return name.removeprefix("aten.")


def _conform(ctx: RuleCtx, value: Any, target: tuple[Dim, ...]) -> Any:
    """``value`` aligned to the broadcast result's split: equal, broadcast (size 1), or a
    constant table taken from position 0 (Rule 4.2); anything else cannot run locally."""
    lay = ctx.layout(value)
    offset = len(target) - lay.rank
    for k, dim in enumerate(lay.dims):
        want = target[k + offset]
        if same_dim(dim, want) or (lay.global_shape()[k] == 1 and not any(f.axes for f in dim)):
            continue
        if _cuttable(lay, dim):
            return ctx.adapt(value, lay, _fitted(lay, target[offset:]))
        raise LayoutError(f"operand split as {lay.describe()} meets an operand split as "
                          f"{TLayout(target).describe()}: redistribute one of them first")
    return value


def _cuttable(lay: TLayout, dim: Dim) -> bool:
    """Whether dimension ``dim`` of a value laid out as ``lay`` may be cut to fit a split
    partner: unsplit, and a broadcast or part of a constant table (Rule 4.2)."""
    return (lay.const or broadcast_dim(dim)) and not any(f.axes for f in dim)


def _fitted(lay: TLayout, target: tuple[Dim, ...]) -> TLayout:
    """``lay`` with every dimension that may be cut (constant tables, broadcasts) taking the
    target's split; the others as they are."""
    dims = tuple(t if _cuttable(lay, d) and
                 not same_dim(d, t) else d for d, t in zip(lay.dims, target, strict=True))
    return TLayout(dims, lay.partial, lay.const, lay.cause)


ELEMENTWISE = (
    "aten.add", "aten.sub", "aten.mul", "aten.div", "aten.neg", "aten.exp", "aten.log",
    "aten.rsqrt", "aten.sqrt", "aten.sigmoid", "aten.silu", "aten.tanh", "aten.relu",
    "aten.gelu", "aten.pow", "aten.where", "aten.le", "aten.lt", "aten.ge", "aten.gt",
    "aten.eq", "aten.ne", "aten.logical_and", "aten.logical_or", "aten.logical_not",
    "aten.bitwise_not", "aten.clone", "aten.alias", "aten._to_copy", "aten.abs",
    "aten.maximum", "aten.minimum", "aten.reciprocal", "aten.clamp", "aten.sin", "aten.cos",
    "aten.erf", "aten.masked_fill", "aten.log1p", "aten.expm1", "aten.sign", "aten.detach",
)


def _elementwise(name: str) -> Rule:
    return lambda ctx, args, kwargs, out: _broadcast(ctx, name, args, kwargs, out)


for _name in ELEMENTWISE:
    RULES[_name] = _elementwise(_name)


@rule("aten._assert_tensor_metadata")
def _assert_metadata(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
                     ) -> Result:
    """torch.export's check after ``x.to(dtype)`` (Hugging Face's RMSNorm computes in
    float32 and casts back): no value, so any layout; its size and stride, when stated, are
    the global ones and are dropped (dtype, device and layout stay)."""
    local = {k: v for k, v in kwargs.items() if k not in ("size", "stride")}
    positional = (args[0], None, None, *args[3:]) if len(args) > 1 else (args[0],)
    return Result(ctx.layout(args[0]), positional, local)


# -- factories ----------------------------------------------------------------------------


@rule("aten.full", "aten.zeros", "aten.ones", "aten.empty", "aten.arange",
      "aten.scalar_tensor", "aten.empty_strided", "aten.empty_permuted")
def _factory(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    return Result(TLayout.replicated(out.shape, const=True), args, kwargs)


@rule("aten.full_like", "aten.zeros_like", "aten.ones_like", "aten.empty_like")
def _like(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    lay = ctx.layout(args[0])
    return Result(TLayout(lay.dims, None, True), args, kwargs)


# -- views --------------------------------------------------------------------------------


@rule("aten.view", "aten._unsafe_view", "aten.reshape")
def _view(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    lay = ctx.layout(args[0])
    dims = reshape_dims(lay.dims, tuple(out.shape), ctx.sizes)
    new = replace(lay, dims=dims)
    return Result(new, (args[0], list(new.local_shape(ctx.sizes))) + tuple(args[2:]), kwargs)


@rule("aten.permute")
def _permute(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    lay = ctx.layout(args[0])
    order = [_ndim(d, lay.rank) for d in args[1]]
    return Result(replace(lay, dims=tuple(lay.dims[d] for d in order)), args, kwargs)


@rule("aten.t")
def _t(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    lay = ctx.layout(args[0])
    return Result(replace(lay, dims=tuple(reversed(lay.dims))), args, kwargs)


@rule("aten.transpose")
def _transpose(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any],
               out: Any) -> Result:
    lay = ctx.layout(args[0])
    a, b = _ndim(args[1], lay.rank), _ndim(args[2], lay.rank)
    dims = list(lay.dims)
    dims[a], dims[b] = dims[b], dims[a]
    return Result(replace(lay, dims=tuple(dims)), args, kwargs)


@rule("aten.unsqueeze")
def _unsqueeze(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any],
               out: Any) -> Result:
    lay = ctx.layout(args[0])
    d = _ndim(args[1], lay.rank + 1)
    dims = list(lay.dims)
    dims.insert(d, (Factor(1),))
    return Result(replace(lay, dims=tuple(dims)), args, kwargs)


@rule("aten.squeeze")
def _squeeze(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    lay = ctx.layout(args[0])
    shape = lay.global_shape()
    if len(args) > 1:
        given = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        drop = {_ndim(d, lay.rank) for d in given if shape[_ndim(d, lay.rank)] == 1}
    else:
        drop = {d for d, n in enumerate(shape) if n == 1}
    dims = tuple(dim for d, dim in enumerate(lay.dims) if d not in drop)
    return Result(replace(lay, dims=dims), args, kwargs)


@rule("aten.expand")
def _expand(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    lay = ctx.layout(args[0])
    target = list(args[1])
    offset = len(target) - lay.rank
    dims: list[Dim] = []
    local: list[int] = []
    own = lay.local_shape(ctx.sizes)
    for d, n in enumerate(target):
        k = d - offset
        if k >= 0 and (n == -1 or lay.global_shape()[k] == n):
            dims.append(lay.dims[k])
            local.append(own[k])
        else:
            dims.append((Factor(int(n), (), True),))
            local.append(int(n))
    return Result(replace(lay, dims=tuple(dims)), (args[0], local) + tuple(args[2:]), kwargs)


def _require_unsplit(lay: TLayout, d: int, what: str) -> None:
    if lay.is_sharded(d):
        raise LayoutError(f"{what} along dimension {d}, which is split over "
                          f"{', '.join(lay.dim_axes(d))}")


@rule("aten.slice")
def _slice(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    lay = ctx.layout(args[0])
    d = _ndim(args[1] if len(args) > 1 else 0, lay.rank)
    if tuple(out.shape) == lay.global_shape():
        return Result(lay, args, kwargs)  # a full slice: the identity
    _require_unsplit(lay, d, "slice")
    dims = list(lay.dims)
    dims[d] = (Factor(int(out.shape[d])),)
    return Result(replace(lay, dims=tuple(dims)), args, kwargs)


@rule("aten.select")
def _select(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    lay = ctx.layout(args[0])
    d = _ndim(args[1], lay.rank)
    _require_unsplit(lay, d, "select")
    return Result(replace(lay, dims=lay.dims[:d] + lay.dims[d + 1:]), args, kwargs)


@rule("aten.cat")
def _cat(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    layouts = [ctx.layout(t) for t in args[0]]
    d = _ndim(args[1] if len(args) > 1 else 0, layouts[0].rank)
    # along a split dimension, pieces split alike stack as an outer factor (``stack``
    # along a new dimension 0 is ``cat`` along the split batch, then a view): each rank
    # joins its own blocks, which is the block of the spec's tensor the factors describe
    stacked = len(layouts) > 1 and any(lay.is_sharded(d) for lay in layouts) and \
        all(same_dim(lay.dims[d], layouts[0].dims[d]) for lay in layouts)
    for lay in layouts:
        if not stacked:
            _require_unsplit(lay, d, "cat")
    # each other dimension takes its split from the operand that has one
    first = layouts[0]
    target = tuple(next((lay.dims[k] for lay in layouts if lay.is_sharded(k)), first.dims[k])
                   for k in range(first.rank))
    operands = []
    for t, lay in zip(args[0], layouts, strict=True):
        want = tuple(lay.dims[d] if k == d else target[k] for k in range(lay.rank))
        operands.append(_conform(ctx, t, want))
    args = (operands,) + tuple(args[1:])
    first = replace(first, dims=target)
    partial = _any_partial(layouts)
    if partial and any(lay.partial != partial.partial for lay in layouts):
        ctx.finding(codes_lower.PARTIAL_NONLINEAR, "cat of partial and complete operands", partial)
    dims = list(first.dims)
    dims[d] = (Factor(len(layouts)),) + normalize_dim(layouts[0].dims[d]) if stacked else \
        (Factor(int(out.shape[d])),)
    result = TLayout(tuple(dims), None, all(lay.const for lay in layouts))
    if partial:
        result = result.with_partial(partial.partial, partial.cause)
    return Result(result, args, kwargs)


@rule("aten.split_with_sizes", "aten.split")
def _split(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    lay = ctx.layout(args[0])
    d = _ndim(args[2] if len(args) > 2 else kwargs.get("dim", 0), lay.rank)
    _require_unsplit(lay, d, "split")
    outs = []
    for piece in out:
        dims = list(lay.dims)
        dims[d] = (Factor(int(piece.shape[d])),)
        outs.append(replace(lay, dims=tuple(dims)))
    return Result(tuple(outs), args, kwargs)


# -- contractions -------------------------------------------------------------------------


def _contract(ctx: RuleCtx, a: TLayout, b: TLayout, ka: int, kb: int, what: str,
              operands: tuple[int, int] = (0, 1)) -> \
        tuple[tuple[str, tuple[str, ...]] | None, Any]:
    """``operands``: the op's arguments ``a`` and ``b`` are (a split on one side only
    blames the statement behind that argument)."""
    if not same_dim(a.dims[ka], b.dims[kb]):
        on_a = {x for f in normalize_dim(a.dims[ka]) for x in f.axes}
        on_b = {x for f in normalize_dim(b.dims[kb]) for x in f.axes}
        # the side split where the other is not is the statement to blame (a weight split on
        # its input dimension, an activation left split), not the op's latest statement
        operand = operands[0] if on_a > on_b else operands[1] if on_b > on_a else None
        raise LayoutError(f"{what}: the contracted dimension is split as "
                          f"{TLayout((a.dims[ka],)).describe()} on one side and "
                          f"{TLayout((b.dims[kb],)).describe()} on the other",
                          tuple(sorted(on_a ^ on_b)), operand)
    axes = tuple(x for f in normalize_dim(a.dims[ka]) for x in f.axes)
    if a.partial and b.partial:
        ctx.finding(codes_lower.PARTIAL_NONLINEAR, f"{what} of two partial sums", a)
    carried = a if a.partial else b if b.partial else None
    if axes and carried:
        ctx.finding(codes_lower.PARTIAL_NONLINEAR,
                    f"{what} over a split dimension of a partial sum",
                    carried)
    if axes:
        return ("sum", axes), ctx.cause_for(axes)
    if carried:
        return carried.partial, carried.cause
    return None, None


@rule("aten.mm")
def _mm(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    a, b = ctx.layout(args[0]), ctx.layout(args[1])
    partial, cause = _contract(ctx, a, b, 1, 0, "matrix product")
    result = TLayout((a.dims[0], b.dims[1])).with_partial(partial, cause or ctx.current_cause)
    return Result(result, args, kwargs)


def _batch_fitted(ctx: RuleCtx, args: tuple[Any, ...], a: TLayout, b: TLayout
                  ) -> tuple[tuple[Any, ...], TLayout, TLayout]:
    """The operands of a batched product whose batch dimensions are split differently:
    one that is a broadcast along the batch (``linear`` on a 3-d input that is not
    contiguous expands its weight to the batch) or a constant table, and unsplit there,
    is cut to its partner's split, as an elementwise op cuts it (``_conform``)."""
    for i, (mine, other) in enumerate(((a, b), (b, a))):
        dim = mine.dims[0]
        if _cuttable(mine, dim):
            fitted = TLayout((other.dims[0],) + mine.dims[1:], mine.partial, mine.const,
                             mine.cause)
            new = list(args)
            new[i] = ctx.adapt(args[i], mine, fitted)
            return (tuple(new),) + ((fitted, b) if i == 0 else (a, fitted))
    raise LayoutError(f"batched product of operands split differently on the batch "
                      f"dimension: {a.describe()} and {b.describe()}")


@rule("aten.bmm")
def _bmm(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    a, b = ctx.layout(args[0]), ctx.layout(args[1])
    if not same_dim(a.dims[0], b.dims[0]):
        args, a, b = _batch_fitted(ctx, args, a, b)
    partial, cause = _contract(ctx, a, b, 2, 1, "batched matrix product")
    result = TLayout((a.dims[0], a.dims[1], b.dims[2])).with_partial(
        partial, cause or ctx.current_cause)
    return Result(result, args, kwargs)


# -- reductions ---------------------------------------------------------------------------

REDUCE_KIND = {"aten.sum": "sum", "aten.mean": "avg", "aten.amax": "max", "aten.amin": "min"}


def _reduction(name: str) -> Rule:
    def run(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
        lay = ctx.layout(args[0])
        given = args[1] if len(args) > 1 else kwargs.get("dim")
        if given is None or given == []:
            reduced = set(range(lay.rank))
        else:
            given = given if isinstance(given, (list, tuple)) else [given]
            reduced = {_ndim(d, lay.rank) for d in given}
        keep = bool(args[2]) if len(args) > 2 else bool(kwargs.get("keepdim", False))
        axes = tuple(a for d in sorted(reduced) for a in lay.dim_axes(d))
        dims = tuple(((Factor(1),) if d in reduced else dim) for d, dim in enumerate(lay.dims)
                     if keep or d not in reduced)
        result = TLayout(dims, None, lay.const)
        kind = REDUCE_KIND[name]
        if lay.partial:
            linear = kind in ("sum", "avg") and lay.partial[0] in ("sum", "avg")
            if not linear:
                ctx.finding(codes_lower.PARTIAL_NONLINEAR, f"{_op(name)} of a partial sum", lay)
            elif axes:
                ctx.finding(codes_lower.PARTIAL_NONLINEAR,
                            f"{_op(name)} over a split dimension of a "
                            "partial sum", lay)
            else:
                return Result(result.with_partial(lay.partial, lay.cause), args, kwargs)
        if axes:
            result = result.with_partial((kind, axes), ctx.cause_for(axes))
        return Result(result, args, kwargs)
    return run


for _name in REDUCE_KIND:
    RULES[_name] = _reduction(_name)


def _whole_reduction(what: str, keep_at: int) -> Rule:
    """A reduction over dimensions that must be whole on every rank (``what`` names it in
    the message); ``keepdim`` is positional argument ``keep_at``. The other dimensions keep
    their layout; a partial operand is a finding (the reduction is not linear)."""
    def run(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
        lay = ctx.layout(args[0])
        given = args[1] if len(args) > 1 else kwargs.get("dim")
        reduced = set(range(lay.rank)) if given is None or given in ([], ()) else {
            _ndim(d, lay.rank) for d in (given if isinstance(given, (list, tuple)) else [given])}
        keep = bool(kwargs.get("keepdim", args[keep_at] if len(args) > keep_at else False))
        for d in reduced:
            _require_unsplit(lay, d, what)
        if lay.partial:
            ctx.finding(codes_lower.PARTIAL_NONLINEAR, f"{what} of a partial sum", lay)
        dims = tuple(((Factor(1),) if d in reduced else dim) for d, dim in enumerate(lay.dims)
                     if keep or d not in reduced)
        result = TLayout(dims, None, lay.const)
        return Result((result, result) if isinstance(out, (tuple, list)) else result,
                      args, kwargs)
    return run


#: variance (and mean) over dimensions whole on every rank
RULES["aten.var_mean"] = RULES["aten.var"] = _whole_reduction("variance", 3)
#: ``any(x, dim, keepdim)``: a logical or (the safe softmax of SDPA's math path tests
#: whether a row of scores is all ``-inf``) over dimensions whole on every rank
RULES["aten.any"] = _whole_reduction("logical or", 2)


# -- ops along one dimension (softmax, top-k, gather...) -------------------------------------


def _along(dim_arg: int, resize: bool = False) -> Rule:
    def run(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
        lay = ctx.layout(args[0])
        d = _ndim(args[dim_arg] if len(args) > dim_arg else -1, lay.rank)
        _require_unsplit(lay, d, "an op that mixes elements")
        if lay.partial:
            ctx.finding(codes_lower.PARTIAL_NONLINEAR,
                        "an op along one dimension applied to a partial "
                        "sum", lay)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        results = []
        for o in outs:
            dims = list(lay.dims)
            dims[d] = (Factor(int(o.shape[d])),)
            results.append(TLayout(tuple(dims), None, lay.const))
        layout = tuple(results) if isinstance(out, (tuple, list)) else results[0]
        return Result(layout, args, kwargs)
    return run


RULES["aten._softmax"] = _along(1)
RULES["aten._log_softmax"] = _along(1)
RULES["aten.topk"] = _along(2)
RULES["aten.sort"] = _along(1)
RULES["aten.cumsum"] = _along(1)


@rule("aten.flip")
def _flip(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    """``flip(x, dims)``: the order reversed along dimensions whole on every rank (a rank
    reversing its own block would hold another rank's positions); linear, so a partial
    value stays partial."""
    lay = ctx.layout(args[0])
    for d in args[1] if len(args) > 1 else kwargs["dims"]:
        _require_unsplit(lay, _ndim(d, lay.rank), "flip")
    return Result(lay, args, kwargs)


@rule("aten.index_select")
def _index_select(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
                  ) -> Result:
    """``index_select(x, dim, index)`` (``torch.roll`` is one): rows of a dimension whole on
    every rank, by a 1-d index; the result's dimension is laid out as the index (a lookup
    of each rank's indices in a replicated table, as ``embedding``); linear in ``x``."""
    lay, index = ctx.layout(args[0]), ctx.layout(args[2])
    d = _ndim(args[1], lay.rank)
    _require_unsplit(lay, d, "index_select")
    if index.partial:
        raise LayoutError(f"index_select by a partial index {index.describe()}")
    dims = list(lay.dims)
    dims[d] = index.dims[0] if index.rank == 1 else (Factor(int(out.shape[d])),)
    return Result(replace(lay, dims=tuple(dims), const=lay.const and index.const), args,
                  kwargs)


def _argmax(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    """``argmax(x, dim=None, keepdim=False)``: the index along ``dim`` (every dimension when
    none), that dimension kept as 1 or removed."""
    lay = ctx.layout(args[0])
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    along = range(lay.rank) if dim is None else (_ndim(dim, lay.rank),)
    for d in along:
        _require_unsplit(lay, d, "an op that mixes elements")
    if lay.partial:
        ctx.finding(codes_lower.PARTIAL_NONLINEAR,
                    "an op along one dimension applied to a partial sum", lay)
    if dim is None:
        dims: list[Any] = [(Factor(1),)] * lay.rank if keep else []
    else:
        dims = list(lay.dims)
        if keep:
            dims[along[0]] = (Factor(1),)
        else:
            del dims[along[0]]
    return Result(TLayout(tuple(dims), None, lay.const), args, kwargs)


RULES["aten.argmax"] = _argmax


@rule("aten.max")
def _max(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    """``torch.max`` in its three forms: of two tensors (elementwise, as ``maximum``); of
    every element (as ``amax``); along ``dim``, the values and their indices (each as
    ``argmax`` lays out its result: that dimension whole on every rank)."""
    other = args[1] if len(args) > 1 else kwargs.get("other")
    if isinstance(other, torch.fx.Node):
        return _broadcast(ctx, "aten.maximum", args, kwargs, out)
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if dim is None:
        return RULES["aten.amax"](ctx, args, kwargs, out)
    layout = _argmax(ctx, args, kwargs, out).layout
    return Result((layout, layout), args, kwargs)


@rule("aten.gather")
def _gather(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    lay, index = ctx.layout(args[0]), ctx.layout(args[2])
    d = _ndim(args[1], lay.rank)
    _require_unsplit(lay, d, "gather")
    for k in range(lay.rank):
        if k != d and not same_dim(lay.dims[k], index.dims[k]) and index.global_shape()[k] \
                == lay.global_shape()[k]:
            raise LayoutError(f"gather with an index split differently from its source "
                              f"(dimension {k}: the source is {lay.describe()}, the index "
                              f"{index.describe()})",
                              tuple(dict.fromkeys(lay.dim_axes(k) + index.dim_axes(k))))
    if lay.partial:
        ctx.finding(codes_lower.PARTIAL_NONLINEAR, "gather from a partial sum", lay)
    return Result(TLayout(index.dims, lay.partial, lay.const and index.const, lay.cause),
                  args, kwargs)


@rule("aten.scatter")
def _scatter(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    lay = ctx.layout(args[0])
    d = _ndim(args[1], lay.rank)
    _require_unsplit(lay, d, "scatter")
    return Result(TLayout(lay.dims, None, lay.const), args, kwargs)


@rule("aten.embedding")
def _embedding(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any],
               out: Any) -> Result:
    table, ids = ctx.layout(args[0]), ctx.layout(args[1])
    if table.is_sharded(0):
        raise LayoutError(f"embedding lookup in a table split over "
                          f"{', '.join(table.dim_axes(0))} along the vocabulary: use "
                          "`algorithm vocab-parallel-embedding`")
    return Result(TLayout(ids.dims + (table.dims[1],)), args, kwargs)


@rule("aten.addmm")
def _addmm(ctx: RuleCtx, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Result:
    """``bias + a @ b``: the product's layout, with the bias broadcast onto it."""
    bias, a, b = (ctx.layout(x) for x in args[:3])
    partial, cause = _contract(ctx, a, b, 1, 0, "matrix product", (1, 2))
    product = TLayout((a.dims[0], b.dims[1])).with_partial(partial, cause or ctx.current_cause)
    if bias.rank and not same_dim(bias.dims[-1], product.dims[1]):
        raise LayoutError(f"bias split as {bias.describe()} added to a product split as "
                          f"{product.describe()}")
    if product.partial and not bias.partial:
        ctx.finding(codes_lower.MIXED_PARTIAL, "a bias added to a partial sum over "
                    f"{', '.join(product.partial[1])} before it is reduced: the bias enters the "
                    "sum once per rank", product)
    return Result(product, args, kwargs)
