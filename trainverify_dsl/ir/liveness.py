"""How many bytes evaluating a graph holds at once (the simulation's memory estimate, and
how many microbatches the numeric run batches: ``ir/execute.py``)."""

from __future__ import annotations

from trainverify_dsl.ir.graph import Graph
from trainverify_dsl.ir.types import TensorType


def value_bytes(t: TensorType) -> int:
    """The interpreter computes in float64 and int64 (``ir/types.py``): 8 bytes an element."""
    return 8 * max(t.numel, 1)


def peak_live_bytes(graph: Graph) -> int:
    """The most bytes one evaluation of ``graph`` holds at once: its inputs throughout, each
    other value from its definition to its last use (outputs to the end)."""
    n_in = len(graph.inputs)
    last: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[v] = i
    for _, v in graph.outputs:
        last[v] = len(graph.nodes)
    live = sum(value_bytes(g.type) for g in graph.inputs)
    peak = live
    for i, node in enumerate(graph.nodes):
        live += value_bytes(node.type)
        peak = max(peak, live)
        for v in set(node.inputs):
            if v >= n_in and last.get(v) == i:
                live -= value_bytes(graph.value_type(v))
        if last.get(n_in + i) is None:  # never used: freed at once
            live -= value_bytes(node.type)
    return peak
