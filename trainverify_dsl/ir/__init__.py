"""The tensor IR shared by the spec and the parallel program.

- ``types``: ``TensorType`` (static shape + dtype name) and dtype promotion.
- ``ops``: the op registry, one ``OpDef`` per op (shape rule, numpy semantics, checker hooks).
- ``graph``: immutable ``Node``/``Graph`` and a ``GraphBuilder``.
- ``printer``: the canonical text form.
- ``verify``: the IR verifier (invariants in its docstring).
- ``interp``: the numeric interpreter (float64), single device and SPMD.
- ``program``: ``Program`` of graph calls (one graph per distinct block), ``inline``.
- ``split``: split a joint graph into phases (forward / backward) by input dependency.
"""

from trainverify_dsl.ir.graph import Graph, GraphBuilder, GraphInput, Node, Origin, prune
from trainverify_dsl.ir.interp import evaluate_graph, evaluate_spmd
from trainverify_dsl.ir.ops import GROUPS, OPS, OpDef, ShapeError
from trainverify_dsl.ir.printer import format_graph
from trainverify_dsl.ir.program import (
    Call,
    Program,
    evaluate_program,
    format_program,
    inline,
    program_problems,
)
from trainverify_dsl.ir.split import split_phases
from trainverify_dsl.ir.types import TensorType
from trainverify_dsl.ir.verify import IRVerifyError, graph_problems, verify_graph

__all__ = [
    "GROUPS", "OPS", "Call", "Graph", "GraphBuilder", "GraphInput", "IRVerifyError", "Node",
    "OpDef", "Origin", "Program", "ShapeError", "TensorType", "evaluate_graph", "evaluate_program",
    "evaluate_spmd", "format_graph", "format_program", "graph_problems", "inline", "prune",
    "program_problems", "split_phases", "verify_graph",
]
