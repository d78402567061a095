"""Parallel algorithms: local programs that are not "the spec's ops on local pieces".

Each algorithm is an ordinary torch function of local pieces (and the rank's group index
``k``), using ``tvp.collective`` for communication; it is traced with ``make_fx`` and inlined
into the stage's local program in place of the named module's ops, so it is lowered,
differentiated by AOTAutograd and checked like everything else — never trusted
(docs/semantics.md §7). The registry ``ALGORITHMS`` maps a plan name to its definition.

- ``vocab-parallel-embedding`` (§7.1): lookup in this rank's vocabulary rows, zero elsewhere;
  the output is ``Partial(sum)`` over the axes.
- ``vocab-parallel-cross-entropy`` (§7.2): the loss from vocabulary-split logits, with the max
  detached, the sum of exponentials and the target logit all-reduced.
- ``expert-parallel`` (§7.5): dispatch every token to the experts' owners with an all-to-all,
  run the local experts, combine back with the inverse all-to-all.
- ``context-parallel-attention`` (§7.4): RoPE at global positions, keys and values all-gathered
  over the sequence, the causal mask on global positions (Llama's grouped-query attention).
- ``row-parallel-linear`` (§7.6): a linear layer with a bias whose weight is split by input
  columns: the local product, all-reduced, then the bias added once (Megatron's
  RowParallelLinear).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from trainverify_dsl.ir.layout import MICROBATCH_AXIS, Factor, TLayout
from trainverify_dsl.lower.capture import MARK, module_stack
from trainverify_dsl.lower.findings import Finding, LoweringError
from trainverify_dsl.spec.convert import packet_name

if TYPE_CHECKING:
    from trainverify_dsl.lower.lowering import _Lowering


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
                                 axes: tuple[str, ...], n: int) -> torch.Tensor:
    """Mean cross-entropy of ``logits [..., W]`` (this rank's vocabulary block) and labels."""
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
    return (torch.log(total) + top - target).mean()


def expert_parallel(x: torch.Tensor, weights: torch.Tensor, w1: torch.Tensor,
                    w2: torch.Tensor, w3: torch.Tensor, axes: tuple[str, ...], n: int,
                    experts: int) -> torch.Tensor:
    """``x [T, H]`` local tokens, ``weights [T, E]`` routing weights, ``w* [E/n, ...]`` the
    local experts; the result is the spec's ``Experts`` output for the local tokens."""
    tokens, hidden = x.shape
    per_expert = x.unsqueeze(0).expand(experts, tokens, hidden)
    dispatched = _coll(per_expert, "all_to_all", axes, n, dim=0, dim2=1, backward="all_to_all")
    gate = torch.bmm(dispatched, w1.transpose(1, 2))
    up = torch.bmm(dispatched, w3.transpose(1, 2))
    out = torch.bmm(F.silu(gate) * up, w2.transpose(1, 2))
    combined = _coll(out, "all_to_all", axes, n, dim=1, dim2=0, backward="all_to_all")
    return (combined * weights.t().unsqueeze(-1)).sum(dim=0)


def context_parallel_attention(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                               wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor,
                               wo: torch.Tensor, k: torch.Tensor, axes: tuple[str, ...], n: int,
                               scale: float, helpers: Any) -> torch.Tensor:
    """Llama attention on this rank's block of positions ``[k S, (k+1) S)`` of ``x [b, S, h]``;
    ``cos``/``sin`` are the whole tables ``[n S, d/2]``. ``helpers`` is the model's module
    (its ``apply_rope``, ``split_heads``, ``repeat_kv``, ``merge_heads``)."""
    apply_rope, split_heads = helpers.apply_rope, helpers.split_heads
    repeat_kv, merge_heads = helpers.repeat_kv, helpers.merge_heads
    _, seq, _ = x.shape
    head_dim = 2 * cos.shape[-1]
    positions = torch.arange(seq) + k * seq
    cos_local, sin_local = cos.index_select(0, positions), sin.index_select(0, positions)
    heads, kv_heads = wq.shape[0] // head_dim, wk.shape[0] // head_dim
    q = apply_rope(split_heads(torch.matmul(x, wq.t()), heads), cos_local, sin_local)
    keys = apply_rope(split_heads(torch.matmul(x, wk.t()), kv_heads), cos_local, sin_local)
    values = split_heads(torch.matmul(x, wv.t()), kv_heads)
    keys = _coll(keys, "all_gather", axes, n, dim=2, backward="reduce_scatter")
    values = _coll(values, "all_gather", axes, n, dim=2, backward="reduce_scatter")
    keys, values = repeat_kv(keys, heads // kv_heads), repeat_kv(values, heads // kv_heads)
    scores = torch.matmul(q, keys.transpose(-2, -1)) * scale
    allowed = positions.unsqueeze(-1) >= torch.arange(seq * n).unsqueeze(0)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.matmul(merge_heads(torch.matmul(torch.softmax(scores, dim=-1), values)),
                        wo.t())


def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                        axes: tuple[str, ...], n: int) -> torch.Tensor:
    """``x [..., in/n]`` and ``weight [out, in/n]`` local; ``bias [out]`` whole."""
    partial = torch.matmul(x, weight.t())
    return _coll(partial, "all_reduce", axes, n) + bias


# -- inlining ------------------------------------------------------------------------------


def inline(lw: _Lowering, fn: Callable[..., torch.Tensor],
           inputs: list[torch.fx.Node]) -> torch.fx.Node:
    """Trace ``fn`` on the fake values of ``inputs`` and emit its ops into the current stage."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    values = [n.meta["val"] for n in inputs]
    table = dict(core_aten_decompositions())
    # Core ATen decomposes detach into alias, which is differentiable once AOTAutograd traces
    # the local program: keep detach (the vocab-parallel max must not carry a gradient).
    table.pop(torch.ops.aten.detach.default, None)
    with lw.mode:
        traced = make_fx(fn, decomposition_table=table)(*values)
    env: dict[torch.fx.Node, Any] = {}
    feed = iter(inputs)
    result = None
    for node in traced.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(feed)
        elif node.op == "call_function":
            args = torch.fx.node.map_arg(node.args, lambda a: env[a])
            kwargs = torch.fx.node.map_arg(dict(node.kwargs), lambda a: env[a])
            env[node] = lw.emit(node.target, args, kwargs)
        elif node.op == "output":
            result = torch.fx.node.map_arg(node.args[0], lambda a: env[a])
        else:
            raise LoweringError(Finding("layout-mismatch", f"algorithm traced a {node.op} node",
                                        None, ""))
    assert isinstance(result, torch.fx.Node)
    return result


# -- hooks the lowering calls ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Site:
    name: str
    module: str
    axes: tuple[str, ...]
    #: the ``algorithm`` statement's plan origin
    origin: Any


def _sites(lw: _Lowering) -> list[_Site]:
    return [_Site(alg.name, path, alg.axes, alg.origin)
            for alg, paths in lw.binding.algorithms for path in paths]


def skipped_nodes(lw: _Lowering, graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Original nodes an algorithm replaces: inside its module, or the loss computation."""
    modules = {s.module for s in _sites(lw)
               if s.module != "loss" and s.name != "vocab-parallel-cross-entropy"}
    skipped = {n for n in graph.nodes if n.op == "call_function" and
               packet_name(n.target) != MARK and any(path in modules for path in module_stack(n))}
    return skipped | lw.loss_region


def _ce_site(lw: _Lowering) -> _Site | None:
    return next((s for s in _sites(lw) if s.name == "vocab-parallel-cross-entropy"
                 and s.module != "loss"), None)


def loss_region(lw: _Lowering, graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The loss computation the vocab-parallel cross-entropy replaces: ops outside every
    module that depend on the output head's ``.out`` (empty without that algorithm)."""
    site = _ce_site(lw)
    if site is None:
        return set()
    start = _mark_node(lw, f"{site.module}.out")
    region: set[torch.fx.Node] = set()
    reached = {start}
    for node in graph.nodes:
        if node.op == "call_function" and node is not start and \
                any(n in reached for n in node.all_input_nodes) and not module_stack(node):
            reached.add(node)
            region.add(node)
    return region


def _mark_node(lw: _Lowering, point: str) -> torch.fx.Node:
    if point in lw.marks:
        return lw.marks[point]
    raise LoweringError(Finding("unbound-name", f"the spec model never passes through `{point}`",
                                None, point))


def _group(lw: _Lowering, axes: tuple[str, ...]) -> tuple[torch.fx.Node, int]:
    n = 1
    for a in axes:
        n *= lw.sizes[a]
    return lw.group_index(axes), n


def module_output(lw: _Lowering, point: str) -> tuple[torch.fx.Node, TLayout] | None:
    """The algorithm's local output for ``X.out`` of an algorithm module, else ``None``."""
    module = point.rsplit(".", 1)[0]
    if not point.endswith(".out"):
        return None
    site = next((s for s in _sites(lw) if s.module == module), None)
    if site is None or site.name == "vocab-parallel-cross-entropy":
        return None
    graph = lw.cap.gm.graph
    inside = [n for n in graph.nodes if n.op == "call_function" and module in module_stack(n)
              and packet_name(n.target) != MARK]
    if site.name == "vocab-parallel-embedding":
        lookup = next((n for n in inside if packet_name(n.target) == "aten.embedding"), None)
        if lookup is None:
            raise _not_applicable(site, "it performs no embedding lookup")
        table, ids = lookup.args[0], lookup.args[1]
        k, n = _group(lw, site.axes)
        lay_table = lw.layouts[table]
        if lay_table.dim_axes(0) != site.axes:
            raise _not_applicable(site, f"its table is split as {lay_table.describe()}, not "
                                        f"over {', '.join(site.axes)} along the vocabulary")
        out = inline(lw, vocab_parallel_embedding,
                     [lw.value(lw.stage, table), lw.value(lw.stage, ids), k])
        ids_lay = lw.layouts[ids]
        lay = TLayout(ids_lay.dims + (lay_table.dims[1],)).with_partial(("sum", site.axes),
                                                                       site.origin)
        return out, lay
    if site.name == "expert-parallel":
        x = _mark_node(lw, f"{module}.in")
        weights = _mark_node(lw, f"{module}.in#1")
        params = [f"{module}.{w}" for w in ("w1", "w2", "w3")]
        if not all(p in lw.param_nodes for p in params):
            raise _not_applicable(site, "it has no stacked expert weights w1, w2, w3")
        experts = lw.param_nodes[params[0]].meta["val"].shape[0]
        _, n = _group(lw, site.axes)
        for p in params:
            if lw.layouts[lw.param_nodes[p]].dim_axes(0) != site.axes:
                raise _not_applicable(site, f"`{p}` is not split over "
                                            f"{', '.join(site.axes)} along the experts")
        axes = site.axes

        def run(x: torch.Tensor, w: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                w3: torch.Tensor) -> torch.Tensor:
            return expert_parallel(x, w, w1, w2, w3, axes, n, experts)

        inputs = [lw.value(lw.stage, x), lw.value(lw.stage, weights)] + \
            [lw.value(lw.stage, lw.param_nodes[p]) for p in params]
        return inline(lw, run, inputs), lw.layouts[x]
    if site.name == "context-parallel-attention":
        return _context_parallel(lw, site, module)
    if site.name == "row-parallel-linear":
        x = _mark_node(lw, f"{module}.in")
        weight, bias = lw.param_nodes.get(f"{module}.weight"), lw.param_nodes.get(f"{module}.bias")
        if weight is None or bias is None:
            raise _not_applicable(site, "it is not a linear layer with a weight and a bias")
        if lw.layouts[weight].dim_axes(1) != site.axes or lw.layouts[bias].shard_axes():
            raise _not_applicable(site, f"its weight must be split over "
                                        f"{', '.join(site.axes)} by input columns "
                                        f"(`split {module}.weight [-, axis]`) and its bias "
                                        "whole")
        x_lay = lw.layouts[x]
        if x_lay.dim_axes(x_lay.rank - 1) != site.axes:
            raise _not_applicable(site, f"its input must be split over "
                                        f"{', '.join(site.axes)} on the last dimension; it is "
                                        f"{x_lay.describe()}")
        _, n = _group(lw, site.axes)
        axes = site.axes

        def run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return row_parallel_linear(x, w, b, axes, n)

        out = inline(lw, run, [lw.value(lw.stage, x), lw.value(lw.stage, weight),
                               lw.value(lw.stage, bias)])
        dims = x_lay.dims[:-1] + (lw.layouts[weight].dims[0],)
        return out, TLayout(dims, None, False)
    raise _not_applicable(site, "this algorithm is not implemented by the lowering yet")


def _context_parallel(lw: _Lowering, site: _Site, module: str) -> tuple[torch.fx.Node, TLayout]:
    x = _mark_node(lw, f"{module}.in")
    cos, sin = _mark_node(lw, f"{module}.in#1"), _mark_node(lw, f"{module}.in#2")
    names = [f"{module}.{w}.weight" for w in ("wq", "wk", "wv", "wo")]
    target = lw.model.get_submodule(module)
    helpers = inspect.getmodule(type(target))
    needed = ("apply_rope", "split_heads", "repeat_kv", "merge_heads")
    if not all(n in lw.param_nodes for n in names) or not hasattr(target, "scale") or \
            not all(hasattr(helpers, h) for h in needed):
        raise _not_applicable(site, "it is not a Llama attention (wq, wk, wv, wo, scale, and "
                                    "the RoPE and head helpers of stdlib/models/common.py)")
    x_lay = lw.layouts[x]
    if x_lay.rank != 3 or x_lay.dim_axes(1) != site.axes:
        raise _not_applicable(site, f"its input must be split over {', '.join(site.axes)} "
                                    f"along the sequence; it is {x_lay.describe()}")
    k, n = _group(lw, site.axes)
    axes, scale = site.axes, float(target.scale)

    def run(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, wq: torch.Tensor,
            wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor, k: torch.Tensor
            ) -> torch.Tensor:
        return context_parallel_attention(x, cos, sin, wq, wk, wv, wo, k, axes, n, scale,
                                          helpers)

    inputs = [lw.value(lw.stage, v) for v in (x, cos, sin)] + \
        [lw.value(lw.stage, lw.param_nodes[w]) for w in names] + [k]
    out = inline(lw, run, inputs)
    wo_lay = lw.layouts[lw.param_nodes[names[3]]]
    dims = x_lay.dims[:2] + (wo_lay.dims[0],)
    split_in = tuple(a for a in wo_lay.dim_axes(1))
    lay = TLayout(dims).with_partial(("sum", split_in), site.origin) if split_in else TLayout(dims)
    return out, lay


def loss_replacement(lw: _Lowering, loss: torch.fx.Node) -> tuple[torch.fx.Node, TLayout] | None:
    site = _ce_site(lw)
    if site is None:
        return None
    logits_mark = _mark_node(lw, f"{site.module}.out")
    region = lw.loss_region
    labels = _data_ancestor(lw, region)
    if labels is None:
        raise _not_applicable(site, "the loss reads no label input")
    logits_lay = lw.layouts[logits_mark]
    if logits_lay.dim_axes(logits_lay.rank - 1) != site.axes:
        # blamed on a collective at the logits that changed their layout (an all-gather of
        # vocab-split logits), the algorithm's line when there is none
        at_logits = lw.binding.collectives_at(f"{site.module}.out")
        blamed = at_logits[-1].origin if at_logits else None
        lw.findings.append(Finding(
            "algorithm-not-applicable", "vocab-parallel-cross-entropy expects the logits split "
            f"over {', '.join(site.axes)} along the vocabulary; they are {logits_lay.describe()}",
            blamed or site.origin, site.module,
            notes=(f"the algorithm is applied at {site.origin.report_span}",)
            if blamed else ()))
    k, n = _group(lw, site.axes)
    axes = site.axes

    def run(z: torch.Tensor, y: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(z, y, k, axes, n)

    out = inline(lw, run, [lw.value(lw.stage, logits_mark), lw.value(lw.stage, labels), k])
    data_axes = tuple(a for f in lw.layouts[labels].dims[0] for a in f.axes)
    seq_axes = tuple(a for d in lw.layouts[labels].dims[1:] for f in d for a in f.axes)
    mean_axes = data_axes + seq_axes
    lay = TLayout(()).with_partial(("avg", mean_axes), site.origin) if mean_axes else TLayout(())
    return out, lay


def _data_ancestor(lw: _Lowering, region: set[torch.fx.Node]) -> torch.fx.Node | None:
    """The model input the loss computation reads (the labels)."""
    seen: set[torch.fx.Node] = set()
    todo = [n for r in region for n in r.all_input_nodes if n not in region]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "placeholder":
            if lw.cap.placeholders[node.name][0] == "data":
                return node
            continue
        if not module_stack(node):
            todo.extend(node.all_input_nodes)
    return None


def _not_applicable(site: _Site, why: str) -> LoweringError:
    return LoweringError(Finding("algorithm-not-applicable", f"`{site.name}` cannot be applied to "
                                 f"`{site.module}`: {why}", site.origin, site.module))


__all__ = ["Factor", "MICROBATCH_AXIS", "expert_parallel", "row_parallel_linear",
           "vocab_parallel_cross_entropy", "vocab_parallel_embedding"]
