"""Split a graph into phases by what its values depend on.

Given a phase number for some inputs (unlisted inputs are phase 0), a node's phase is the
largest phase among its operands. Phase ``p``'s graph computes exactly the nodes of phase ``p``;
it takes the original inputs it uses (of phase <= p) plus ``saved.N`` values carried from
earlier phases, and returns the original outputs of phase ``p`` plus the ``saved.N`` values
later phases need. Nodes without operands (constants) and chains built only from them are
"free": each phase recomputes the ones it uses instead of carrying them.

This is how a joint forward+backward graph becomes a forward graph and a backward graph
(phase 1 = everything depending on the tangent), so a program can interleave blocks.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainverify_dsl.ir.graph import Graph, GraphBuilder

FREE = -1


def value_phases(graph: Graph, input_phase: Mapping[str, int]) -> list[int]:
    phases = [input_phase.get(g.name, 0) for g in graph.inputs]
    for node in graph.nodes:
        phases.append(max((phases[v] for v in node.inputs), default=FREE))
    return phases


def saved_name(value: int) -> str:
    return f"saved.{value}"


class _PhaseBuilder:
    def __init__(self, graph: Graph, phases: list[int], phase: int) -> None:
        self.graph, self.phases, self.phase = graph, phases, phase
        self.builder = GraphBuilder()
        self.local: dict[int, int] = {}

    def add_inputs(self, used: set[int], carried: list[int]) -> None:
        for i, graph_input in enumerate(self.graph.inputs):
            if self.phases[i] == self.phase or (i in used and self.phases[i] < self.phase):
                self.local[i] = self.builder.add_input(graph_input.name, graph_input.kind,
                                                       graph_input.type)
        for value in carried:
            kind = "activation"
            self.local[value] = self.builder.add_input(saved_name(value), kind,
                                                       self.graph.value_type(value))

    def value(self, v: int) -> int:
        if v not in self.local:  # a free value: recompute it here
            node = self.graph.nodes[v - len(self.graph.inputs)]
            operands = [self.value(u) for u in node.inputs]
            self.local[v] = self.builder.add(node.op, operands, node.attr_map(), node.type,
                                             node.origin)
        return self.local[v]


def _operand_uses(graph: Graph, phases: list[int]) -> dict[int, set[int]]:
    """Per phase: values of other phases (or inputs) its nodes and outputs read."""
    n_in = len(graph.inputs)
    uses: dict[int, set[int]] = {}
    for k, node in enumerate(graph.nodes):
        phase = phases[n_in + k]
        for v in node.inputs:
            if phase != FREE and (phases[v] != phase or v < n_in):
                uses.setdefault(phase, set()).add(v)
    for _, value in graph.outputs:
        uses.setdefault(max(phases[value], 0), set()).add(value)
    return uses


def _free_closure(graph: Graph, phases: list[int], values: set[int]) -> set[int]:
    """Non-free operands reached through free chains (a free node's operands are free too)."""
    return {v for v in values if phases[v] != FREE or v < len(graph.inputs)}


def split_phases(graph: Graph, input_phase: Mapping[str, int], n_phases: int) -> list[Graph]:
    """One graph per phase ``0 .. n_phases - 1`` (see the module docstring)."""
    phases = value_phases(graph, input_phase)
    n_in = len(graph.inputs)
    uses = _operand_uses(graph, phases)
    carried = {p: sorted(v for v in _free_closure(graph, phases, uses.get(p, set()))
                         if v >= n_in and phases[v] < p) for p in range(n_phases)}
    needed_later = {v for p in range(n_phases) for v in carried[p]}
    result = []
    for p in range(n_phases):
        pb = _PhaseBuilder(graph, phases, p)
        pb.add_inputs(uses.get(p, set()), carried[p])
        for k, node in enumerate(graph.nodes):
            if phases[n_in + k] == p:
                operands = [pb.value(v) for v in node.inputs]
                pb.local[n_in + k] = pb.builder.add(node.op, operands, node.attr_map(),
                                                    node.type, node.origin)
        for name, value in graph.outputs:
            if max(phases[value], 0) == p:
                pb.builder.add_output(name, pb.value(value))
        for value in sorted(needed_later):
            if phases[value] == p:
                pb.builder.add_output(saved_name(value), pb.local[value])
        result.append(pb.builder.build())
    return result
