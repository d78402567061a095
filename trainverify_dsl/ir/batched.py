"""Rank-batched SPMD evaluation: one numpy call per op for all ranks of a stage.

``evaluate_spmd_batched`` computes what ``interp.evaluate_spmd`` computes, but a value is
either **shared** (the same on every rank: constants and ops of shared values, computed once)
or **batched** (one array with the ranks on a new leading axis). Each op's registry entry says
how it batches (``OpDef.rank_batch``):

- ``shared``: no operands (constants);
- ``elementwise``: operands are aligned to the output's rank after the rank axis, so numpy
  broadcasting pairs rank with rank and a shared operand with every rank;
- ``dims``: the op's ``dim``/``dims`` attributes move one place right (operands batched);
- ``view``: as ``dims``, and ``shape`` attributes gain the rank axis in front;
- ``matmul``: ``@`` already batches over leading axes;
- ``collective``: each group's members are taken from the rank axis and put back;
- ``loop``: per rank, then stacked (data-dependent indexing).

Cost therefore grows with the number of distinct ops, not ranks x ops. ``evaluate_spmd``
stays the reference: the tests compare both on every small plan's stages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trainverify_dsl.ir.graph import Graph, Node
from trainverify_dsl.ir.interp import GroupsFn, InterpError, _bind_inputs, _dead_after
from trainverify_dsl.ir.ops import OPS, norm_dim
from trainverify_dsl.ir.types import numpy_dtype


class Shared:
    """A value every rank holds identically (computed once)."""

    __slots__ = ("value",)

    def __init__(self, value: np.ndarray) -> None:
        self.value = value


Value = Any  # np.ndarray (batched, rank axis first) or Shared


def _batched(v: Value, n: int) -> np.ndarray:
    """``v`` with the rank axis (a broadcast view for a shared value)."""
    if isinstance(v, Shared):
        return np.broadcast_to(v.value, (n,) + np.shape(v.value))
    return v


def _shift_dims(node: Node, ranks: Sequence[int]) -> dict[str, Any]:
    """The node's attributes with ``dim``/``dims`` one place right (``ranks``: the operands'
    per-rank ranks; the first operand's rank normalises negative dimensions)."""
    attrs = node.attr_map()
    rank = max(ranks[0], 1) if ranks else len(node.shape)
    if node.op == "unsqueeze":
        rank = len(node.shape)  # the inserted dimension indexes the output
    for key in ("dim", "split_dim", "concat_dim"):
        if isinstance(attrs.get(key), int):
            attrs[key] = norm_dim(attrs[key], rank) + 1
    if attrs.get("dims") is not None:
        attrs["dims"] = tuple(norm_dim(d, rank) + 1 for d in attrs["dims"])
    return attrs


def _elementwise(node: Node, args: list[Value], n: int, graph: Graph) -> np.ndarray:
    out_rank = len(node.shape)
    aligned = []
    for v, value in zip(node.inputs, args, strict=True):
        if isinstance(value, Shared):
            aligned.append(value.value)
        else:
            rank = len(graph.value_type(v).shape)
            aligned.append(value.reshape((n,) + (1,) * (out_rank - rank) + value.shape[1:]))
    return OPS[node.op].evaluate(tuple(aligned), node.attr_map())


def _view(node: Node, args: list[Value], n: int, graph: Graph) -> np.ndarray:
    ranks = [len(graph.value_type(v).shape) for v in node.inputs]
    attrs = _shift_dims(node, ranks)
    if node.op == "permute":
        attrs["dims"] = (0,) + tuple(attrs["dims"])
    if "shape" in attrs:
        attrs["shape"] = (n,) + tuple(attrs["shape"])
    operands = [_batched(a, n) for a in args]
    if node.op == "expand":  # new leading dimensions go after the rank axis
        x = operands[0]
        operands[0] = x.reshape((n,) + (1,) * (len(node.shape) - ranks[0]) + x.shape[1:])
    return OPS[node.op].evaluate(tuple(operands), attrs)


def _loop(node: Node, args: list[Value], n: int) -> np.ndarray:
    attrs = node.attr_map()
    results = [OPS[node.op].evaluate(tuple(a.value if isinstance(a, Shared) else a[r]
                                           for a in args), attrs) for r in range(n)]
    return np.stack([np.asarray(x) for x in results])


def _collective(node: Node, args: list[Value], n: int, groups: GroupsFn) -> np.ndarray:
    attrs = node.attr_map()
    operands = [_batched(a, n) for a in args]
    out: list[Any] = [None] * n
    for group in groups(attrs["axis"]):
        per_rank = [tuple(x[r] for x in operands) for r in group]
        for rank, result in zip(group, OPS[node.op].evaluate(per_rank, attrs), strict=True):
            out[rank] = np.asarray(result)
    if any(x is None for x in out):
        raise InterpError(f"a rank is in no group of axis {attrs['axis']!r}")
    return np.stack(out)


def _run(node: Node, args: list[Value], n: int, graph: Graph, groups: GroupsFn) -> Value:
    how = OPS[node.op].rank_batch
    if how != "collective" and all(isinstance(a, Shared) for a in args):
        shared = OPS[node.op].evaluate(tuple(a.value for a in args), node.attr_map())
        return Shared(np.asarray(shared).astype(numpy_dtype(node.dtype), copy=False))
    with np.errstate(all="ignore"):
        if how == "elementwise":
            result = _elementwise(node, args, n, graph)
        elif how in ("dims", "view"):
            result = _view(node, args, n, graph)
        elif how == "matmul":
            result = OPS[node.op].evaluate(tuple(_batched(a, n) for a in args),
                                           node.attr_map())
        elif how == "collective":
            result = _collective(node, args, n, groups)
        else:
            result = _loop(node, args, n)
    result = np.asarray(result).astype(numpy_dtype(node.dtype), copy=False)
    if result.shape != (n,) + tuple(node.shape):
        raise InterpError(f"{node.op}: batched result {result.shape}, expected "
                          f"{(n,) + tuple(node.shape)}")
    return result


def evaluate_spmd_batched(graph: Graph, rank_inputs: Sequence[Mapping[str, object]],
                          groups: GroupsFn | None = None) -> list[dict[str, np.ndarray]]:
    """``interp.evaluate_spmd``, rank-batched (module docstring); same inputs and results."""
    n = len(rank_inputs)
    groups = groups or (lambda axis: [list(range(n))])
    bound = [_bind_inputs(graph, inputs) for inputs in rank_inputs]
    values: list[Value] = [_stack_input([b[i] for b in bound]) for i in range(len(graph.inputs))]
    dead = _dead_after(graph)
    for k, node in enumerate(graph.nodes):
        values.append(_run(node, [values[v] for v in node.inputs], n, graph, groups))
        for v in dead[k]:
            values[v] = None
    outputs = [(name, values[value]) for name, value in graph.outputs]
    return [{name: (v.value if isinstance(v, Shared) else v[r]) for name, v in outputs}
            for r in range(n)]


def _stack_input(per_rank: list[np.ndarray]) -> Value:
    first = per_rank[0]
    if all(x is first or np.array_equal(x, first) for x in per_rank[1:]):
        return Shared(first)
    return np.stack(per_rank)
