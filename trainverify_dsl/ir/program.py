"""Programs: named graphs called in sequence, so identical layers share one graph.

A ``Program`` has named inputs (parameters by torch path, data, buffers, optimizer states),
a table of graphs, and a list of ``Call``s. Each call binds program tensor names to a graph's
inputs (in order) and names its outputs; later calls read those names. A block graph traced
once is called once per layer with that layer's parameter names, so the checker can prove
it once. ``inline`` expands every call into one flat ``Graph`` (small models, tests).

Invariants (``program_problems``): every graph verifies; every call names a known graph with
the right number of arguments whose types match the graph's inputs; every argument is a
program input or an earlier result; results and outputs name defined tensors, once each.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainverify_dsl.ir.graph import Graph, GraphBuilder, GraphInput
from trainverify_dsl.ir.interp import NUMERIC, Domain, evaluate_graph
from trainverify_dsl.ir.printer import format_graph
from trainverify_dsl.ir.types import TensorType
from trainverify_dsl.ir.verify import graph_problems


@dataclass(frozen=True, slots=True)
class Call:
    graph: str
    args: tuple[str, ...]
    results: tuple[str, ...]
    #: Module-path prefix for origins of the called nodes (``layers.3``), or ``""``.
    prefix: str = ""
    label: str = ""


@dataclass(frozen=True, slots=True)
class Boundary:
    """A value of a program where the data flow narrows to one tensor (the hidden state
    between two blocks), named by the marked points that denote it (``layers.2.out``,
    ``layers.3.in``): ``value`` is the program tensor holding it, ``cotangent`` the one
    holding the loss's gradient with respect to it. The checker cuts a proof there."""

    points: tuple[str, ...]
    value: str
    cotangent: str


@dataclass(frozen=True, slots=True)
class Program:
    inputs: tuple[GraphInput, ...]
    graphs: tuple[tuple[str, Graph], ...]
    calls: tuple[Call, ...]
    #: (output name, program tensor name)
    outputs: tuple[tuple[str, str], ...]

    def graph(self, name: str) -> Graph:
        return dict(self.graphs)[name]

    @property
    def unique_node_count(self) -> int:
        return sum(len(g.nodes) for _, g in self.graphs)

    @property
    def expanded_node_count(self) -> int:
        table = dict(self.graphs)
        return sum(len(table[call.graph].nodes) for call in self.calls)

    def op_histogram(self, expanded: bool = True) -> dict[str, int]:
        table, counts = dict(self.graphs), {}
        sources = [table[c.graph] for c in self.calls] if expanded else list(table.values())
        for graph in sources:
            for node in graph.nodes:
                counts[node.op] = counts.get(node.op, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _call_problems(program: Program, known: dict[str, TensorType]) -> list[str]:
    problems: list[str] = []
    table = dict(program.graphs)
    for i, call in enumerate(program.calls):
        graph = table.get(call.graph)
        if graph is None:
            problems.append(f"call {i}: unknown graph {call.graph!r}")
            continue
        if len(call.args) != len(graph.inputs) or len(call.results) != len(graph.outputs):
            problems.append(f"call {i} ({call.graph}): wrong number of arguments or results")
            continue
        for arg, graph_input in zip(call.args, graph.inputs, strict=True):
            if arg not in known:
                problems.append(f"call {i} ({call.graph}): {arg!r} is not defined yet")
            elif known[arg] != graph_input.type:
                problems.append(f"call {i} ({call.graph}): {arg!r} has type {known[arg]}, "
                                f"{graph_input.name!r} needs {graph_input.type}")
        for result, (_, value) in zip(call.results, graph.outputs, strict=True):
            if result in known:
                problems.append(f"call {i} ({call.graph}): {result!r} defined twice")
            known[result] = graph.value_type(value)
    return problems


def program_problems(program: Program) -> list[str]:
    """Every invariant violation of ``program`` as a message; empty when well formed."""
    problems = [f"graph {name}: %{value}: {message}" for name, graph in program.graphs
                for value, message in graph_problems(graph)]
    known = {g.name: g.type for g in program.inputs}
    problems += _call_problems(program, known)
    problems += [f"output {out!r}: {tensor!r} is undefined" for out, tensor in program.outputs
                 if tensor not in known]
    return problems


def evaluate_program(program: Program, inputs: Mapping[str, object],
                     domain: Domain = NUMERIC,
                     replace: Callable[[str, Any], Any] | None = None,
                     skip: Collection[int] = ()) -> dict[str, np.ndarray]:
    """Run every call in order on named input arrays (values of ``domain``, numeric by
    default); returns the named outputs. ``replace(name, value)``, when given, sees every
    call result and returns the value later calls read (the checker's stage cuts). The
    calls whose indices are in ``skip`` are not run: their results are zeros (the checker's
    symmetry, ``check/symmetry.py``, which proves those calls through others')."""
    env: dict[str, np.ndarray] = {g.name: domain.bind(inputs[g.name], g.type)
                                  for g in program.inputs}
    table = dict(program.graphs)
    for k, call in enumerate(program.calls):
        graph = table[call.graph]
        if k in skip:
            outputs = {name: domain.fill(graph.value_type(value).shape, 0)
                       for name, value in graph.outputs}
        else:
            bound = {g.name: env[arg] for g, arg in zip(graph.inputs, call.args, strict=True)}
            outputs = evaluate_graph(graph, bound, domain)
        for result, (name, _) in zip(call.results, graph.outputs, strict=True):
            env[result] = outputs[name] if replace is None else replace(result, outputs[name])
    return {out: env[tensor] for out, tensor in program.outputs}


def inline(program: Program) -> Graph:
    """The flat graph: every call expanded in place, origins prefixed with the call's prefix."""
    builder = GraphBuilder()
    env = {g.name: builder.add_input(g.name, g.kind, g.type) for g in program.inputs}
    table = dict(program.graphs)
    for call in program.calls:
        graph = table[call.graph]
        local = [env[arg] for arg in call.args]
        for node in graph.nodes:
            local.append(builder.add(node.op, (local[v] for v in node.inputs), node.attr_map(),
                                     node.type, node.origin.with_prefix(call.prefix)))
        for result, (_, value) in zip(call.results, graph.outputs, strict=True):
            env[result] = local[value]
    for out, tensor in program.outputs:
        builder.add_output(out, env[tensor])
    return builder.build()


def format_program(program: Program, origins: bool = False) -> str:
    """Canonical text: program inputs, each graph once, then the call list and outputs."""
    lines = ["program("]
    lines += [f'  {g.type} = {g.kind} "{g.name}"' for g in program.inputs]
    lines.append(")")
    for name, graph in program.graphs:
        lines.append(format_graph(graph, name, origins).rstrip("\n"))
    for call in program.calls:
        results = ", ".join(f'"{r}"' for r in call.results)
        args = ", ".join(f'"{a}"' for a in call.args)
        lines.append(f"call {call.graph}({args}) -> ({results})")
    outputs = ", ".join(f'{out} = "{tensor}"' for out, tensor in program.outputs)
    lines.append(f"return ({outputs})")
    return "\n".join(lines) + "\n"
