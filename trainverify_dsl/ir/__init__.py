"""The tensor IR shared by the spec and the parallel program.

- ``types``: ``TensorType`` (static shape + dtype name) and dtype promotion.
- ``ops``: the op registry, one ``OpDef`` per op (shape rule, numpy semantics, checker hooks).
- ``collectives``: the collectives' semantics, one table (IR op, default backward, layout rule).
- ``graph``: immutable ``Node``/``Graph`` and a ``GraphBuilder``.
- ``printer``: the canonical text form.
- ``verify``: the IR verifier (invariants in its docstring).
- ``interp``: the numeric interpreter (float64), single device and SPMD.
- ``program``: ``Program`` of graph calls (one graph per distinct block), ``inline``.
- ``split``: split a joint graph into phases (forward / backward) by input dependency.
- ``layout``, ``mesh``, ``parallel``, ``execute``, ``batched``: the parallel program and its
  rank-batched evaluation.

The names below are loaded on first use, so that importing one light module
(``ir.collectives``, for ``tvp lint``) does not import numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Graph": "graph", "GraphBuilder": "graph", "GraphInput": "graph", "Node": "graph",
    "Origin": "graph", "prune": "graph",
    "evaluate_graph": "interp", "evaluate_spmd": "interp",
    "GROUPS": "ops", "OPS": "ops", "OpDef": "ops", "ShapeError": "ops",
    "format_graph": "printer",
    "Call": "program", "Program": "program", "evaluate_program": "program",
    "format_program": "program", "inline": "program", "program_problems": "program",
    "split_phases": "split",
    "TensorType": "types",
    "IRVerifyError": "verify", "graph_problems": "verify", "verify_graph": "verify",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
