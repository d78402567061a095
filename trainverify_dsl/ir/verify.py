"""The IR verifier.

Invariants of a well-formed ``Graph``:

1. Every op is in the registry (``ir.ops.OPS``); collectives are allowed only when asked for.
2. Arity: the number of operands matches the op's arity (variadic ops: at least ``min_arity``).
3. Attributes: exactly the op's attribute names, in canonical (sorted) order.
4. Topological order, no dangling operands: every operand of node ``k`` is an input or a value
   defined by an earlier node.
5. Types: each node's shape and dtype equal what the op's shape rule gives for its operands.
6. Inputs have unique names and known kinds; shapes are non-negative.
7. Outputs: names are unique and every output refers to a defined value.

``verify_graph`` raises ``IRVerifyError`` whose message shows the printed IR around the first
offending node; ``graph_problems`` returns every problem as ``(value, message)`` data.
"""

from __future__ import annotations

from trainverify_dsl.ir.graph import INPUT_KINDS, Graph, Node
from trainverify_dsl.ir.ops import OPS, ShapeError
from trainverify_dsl.ir.printer import excerpt


class IRVerifyError(Exception):
    def __init__(self, value: int, message: str, context: str) -> None:
        super().__init__(f"IR verification failed at %{value}: {message}\n{context}")
        self.value = value
        self.problem = message
        self.context = context


def _node_problem(graph: Graph, node: Node, value: int, allow_collectives: bool) -> str | None:
    op = OPS.get(node.op)
    if op is None:
        return f"unknown op {node.op!r}"
    if op.collective and not allow_collectives:
        return f"collective {node.op!r} in a single-device graph"
    if op.arity is not None and len(node.inputs) != op.arity:
        return f"{node.op} takes {op.arity} operands, got {len(node.inputs)}"
    if op.arity is None and len(node.inputs) < op.min_arity:
        return f"{node.op} takes at least {op.min_arity} operands, got {len(node.inputs)}"
    names = tuple(k for k, _ in node.attrs)
    if names != tuple(sorted(op.attrs)):
        return f"{node.op} attributes {names}, expected {tuple(sorted(op.attrs))}"
    late = [v for v in node.inputs if not 0 <= v < value]
    if late:
        return f"operand %{late[0]} is not defined before use"
    operand_types = tuple(graph.value_type(v) for v in node.inputs)
    try:
        expected = op.shape_rule(operand_types, node.attr_map())
    except (ShapeError, KeyError, IndexError, TypeError) as error:
        return f"{node.op}: {error}"
    if expected != node.type:
        return f"{node.op}: type {node.type} but the shape rule gives {expected}"
    return None


def _input_problems(graph: Graph) -> list[tuple[int, str]]:
    problems: list[tuple[int, str]] = []
    seen: set[str] = set()
    for i, graph_input in enumerate(graph.inputs):
        if graph_input.name in seen:
            problems.append((i, f"duplicate input name {graph_input.name!r}"))
        if graph_input.kind not in INPUT_KINDS:
            problems.append((i, f"unknown input kind {graph_input.kind!r}"))
        if any(s < 0 for s in graph_input.type.shape):
            problems.append((i, "negative dimension"))
        seen.add(graph_input.name)
    return problems


def graph_problems(graph: Graph, allow_collectives: bool = False) -> list[tuple[int, str]]:
    """Every invariant violation as ``(value number, message)``; empty when well formed."""
    problems = _input_problems(graph)
    n_in = len(graph.inputs)
    for k, node in enumerate(graph.nodes):
        problem = _node_problem(graph, node, n_in + k, allow_collectives)
        if problem:
            problems.append((n_in + k, problem))
    n_values = n_in + len(graph.nodes)
    names = [name for name, _ in graph.outputs]
    for name, value in graph.outputs:
        if not 0 <= value < n_values:
            problems.append((n_values - 1, f"output {name!r} refers to undefined %{value}"))
        if names.count(name) > 1:
            problems.append((max(0, min(value, n_values - 1)), f"duplicate output {name!r}"))
    return problems


def verify_graph(graph: Graph, allow_collectives: bool = False) -> None:
    """Raise ``IRVerifyError`` (with the printed IR around it) at the first violation."""
    problems = graph_problems(graph, allow_collectives)
    if problems:
        value, message = problems[0]
        raise IRVerifyError(value, message, excerpt(graph, value))
