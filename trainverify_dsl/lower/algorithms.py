"""Parallel algorithms: local programs that are not "the spec's ops on local pieces".

Each algorithm is an ordinary torch function of local pieces (and the rank's group index
``k``), using ``tvp.collective`` for communication; it is traced with ``make_fx`` and inlined
into the stage's local program in place of the named module's ops, so it is lowered,
differentiated by AOTAutograd and checked like everything else — never trusted
(docs/semantics.md §7). The registry ``ALGORITHMS`` maps a plan name to its definition: what it
replaces (a module's output, or the loss) and how it is lowered, through the narrow
``Context`` the lowering hands it (marked points, parameters, layouts, local values, the group
index, inlining) — never the lowering's private state. Before replacing anything, each
definition reads what the module really does from its traced ops (Rule 7.3: its parameters, its
ops compared with the algorithm's own one-rank function, the loss's reduction and ignore index)
and refuses with TVP408 whatever the algorithm would drop.

- ``vocab-parallel-embedding`` (§7.1): lookup in this rank's vocabulary rows, zero elsewhere;
  the output is ``Partial(sum)`` over the axes.
- ``vocab-parallel-cross-entropy`` (§7.2): the loss from vocabulary-split logits, with the max
  detached, the sum of exponentials and the target logit all-reduced.
- ``expert-parallel`` (§7.5): dispatch every token to the experts' owners with an all-to-all,
  run the local experts, combine back with the inverse all-to-all.
- ``context-parallel-attention`` (§7.4): RoPE at global positions, keys and values all-gathered
  over the sequence, the causal mask on global positions (Llama's grouped-query attention);
  ``order=zigzag`` for a sequence split in zigzag order (§2.6): the rank's positions are its
  two chunks, and the gathered keys stand in the ranks' chunk order.
- ``row-parallel-linear`` (§7.6): a linear layer with a bias whose weight is split by input
  columns: the local product, all-reduced, then the bias added once (Megatron's
  RowParallelLinear).
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from trainverify_dsl.ir.layout import TLayout, append_axes
from trainverify_dsl.lower import loss as loss_norm
from trainverify_dsl.lower.capture import MARK, module_stack
from trainverify_dsl.lower.findings import Finding, LoweringError
from trainverify_dsl.report import codes_lower
from trainverify_dsl.spec.convert import packet_name


def _coll(x: torch.Tensor, kind: str, axes: tuple[str, ...], n: int, op: str = "sum",
          dim: int = 0, dim2: int = -1, backward: str = "identity") -> torch.Tensor:
    return torch.ops.tvp.collective(x, kind, ",".join(axes), n, op, dim, dim2, backward)


# -- the local programs ----------------------------------------------------------------------


def vocab_parallel_embedding(weight: torch.Tensor, ids: torch.Tensor,
                             k: torch.Tensor) -> torch.Tensor:
    """Rows ``[k W, (k+1) W)`` of the table live here; other ids give zero rows."""
    width = weight.shape[0]
    start = k * width
    outside = (ids < start) | (ids >= start + width)
    local = torch.where(outside, torch.zeros_like(ids), ids - start)
    rows = F.embedding(local, weight)
    return torch.where(outside.unsqueeze(-1), torch.zeros_like(rows), rows)


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, k: torch.Tensor,
                                 axes: tuple[str, ...], n: int, smoothing: float = 0.0,
                                 partition: bool = False, ignore_index: int | None = None,
                                 mean: bool = True) -> Any:
    """Mean cross-entropy of ``logits [..., W]`` (this rank's vocabulary block) and labels;
    with label ``smoothing`` ε each position adds ε times (the log-sum-exp minus the mean
    logit), the mean over the whole vocabulary (an all-reduce of the logits' sums), or over
    this rank's block alone with ``partition`` (the per-partition bug, §7.2). Without
    ``mean`` (or with an ``ignore_index``) it returns the sum of the per-position losses and
    their count instead (``None``: every position counts), for the plan's loss reduction:
    positions labelled ``ignore_index`` are neither summed nor counted."""
    width = logits.shape[-1]
    top = _coll(logits.detach().amax(dim=-1, keepdim=True), "all_reduce", axes, n, "max")
    top = top.detach()
    total = _coll(torch.exp(logits - top).sum(dim=-1, keepdim=True), "all_reduce", axes, n)
    start = k * width
    inside = (labels >= start) & (labels < start + width)
    local = torch.where(inside, labels - start, torch.zeros_like(labels))
    picked = torch.gather(logits, -1, local.unsqueeze(-1))
    picked = torch.where(inside.unsqueeze(-1), picked, torch.zeros_like(picked))
    target = _coll(picked, "all_reduce", axes, n)
    if not smoothing:
        per_position = torch.log(total) + top - target
    else:
        if partition:
            mean_logit = logits.sum(dim=-1, keepdim=True) / width
        else:
            mean_logit = _coll(logits.sum(dim=-1, keepdim=True), "all_reduce", axes, n) \
                / (width * n)
        per_position = torch.log(total) + top - (1.0 - smoothing) * target \
            - smoothing * mean_logit
    if ignore_index is None:
        return per_position.mean() if mean else (per_position.sum(), None)
    counted = (labels != ignore_index).unsqueeze(-1)
    per_position = torch.where(counted, per_position, torch.zeros_like(per_position))
    return per_position.sum(), counted.sum()


def expert_parallel(x: torch.Tensor, weights: torch.Tensor, w1: torch.Tensor,
                    w2: torch.Tensor, w3: torch.Tensor, axes: tuple[str, ...], n: int,
                    experts: int) -> torch.Tensor:
    """``x [T, H]`` local tokens, ``weights [T, E]`` routing weights, ``w* [E/n, ...]`` the
    local experts; the result is the spec's ``Experts`` output for the local tokens."""
    tokens, hidden = x.shape
    per_expert = x.unsqueeze(0).expand(experts, tokens, hidden)
    dispatched = _coll(per_expert, "all_to_all", axes, n, dim=0, dim2=1, backward="all_to_all")
    out = swiglu_experts(dispatched, w1, w2, w3)
    combined = _coll(out, "all_to_all", axes, n, dim=1, dim2=0, backward="all_to_all")
    return (combined * weights.t().unsqueeze(-1)).sum(dim=0)


def swiglu_experts(tokens: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                   w3: torch.Tensor) -> torch.Tensor:
    """The experts the algorithm runs: ``silu(t w1ᵀ) * (t w3ᵀ)``, then ``w2``, per expert."""
    gate = torch.bmm(tokens, w1.transpose(1, 2))
    up = torch.bmm(tokens, w3.transpose(1, 2))
    return torch.bmm(F.silu(gate) * up, w2.transpose(1, 2))


def experts_reference(x: torch.Tensor, weights: torch.Tensor, w1: torch.Tensor,
                      w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """``expert_parallel`` on one rank (no exchange): the function of the module's inputs and
    weights the algorithm computes, which the module's own ops must be."""
    tokens, hidden = x.shape
    per_expert = x.unsqueeze(0).expand(w1.shape[0], tokens, hidden)
    return (swiglu_experts(per_expert, w1, w2, w3) * weights.t().unsqueeze(-1)).sum(dim=0)


def sequence_positions(k: Any, n: int, seq: int, zigzag: bool) -> torch.Tensor:
    """The global positions of the ``seq`` local positions of block ``k`` of ``n``: contiguous
    ``[k S, (k+1) S)``, or in zigzag order chunks ``k`` and ``2n-1-k`` of ``2n`` chunks of
    ``S/2`` (docs/semantics.md §2.6)."""
    if not zigzag:
        return torch.arange(seq) + k * seq
    chunk = seq // 2
    return torch.cat([torch.arange(chunk) + k * chunk,
                      torch.arange(chunk) + (2 * n - 1 - k) * chunk])


def context_parallel_attention(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                               wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor,
                               wo: torch.Tensor, k: torch.Tensor, axes: tuple[str, ...], n: int,
                               scale: float, helpers: Any, zigzag: bool = False
                               ) -> torch.Tensor:
    """Llama attention on this rank's block of positions of ``x [b, S, h]`` (contiguous
    ``[k S, (k+1) S)``, or the zigzag chunks ``k`` and ``2n-1-k``); ``cos``/``sin`` are the whole
    tables ``[n S, d/2]``. ``helpers`` is the model's module (its ``apply_rope``,
    ``split_heads``, ``repeat_kv``, ``merge_heads``). The all-gathered keys hold each rank's
    positions in group order, so the causal mask compares global positions on both sides;
    the softmax and the product with the values do not depend on the keys' order."""
    apply_rope, split_heads = helpers.apply_rope, helpers.split_heads
    repeat_kv, merge_heads = helpers.repeat_kv, helpers.merge_heads
    _, seq, _ = x.shape
    head_dim = 2 * cos.shape[-1]
    positions = sequence_positions(k, n, seq, zigzag)
    cos_local, sin_local = cos.index_select(0, positions), sin.index_select(0, positions)
    heads, kv_heads = wq.shape[0] // head_dim, wk.shape[0] // head_dim
    q = apply_rope(split_heads(torch.matmul(x, wq.t()), heads), cos_local, sin_local)
    keys = apply_rope(split_heads(torch.matmul(x, wk.t()), kv_heads), cos_local, sin_local)
    values = split_heads(torch.matmul(x, wv.t()), kv_heads)
    keys = _coll(keys, "all_gather", axes, n, dim=2, backward="reduce_scatter")
    values = _coll(values, "all_gather", axes, n, dim=2, backward="reduce_scatter")
    keys, values = repeat_kv(keys, heads // kv_heads), repeat_kv(values, heads // kv_heads)
    scores = torch.matmul(q, keys.transpose(-2, -1)) * scale
    query_positions = positions.unsqueeze(-1)
    # the gathered keys: each rank's positions in group order (contiguous: 0 .. n S - 1)
    key_positions = torch.cat([sequence_positions(j, n, seq, zigzag) for j in range(n)]) \
        if zigzag else torch.arange(seq * n)
    allowed = query_positions >= key_positions.unsqueeze(0)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.matmul(merge_heads(torch.matmul(torch.softmax(scores, dim=-1), values)),
                        wo.t())


def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                        axes: tuple[str, ...], n: int,
                        scatter_dim: int | None = None) -> torch.Tensor:
    """``x [..., in/n]`` and ``weight [out, in/n]`` local; ``bias [out]`` whole. The partial
    product is all-reduced, or (``scatter_dim``, sequence parallelism) reduce-scattered
    along that dimension; the bias is added once, after."""
    partial = torch.matmul(x, weight.t())
    if scatter_dim is None:
        return _coll(partial, "all_reduce", axes, n) + bias
    return _coll(partial, "reduce_scatter", axes, n, dim=scatter_dim,
                 backward="all_gather") + bias


# -- what an algorithm sees of the lowering -------------------------------------------------


class Context(Protocol):
    """The lowering, as an algorithm sees it (``lowering._AlgorithmContext``)."""

    #: the fake-tensor mode the stage's values live in
    fake_mode: Any
    #: the ops outside every module that compute the loss from the output head's ``.out``
    loss_region: set[torch.fx.Node]

    def sites(self) -> list[Site]: ...
    def mark(self, point: str) -> torch.fx.Node | None: ...
    def param(self, name: str) -> torch.fx.Node | None: ...
    def layout(self, node: torch.fx.Node) -> TLayout: ...
    def local(self, node: torch.fx.Node) -> torch.fx.Node: ...
    def group(self, axes: tuple[str, ...]) -> tuple[torch.fx.Node, int]: ...
    def emit(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...
    def submodule(self, path: str) -> torch.nn.Module: ...
    def collectives_at(self, point: str) -> list[Any]: ...
    def is_data_input(self, node: torch.fx.Node) -> bool: ...
    def report(self, finding: Finding) -> None: ...
    def loss_mode(self) -> str: ...
    def normalise_loss(self, numerator: torch.fx.Node, count: torch.fx.Node | int,
                       axes: tuple[str, ...], cause: Any,
                       summed: bool = False) -> tuple[torch.fx.Node, TLayout]: ...
    def partial_cotangent(self, value: torch.fx.Node, axes: tuple[str, ...],
                          cause: Any) -> None:
        """The cotangent the algorithm's backward gives its input ``value`` is partial over
        ``axes`` (each rank's share of a sum; ``cause``: the statement to blame), for the
        layout pass of the backward (``lower/gradients.py``); an input not declared gets none
        from the algorithm."""
        ...


@dataclass(frozen=True, slots=True)
class Site:
    """One module an ``algorithm`` statement names."""
    name: str
    module: str
    axes: tuple[str, ...]
    #: the ``algorithm`` statement's plan origin
    origin: Any
    #: its ``KEY=VALUE`` options (``plan.vocab.ALGORITHM_OPTIONS``)
    options: tuple[tuple[str, Any], ...] = ()


Lower = Callable[[Context, Site], tuple[torch.fx.Node, TLayout]]


@dataclass(frozen=True, slots=True)
class Algorithm:
    name: str
    #: where its meaning is written down (docs/semantics.md)
    section: str
    #: ``module``: it replaces the named module's ops and gives its ``.out``; ``loss``: it
    #: replaces the loss computation after the named module (the output head)
    replaces: str
    lower: Lower
    #: the divisibilities its code needs beyond the plan's splits, for the shrinking rule
    #: (``shrink.plan_divisibilities``): ``(point, dimension, axes, zigzag)`` per module it
    #: is applied to: that dimension of the value at ``point`` is cut into blocks over
    #: ``axes`` (and each block into two chunks when ``zigzag``)
    needs: Callable[[Any, str], list[tuple[str, int, tuple[str, ...], bool]]] = \
        lambda statement, module: []


# -- inlining ------------------------------------------------------------------------------


def inline(cx: Context, fn: Callable[..., Any], inputs: list[Any]) -> Any:
    """Trace ``fn`` on the fake values of ``inputs`` and emit its ops into the current stage;
    the result is the node ``fn``'s tensor becomes (or a tuple of them, ``None`` kept)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from trainverify_dsl.spec.trace import decompositions

    values = [n.meta["val"] for n in inputs]
    # the table both programs use (spec/trace.py; it keeps `detach`: the vocab-parallel
    # max must not carry a gradient)
    with cx.fake_mode:
        traced = make_fx(fn, decomposition_table=decompositions())(*values)
    env: dict[torch.fx.Node, Any] = {}
    feed = iter(inputs)
    result = None
    for node in traced.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(feed)
        elif node.op == "call_function":
            args = torch.fx.node.map_arg(node.args, lambda a: env[a])
            kwargs = torch.fx.node.map_arg(dict(node.kwargs), lambda a: env[a])
            env[node] = cx.emit(node.target, args, kwargs)
        elif node.op == "output":
            result = torch.fx.node.map_arg(node.args[0], lambda a: env[a])
        else:
            raise LoweringError(Finding(codes_lower.LAYOUT_MISMATCH,
                                        f"algorithm traced a {node.op} node",
                                        None, ""))
    assert result is not None
    return result


def _mark(cx: Context, point: str, site: Site | None = None, what: str = "") -> torch.fx.Node:
    """The value at ``point``; a module input the algorithm needs (``site``, ``what`` it is)
    that the model never passes is the algorithm not applying there (TVP408 at its line)."""
    node = cx.mark(point)
    if node is None and site is not None:
        raise _not_applicable(site, f"it is never called with {what} (`{point}`)")
    if node is None:
        raise LoweringError(Finding(codes_lower.UNBOUND_NAME,
                                    f"the spec model never passes through "
                                    f"`{point}`", None, point))
    return node


def _not_applicable(site: Site, why: str) -> LoweringError:
    return LoweringError(Finding(codes_lower.ALGORITHM_NOT_APPLICABLE,
                                 f"`{site.name}` cannot be applied to "
                                 f"`{site.module}`: {why}", site.origin, site.module))


# -- what a module really does (its traced ops), against what an algorithm implements --------


def _module_ops(graph: torch.fx.Graph, module: str) -> list[torch.fx.Node]:
    """The ops ``module`` (and its children) computes in the captured forward, marks left out."""
    return [n for n in graph.nodes if n.op == "call_function" and module in module_stack(n)
            and packet_name(n.target) != MARK]


def _arg(node: torch.fx.Node, index: int, name: str, default: Any) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _params_read(cx: Context, module: str, ops: list[torch.fx.Node]) -> list[str]:
    """The parameters of ``module`` (its own and its children's) that ``ops`` read."""
    read = {a for n in ops for a in n.all_input_nodes}
    names = (f"{module}.{local}" for local, _ in cx.submodule(module).named_parameters())
    return [name for name in names if cx.param(name) in read]


def _unused_params(cx: Context, site: Site, ops: list[torch.fx.Node], used: list[str],
                   what: str) -> None:
    """TVP408 when the module reads a parameter the algorithm does not (a bias the algorithm
    would drop): ``what`` says what the algorithm computes instead."""
    extra = [p for p in _params_read(cx, site.module, ops) if p not in used]
    if not extra:
        return
    inside = set(ops)
    listed = []
    for name in extra:
        readers = sorted({packet_name(u.target) for u in cx.param(name).users  # type: ignore
                          if u in inside})
        listed.append(f"`{name}` (read by {', '.join(readers)})")
    biases = all(any(packet_name(u.target) == "aten.addmm" and u.args[0] is cx.param(name)
                     for u in cx.param(name).users) for name in extra)  # type: ignore
    raise _not_applicable(site, f"it {'has biases' if biases else 'reads parameters'} the "
                                f"algorithm does not use: {', '.join(listed)}; the algorithm "
                                f"computes {what}, so "
                                f"{'this parameter' if len(extra) == 1 else 'they'} would be "
                                "dropped")


def _ops_text(names: Any) -> str:
    return ", ".join(sorted(set(names)))


#: Ops that only re-view their first operand: the structural comparison looks through them
#: (a model may reshape where the algorithm's code does not; the shapes are checked by torch
#: when the algorithm is traced on the local values).
_VIEWS = frozenset({"aten.view", "aten._unsafe_view", "aten.reshape", "aten.alias",
                    "aten.clone", "aten.contiguous", "aten.expand", "aten.unsqueeze",
                    "aten.squeeze", "aten.detach"})


#: Ops whose two operands may be swapped without changing the value.
_COMMUTATIVE = frozenset({"aten.add", "aten.mul"})


class _Structure:
    """Value numbers of computations: two nodes get one number when they apply the same op, with
    the same constant arguments, to operands of equal numbers; inputs are numbered by their role
    (``x``, ``w1``, ...). So the module's traced ops and the algorithm's reference function
    compute the same function of their inputs when their outputs' numbers are equal."""

    def __init__(self) -> None:
        self._table: dict[Any, int] = {}

    def number(self, node: torch.fx.Node, roles: dict[torch.fx.Node, str],
               memo: dict[torch.fx.Node, int]) -> int:
        todo = [(node, False)]
        while todo:  # operands first, without recursion (graphs can be deep)
            n, ready = todo.pop()
            if n in memo:
                continue
            operands = [] if n in roles else n.all_input_nodes
            if ready or not operands:
                memo[n] = self._key(n, roles, memo)
                continue
            todo.append((n, True))
            todo.extend((a, False) for a in operands if a not in memo)
        return memo[node]

    def _key(self, n: torch.fx.Node, roles: dict[torch.fx.Node, str],
             memo: dict[torch.fx.Node, int]) -> int:
        if n in roles:
            key: Any = ("input", roles[n])
        elif n.op != "call_function":
            key = ("input", n.op, n.name)
        elif packet_name(n.target) in _VIEWS:
            return memo[n.args[0]]  # type: ignore[index]
        else:
            def plain(a: Any) -> Any:
                if isinstance(a, torch.fx.Node):
                    return ("value", memo[a])
                if isinstance(a, (list, tuple)):
                    return tuple(plain(b) for b in a)
                return a if isinstance(a, (int, float, bool, str, type(None))) else repr(a)
            name, args = packet_name(n.target), plain(n.args)
            if name == "aten.addmm" and not n.kwargs:  # b + a m, as `x @ w.t() + b` traces
                product = self._table.setdefault(("aten.mm", args[1:], ()), len(self._table))
                name, args = "aten.add", (("value", product), args[0])
            if name in _COMMUTATIVE and len(args) == 2:
                args = tuple(sorted(args, key=repr))
            key = (name, args, tuple(sorted((k, plain(v)) for k, v in n.kwargs.items())))
        return self._table.setdefault(key, len(self._table))


def _significant_ops(nodes: Any) -> list[str]:
    return [packet_name(n.target) for n in nodes if n.op == "call_function"
            and packet_name(n.target) not in _VIEWS and packet_name(n.target) != MARK]


def _computes_reference(cx: Context, site: Site, output: torch.fx.Node,
                        inputs: list[tuple[str, torch.fx.Node]], reference: Callable[..., Any],
                        what: str) -> None:
    """TVP408 unless the module's ops from ``inputs`` (role, node) to ``output`` are, op for
    op, the algorithm's ``reference`` function of those inputs (traced on their global
    values): an activation, a bias or a factor the algorithm does not compute is named."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from trainverify_dsl.spec.trace import decompositions

    with cx.fake_mode:
        traced = make_fx(reference, decomposition_table=decompositions())(
            *[node.meta["val"] for _, node in inputs])
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    result = next(n for n in traced.graph.nodes if n.op == "output").args[0]
    structure = _Structure()
    mine = structure.number(output, {node: role for role, node in inputs}, {})
    theirs = structure.number(result, {p: role for p, (role, _) in
                                       zip(placeholders, inputs, strict=True)}, {})
    if mine == theirs:
        return
    module_ops = Counter(_significant_ops(_module_ops(output.graph, site.module)))
    reference_ops = Counter(_significant_ops(traced.graph.nodes))
    only_module, only_reference = module_ops - reference_ops, reference_ops - module_ops
    if only_module or only_reference:
        detail = (f"the module computes {_ops_text(only_module) or 'no other op'} where the "
                  f"algorithm computes {_ops_text(only_reference) or 'no other op'}")
    else:
        detail = "the module combines the same ops differently (its weights in other roles)"
    raise _not_applicable(site, f"it does not compute what the algorithm computes, {what}: "
                                f"{detail}")


# -- the definitions -----------------------------------------------------------------------


#: ``aten.embedding``'s arguments after the table and the ids, their defaults, and what the
#: module does when one is set that the vocab-parallel lookup does not
_EMBEDDING_OPTIONS = (
    (2, "padding_idx", -1, "a padding row (`padding_idx={}`): nn.Embedding gives that row no "
                           "gradient, the algorithm's lookup does"),
    (3, "scale_grad_by_freq", False, "`scale_grad_by_freq=True`: nn.Embedding divides each "
                                     "row's gradient by its id's count in the batch, the "
                                     "algorithm does not"),
    (4, "sparse", False, "`sparse=True`: a sparse gradient, which the algorithm's lookup does "
                         "not produce"),
)


def _embedding_lookup(cx: Context, site: Site) -> torch.fx.Node:
    """The module's one embedding lookup, when the module computes nothing else: the table a
    parameter read as it is (no `max_norm` renormalisation), no padding row, no gradient
    scaling, the lookup's result the module's output."""
    out_mark = _mark(cx, f"{site.module}.out")
    inside = _module_ops(out_mark.graph, site.module)
    lookup = next((n for n in inside if packet_name(n.target) == "aten.embedding"), None)
    if lookup is None:
        raise _not_applicable(site, "it performs no embedding lookup")
    table = lookup.args[0]
    if not isinstance(table, torch.fx.Node) or table.op != "placeholder":
        before = [packet_name(n.target) for n in inside if n is not lookup]
        raise _not_applicable(site, f"it transforms its table before the lookup "
                                    f"({_ops_text(before)}; nn.Embedding's `max_norm` "
                                    "renormalises the rows it reads): the algorithm looks "
                                    "up the parameter as it is")
    for index, name, default, why in _EMBEDDING_OPTIONS:
        value = _arg(lookup, index, name, default)
        if value != default and not (name == "padding_idx" and value is None):
            raise _not_applicable(site, f"it has {why.format(value)}")
    others = [packet_name(n.target) for n in inside if n is not lookup]
    if others or out_mark.args[0] is not lookup:
        raise _not_applicable(site, f"it computes more than the lookup ({_ops_text(others)}): "
                                    "the algorithm's output is the looked-up rows alone")
    return lookup


def _lower_vocab_embedding(cx: Context, site: Site) -> tuple[torch.fx.Node, TLayout]:
    lookup = _embedding_lookup(cx, site)
    table, ids = lookup.args[0], lookup.args[1]
    k, _ = cx.group(site.axes)
    lay_table = cx.layout(table)
    if lay_table.dim_axes(0) != site.axes:
        raise _not_applicable(site, f"its table is split as {lay_table.describe()}, not "
                                    f"over {', '.join(site.axes)} along the vocabulary")
    out = inline(cx, vocab_parallel_embedding, [cx.local(table), cx.local(ids), k])
    lay = TLayout(cx.layout(ids).dims + (lay_table.dims[1],)).with_partial(
        ("sum", site.axes), site.origin)
    return out, lay


def _lower_expert_parallel(cx: Context, site: Site) -> tuple[torch.fx.Node, TLayout]:
    module = site.module
    x = _mark(cx, f"{module}.in")
    weights = _mark(cx, f"{module}.in#1", site, "the routing weights as its second input")
    names = [f"{module}.{w}" for w in ("w1", "w2", "w3")]
    params = [cx.param(p) for p in names]
    if any(p is None for p in params):
        raise _not_applicable(site, "it has no stacked expert weights w1, w2, w3")
    experts = params[0].meta["val"].shape[0]  # type: ignore[union-attr]
    _, n = cx.group(site.axes)
    for name, p in zip(names, params, strict=True):
        if cx.layout(p).dim_axes(0) != site.axes:  # type: ignore[arg-type]
            raise _not_applicable(site, f"`{name}` is not split over "
                                        f"{', '.join(site.axes)} along the experts")
    ops = _module_ops(x.graph, module)
    _unused_params(cx, site, ops, names, "SwiGLU experts from w1, w2, w3 alone")
    roles = [("x", x), ("weights", weights)] + \
        [(name.rsplit(".", 1)[1], p) for name, p in zip(names, params, strict=True)]
    _computes_reference(cx, site, _mark(cx, f"{module}.out").args[0], roles,  # type: ignore
                        experts_reference, "SwiGLU experts (silu(x w1ᵀ) * x w3ᵀ, then w2) "
                        "combined with the routing weights")
    axes = site.axes

    def run(x: torch.Tensor, w: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
            w3: torch.Tensor) -> torch.Tensor:
        return expert_parallel(x, w, w1, w2, w3, axes, n, experts)

    inputs = [cx.local(x), cx.local(weights)] + [cx.local(p) for p in params]  # type: ignore
    return inline(cx, run, inputs), cx.layout(x)


def _lower_context_parallel(cx: Context, site: Site) -> tuple[torch.fx.Node, TLayout]:
    module = site.module
    x = _mark(cx, f"{module}.in")
    cos = _mark(cx, f"{module}.in#1", site, "the RoPE tables (cos, sin) as its second and "
                "third inputs: it is not a Llama attention")
    sin = _mark(cx, f"{module}.in#2", site, "the RoPE tables (cos, sin) as its second and "
                "third inputs: it is not a Llama attention")
    names = [f"{module}.{w}.weight" for w in ("wq", "wk", "wv", "wo")]
    params = [cx.param(w) for w in names]
    target = cx.submodule(module)
    helpers = inspect.getmodule(type(target))
    needed = ("apply_rope", "split_heads", "repeat_kv", "merge_heads")
    if any(p is None for p in params) or not hasattr(target, "scale") or \
            not all(hasattr(helpers, h) for h in needed):
        raise _not_applicable(site, "it is not a Llama attention (wq, wk, wv, wo, scale, and "
                                    "the RoPE and head helpers of stdlib/models/common.py)")
    _unused_params(cx, site, _module_ops(x.graph, module), names,
                   "the projections x Wᵀ of wq, wk, wv and wo alone")
    x_lay = cx.layout(x)
    if x_lay.rank != 3 or x_lay.dim_axes(1) != site.axes:
        raise _not_applicable(site, f"its input must be split over {', '.join(site.axes)} "
                                    f"along the sequence; it is {x_lay.describe()}")
    k, n = cx.group(site.axes)
    axes, scale = site.axes, float(target.scale)
    # the positions the algorithm computes follow its own `order=`, not the input's layout:
    # a plan whose data is zigzag and whose attention says contiguous (or the reverse) runs
    # with wrong positions, as the real code would, and the values show it (§7.4)
    zigzag = dict(site.options).get("order") == "zigzag"
    local_seq = cx.local(x).meta["val"].shape[1]
    if zigzag and local_seq % 2:
        raise _not_applicable(site, f"order=zigzag cuts each rank's {local_seq} positions into "
                                    "two chunks: the sequence must be divisible by 2 x "
                                    f"{n} (the number of zigzag chunks)")

    def run(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, wq: torch.Tensor,
            wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor, k: torch.Tensor
            ) -> torch.Tensor:
        return context_parallel_attention(x, cos, sin, wq, wk, wv, wo, k, axes, n, scale,
                                          helpers, zigzag)

    inputs = [cx.local(v) for v in (x, cos, sin)] + [cx.local(p) for p in params] + [k]  # type: ignore
    out = inline(cx, run, inputs)
    # each rank projects x onto its own heads: with wq, wk, wv split by rows (heads), x's
    # gradient on a rank is its heads' share, partial over the axes splitting them
    heads = {a for p in params[:3] for a in cx.layout(p).dim_axes(0)}  # type: ignore[arg-type]
    cx.partial_cotangent(x, tuple(sorted(heads - set(x_lay.shard_axes()))), site.origin)
    wo_lay = cx.layout(params[3])  # type: ignore[arg-type]
    dims = x_lay.dims[:2] + (wo_lay.dims[0],)
    split_in = tuple(a for a in wo_lay.dim_axes(1))
    lay = TLayout(dims).with_partial(("sum", split_in), site.origin) if split_in else TLayout(dims)
    return out, lay


def _lower_row_parallel(cx: Context, site: Site) -> tuple[torch.fx.Node, TLayout]:
    module = site.module
    x = _mark(cx, f"{module}.in")
    weight, bias = cx.param(f"{module}.weight"), cx.param(f"{module}.bias")
    if weight is None or bias is None:
        raise _not_applicable(site, "it is not a linear layer with a weight and a bias")
    if cx.layout(weight).dim_axes(1) != site.axes or cx.layout(bias).shard_axes():
        raise _not_applicable(site, f"its weight must be split over "
                                    f"{', '.join(site.axes)} by input columns "
                                    f"(`split {module}.weight [-, axis]`) and its bias "
                                    "whole")
    roles = [("x", x), ("weight", weight), ("bias", bias)]
    _unused_params(cx, site, _module_ops(x.graph, module), [f"{module}.weight",
                                                          f"{module}.bias"], "x Wᵀ + b")
    _computes_reference(cx, site, _mark(cx, f"{module}.out").args[0], roles,  # type: ignore
                        F.linear, "a linear layer x Wᵀ + b")
    x_lay = cx.layout(x)
    if x_lay.dim_axes(x_lay.rank - 1) != site.axes:
        raise _not_applicable(site, f"its input must be split over "
                                    f"{', '.join(site.axes)} on the last dimension; it is "
                                    f"{x_lay.describe()}")
    _, n = cx.group(site.axes)
    axes = site.axes
    dims = x_lay.dims[:-1] + (cx.layout(weight).dims[0],)
    x_local = cx.local(x)
    scatter = dict(site.options).get("scatter-dim")
    if scatter is not None:  # Megatron's sequence-parallel RowParallelLinear
        if not isinstance(scatter, Fraction) or scatter.denominator != 1 or \
                not 0 <= scatter < len(dims) - 1:
            raise _not_applicable(site, f"`scatter-dim={scatter}` must name a dimension of "
                                        f"its output before the features: 0 to {len(dims) - 2}")
        d = int(scatter)
        local = x_local.meta["val"].shape[d]
        if any(set(f.axes) & set(axes) for f in dims[d]) or local % n:
            raise _not_applicable(site, f"its output's dimension {d} (local size {local}) "
                                        f"must be whole over {', '.join(axes)} and divide "
                                        f"into {n} blocks to be reduce-scattered")
        dims = dims[:d] + (append_axes(dims[d], axes),) + dims[d + 1:]
        # the bias is added to each rank's block of rows: its gradient sums that block only
        # (Megatron marks it `sequence_parallel` and all-reduces it over tp)
        cx.partial_cotangent(bias, axes, site.origin)

    def run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return row_parallel_linear(x, w, b, axes, n,
                                   None if scatter is None else int(scatter))

    out = inline(cx, run, [x_local, cx.local(weight), cx.local(bias)])
    return out, TLayout(dims, None, False)


def _lower_vocab_cross_entropy(cx: Context, site: Site) -> tuple[torch.fx.Node, TLayout]:
    logits_mark = _mark(cx, f"{site.module}.out")
    labels = _data_ancestor(cx, cx.loss_region)
    if labels is None:
        raise _not_applicable(site, "the loss reads no label input")
    logits_lay = cx.layout(logits_mark)
    if logits_lay.dim_axes(logits_lay.rank - 1) != site.axes:
        # blamed on a collective at the logits that changed their layout (an all-gather of
        # vocab-split logits), the algorithm's line when there is none
        at_logits = cx.collectives_at(f"{site.module}.out")
        blamed = at_logits[-1].origin if at_logits else None
        cx.report(Finding(
            codes_lower.ALGORITHM_NOT_APPLICABLE,
            "vocab-parallel-cross-entropy expects the logits split "
            f"over {', '.join(site.axes)} along the vocabulary; they are {logits_lay.describe()}",
            blamed or site.origin, site.module,
            notes=(f"the algorithm is applied at {site.origin.report_span}",)
            if blamed else ()))
    k, n = cx.group(site.axes)
    axes = site.axes
    # the spec model's label smoothing (its config's `label_smoothing`, as the reference
    # models pass it to the loss); the algorithm must compute that same loss
    config = getattr(cx.submodule(""), "config", None)
    smoothing = float(getattr(config, "label_smoothing", 0.0) or 0.0)
    # how the spec's loss reduces its per-position losses, and which label it ignores, as
    # its traced ops say (torch's cross_entropy ignores -100 whether the model says so or not)
    summed, ignore = _cross_entropy_reduction(cx, site, labels, logits_mark, smoothing)
    partition = dict(site.options).get("smoothing") == "partition"
    # the plain mean unless the plan's loss reduction or a mask needs the sum and the count
    plain = ignore is None and not summed and cx.loss_mode() == "local-mean"

    def run(z: torch.Tensor, y: torch.Tensor, k: torch.Tensor) -> Any:
        return vocab_parallel_cross_entropy(z, y, k, axes, n, smoothing, partition, ignore,
                                            mean=plain)

    label_lay = cx.layout(labels)
    rows = TLayout(logits_lay.dims[:-1])
    if label_lay.dims != rows.dims:
        raise _not_applicable(site, f"its labels are {label_lay.describe()}, but the logits' "
                                    f"rows are {rows.describe()}: each rank must hold the labels "
                                    "of its own rows (split the labels as the tokens)")
    out = inline(cx, run, [cx.local(logits_mark), cx.local(labels), k])
    data_axes = tuple(a for f in label_lay.dims[0] for a in f.axes)
    seq_axes = tuple(a for d in label_lay.dims[1:] for f in d for a in f.axes)
    mean_axes = data_axes + seq_axes
    if not plain:  # §4.3: the sum over the rank's positions, divided as the plan says
        total, count = out
        if count is None:
            count = math.prod(cx.local(labels).meta["val"].shape)
        return cx.normalise_loss(total, count, mean_axes, site.origin, summed)
    lay = TLayout(()).with_partial(("avg", mean_axes), site.origin) if mean_axes else TLayout(())
    return out, lay


def _cross_entropy_reduction(cx: Context, site: Site, labels: torch.fx.Node,
                             logits: torch.fx.Node, smoothing: float
                             ) -> tuple[bool, int | None]:
    """Whether the spec's loss (the traced loss region) is the sum of its per-position
    cross-entropies rather than their mean, and the label it ignores (``None``: none); TVP408
    for a loss the algorithm does not compute: not a mean, a sum or a token mean of
    ``-log_softmax(logits)[label]`` (a factor, another term), or a count it cannot read."""
    region = cx.loss_region
    output = next(n for n in logits.graph.nodes if n.op == "output").args[0]
    loss = next((r for r in (output if isinstance(output, (tuple, list)) else (output,))
                 if r in region), None)
    root = loss_norm.find_root(loss) if loss is not None else None
    if root is None:
        raise _not_applicable(site, "the spec's loss does not end in a mean, a sum, or a sum "
                                    "divided by a token count: the algorithm computes one of "
                                    "those of the per-position cross-entropies")
    ignored = _compared_labels(region, labels)
    if len(ignored) > 1:
        raise _not_applicable(site, f"the loss compares the labels with several values "
                                    f"({', '.join(map(str, sorted(ignored)))}); the algorithm "
                                    "ignores at most one label")
    ignore = next(iter(ignored), None)
    if root.count is not None and ignore is None:
        raise _not_applicable(site, "the loss divides by a count that is not the number of "
                                    "labels other than an ignore index (no comparison of the "
                                    "labels with a constant in the traced loss)")
    guards = [g for g in root.guards if packet_name(g.target) != "aten._to_copy"]
    if guards:  # (a cast of the count changes no value)
        raise _not_applicable(site, "the loss guards its token count against an empty batch "
                                    f"(`{packet_name(guards[-1].target)}`); the algorithm "
                                    "divides by the count itself, unguarded")
    if root.count is None and not root.summed and ignore is not None:
        raise _not_applicable(site, f"the loss averages over every position, the ignored ones "
                                    f"(label {ignore}) included: the algorithm divides by the "
                                    "counted positions")
    inner = _per_position_factor(root, logits)
    if inner is None and smoothing:  # a smoothed loss is read from the config (§7.2)
        inner = -1.0
    factor = None if inner is None else _outer_factor(loss, root.node) * inner  # type: ignore
    if factor != -1.0:
        what = "is not `-log_softmax(logits)[label]`" if factor is None else \
            f"is {-factor:g} times the cross-entropy"
        raise _not_applicable(site, f"the spec's per-position loss {what}: the algorithm "
                                    "computes the plain cross-entropy")
    return root.summed, ignore


def _outer_factor(node: torch.fx.Node, root: torch.fx.Node) -> float:
    """The constant factor between the loss and its normaliser (negations, constants)."""
    factor = 1.0
    while node is not root:
        name, args = packet_name(node.target), node.args
        if name == "aten.neg":
            factor, node = -factor, args[0]  # type: ignore[assignment]
        elif isinstance(args[0], torch.fx.Node) and isinstance(args[1], (int, float)):
            factor *= args[1] if name == "aten.mul" else 1.0 / args[1]
            node = args[0]
        else:  # a constant times the root (find_root's other form)
            factor *= args[0]  # type: ignore[operator]
            node = args[1]  # type: ignore[assignment]
    return factor


def _per_position_factor(root: loss_norm.Root, logits: torch.fx.Node) -> float | None:
    """``c`` when the normaliser reduces ``c * log_softmax(logits)[label]`` (through views,
    negations, constant factors and the mask's ``where``), else ``None``."""
    node: Any = root.numerator
    if root.count is not None and packet_name(node.target) == "aten.sum":
        node = node.args[0]
    factor = 1.0
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        name, args = packet_name(node.target), node.args
        if name == "aten.gather":
            source = args[0]
            while packet_name(source.target) in _VIEWS:
                source = source.args[0]
            if packet_name(source.target) != "aten._log_softmax":
                return None
            inner = source.args[0]
            while inner is not logits and packet_name(inner.target) in _VIEWS:
                inner = inner.args[0]
            return factor if inner is logits else None
        if name in _VIEWS:
            node = args[0]
        elif name == "aten.neg":
            factor, node = -factor, args[0]
        elif name in ("aten.mul", "aten.div") and isinstance(args[1], (int, float)):
            factor *= args[1] if name == "aten.mul" else 1.0 / args[1]
            node = args[0]
        elif name == "aten.where" and _is_zero(args[2]):
            node = args[1]  # the mask's zeros are what ignoring a position means
        else:
            return None
    return None


def _is_zero(value: Any) -> bool:
    if isinstance(value, (int, float)):
        return value == 0
    name = packet_name(value.target) if isinstance(value, torch.fx.Node) and \
        value.op == "call_function" else ""
    if name in ("aten.scalar_tensor", "aten.full"):  # (value) and (size, value)
        return value.args[-1] == 0
    if name == "aten.full_like":  # (like, value): what `zeros_like` decomposes to
        return value.args[1] == 0
    return name in ("aten.zeros_like", "aten.zeros")


def _compared_labels(region: set[torch.fx.Node], labels: torch.fx.Node) -> set[int]:
    """The constants the loss compares the labels with (``labels != -100``), through views."""
    seen = {labels}
    found: set[int] = set()
    for node in labels.graph.nodes:  # the labels' views may lie before the region
        name = packet_name(node.target) if node.op == "call_function" else ""
        if name in _VIEWS and node.args[0] in seen:
            seen.add(node)
        elif name in ("aten.ne", "aten.eq") and node.args[0] in seen and \
                isinstance(node.args[1], int) and _feeds(node, region):
            found.add(node.args[1])
    return found


def _feeds(node: torch.fx.Node, region: set[torch.fx.Node]) -> bool:
    """Whether ``node`` reaches the loss ``region`` (a mask computed from the labels alone
    lies outside it)."""
    seen: set[torch.fx.Node] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if n in region:
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(n.users)
    return False


def _data_ancestor(cx: Context, region: set[torch.fx.Node]) -> torch.fx.Node | None:
    """The model input the loss computation reads (the labels)."""
    seen: set[torch.fx.Node] = set()
    todo = [n for r in region for n in r.all_input_nodes if n not in region]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "placeholder":
            if cx.is_data_input(node):
                return node
            continue
        if not module_stack(node):
            todo.extend(node.all_input_nodes)
    return None


#: Every algorithm a plan can name (``plan/vocab.py`` lists the same names for `tvp lint`).
ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("vocab-parallel-embedding", "§7.1", "module", _lower_vocab_embedding),
    Algorithm("vocab-parallel-cross-entropy", "§7.2", "loss", _lower_vocab_cross_entropy),
    Algorithm("context-parallel-attention", "§7.4", "module", _lower_context_parallel,
              # its own `order=` cuts each rank's positions, whatever the data's layout says
              lambda st, module: [(f"{module}.in", 1, st.axes,
                                   dict(st.options).get("order") == "zigzag")]),
    Algorithm("expert-parallel", "§7.5", "module", _lower_expert_parallel),
    Algorithm("row-parallel-linear", "§7.6", "module", _lower_row_parallel),
)}


# -- hooks the lowering calls ---------------------------------------------------------------


def _replacing(cx: Context, what: str) -> list[Site]:
    """The sites of algorithms replacing ``what`` (a ``loss`` target only marks the loss)."""
    sites = [s for s in cx.sites() if s.module != "loss"]
    for s in sites:
        if s.name not in ALGORITHMS:
            raise _not_applicable(s, "this algorithm is not implemented by the lowering yet")
    return [s for s in sites if ALGORITHMS[s.name].replaces == what]


def enclosing_site(cx: Context, module: str) -> Site | None:
    """The algorithm replacing a module that strictly encloses ``module`` (``layers.0.
    attention`` for ``layers.0.attention.wq``), else ``None``: the algorithm computes that
    module as a whole, so nothing the plan states inside it is run."""
    return next((s for s in _replacing(cx, "module") if module.startswith(f"{s.module}.")),
                None)


def loss_region(cx: Context, graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The loss computation a loss algorithm replaces: ops outside every module that depend on
    the named module's ``.out`` (empty without such an algorithm)."""
    site = next(iter(_replacing(cx, "loss")), None)
    if site is None:
        return set()
    start = _mark(cx, f"{site.module}.out")
    region: set[torch.fx.Node] = set()
    reached = {start}
    for node in graph.nodes:
        if node.op == "call_function" and node is not start and \
                any(n in reached for n in node.all_input_nodes) and not module_stack(node):
            reached.add(node)
            region.add(node)
    return region


def skipped_nodes(cx: Context, graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Original nodes an algorithm replaces: inside its module, or the loss computation."""
    modules = {s.module for s in _replacing(cx, "module")}
    skipped = {n for n in graph.nodes if n.op == "call_function" and
               packet_name(n.target) != MARK and any(path in modules for path in module_stack(n))}
    return skipped | cx.loss_region


def module_output(cx: Context, point: str) -> tuple[torch.fx.Node, TLayout] | None:
    """The algorithm's local output for ``X.out`` of an algorithm module, else ``None``."""
    if not point.endswith(".out"):
        return None
    module = point.rsplit(".", 1)[0]
    site = next((s for s in _replacing(cx, "module") if s.module == module), None)
    return None if site is None else _lower(cx, site)


def loss_replacement(cx: Context) -> tuple[torch.fx.Node, TLayout] | None:
    """The loss algorithm's local loss, else ``None``."""
    site = next(iter(_replacing(cx, "loss")), None)
    return None if site is None else _lower(cx, site)


def _lower(cx: Context, site: Site) -> tuple[torch.fx.Node, TLayout]:
    """The site's definition lowered. Each definition checks the layouts it needs; a torch
    shape check that still fails while its code is traced on the local values (inputs whose
    local shapes do not fit together) is the algorithm's located finding, not a crash."""
    try:
        return ALGORITHMS[site.name].lower(cx, site)
    except RuntimeError as error:  # torch's shape checks raise RuntimeError
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise _not_applicable(site, f"its code does not run on the local values of this "
                                    f"plan ({first})") from None


__all__ = ["ALGORITHMS", "Algorithm", "Context", "Site", "expert_parallel",
           "row_parallel_linear", "vocab_parallel_cross_entropy", "vocab_parallel_embedding"]
