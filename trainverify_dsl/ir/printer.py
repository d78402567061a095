"""The canonical text form of the IR.

Variable names are assigned here (``%0``, ``%1``... in value order), so the printed form is
THE canonical text of a graph: equal graphs print identically, and the text is what golden
tests and caches compare. Origins are omitted unless asked for; they are not part of it.

    graph mlp(
      %0: f32[4,8] = param "fc.weight"
      %1: i64[2] = data "tokens"
    ) {
      %2: f32[8,4] = permute[dims=(1,0)] %0
      ...
    } -> (loss = %7, grad(fc.weight) = %12)
"""

from __future__ import annotations

from typing import Any

from trainverify_dsl.ir.graph import Graph, Node


def format_attr_value(value: Any) -> str:
    if isinstance(value, tuple):
        inner = ",".join(format_attr_value(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def format_node(node: Node, value: int, origins: bool = False) -> str:
    attrs = ", ".join(f"{k}={format_attr_value(v)}" for k, v in node.attrs)
    head = f"%{value}: {node.type} = {node.op}"
    if attrs:
        head += f"[{attrs}]"
    operands = ", ".join(f"%{v}" for v in node.inputs)
    text = f"{head} {operands}".rstrip()
    if origins and (node.origin.module or node.origin.phase):
        text = f"{text:<60}  # {node.origin.phase} {node.origin.module}".rstrip()
    return text


def format_graph_lines(graph: Graph, name: str = "", origins: bool = False) -> list[str]:
    lines = [f"graph {name}(".replace("graph (", "graph(")]
    for i, graph_input in enumerate(graph.inputs):
        lines.append(f'  %{i}: {graph_input.type} = {graph_input.kind} "{graph_input.name}"')
    lines.append(") {")
    n_in = len(graph.inputs)
    for k, node in enumerate(graph.nodes):
        lines.append("  " + format_node(node, n_in + k, origins))
    outputs = ", ".join(f"{out} = %{value}" for out, value in graph.outputs)
    lines.append(f"}} -> ({outputs})")
    return lines


def format_graph(graph: Graph, name: str = "", origins: bool = False) -> str:
    """The canonical text of ``graph`` (with ``origins=True``: plus origin comments)."""
    return "\n".join(format_graph_lines(graph, name, origins)) + "\n"


def excerpt(graph: Graph, value: int, context: int = 3) -> str:
    """The printed lines around the definition of ``value``, the offending line marked."""
    lines = format_graph_lines(graph, origins=True)
    line_of_value = 1 + value if value < len(graph.inputs) else 2 + value
    low, high = max(0, line_of_value - context), min(len(lines), line_of_value + context + 1)
    marked = [("> " if i == line_of_value else "  ") + lines[i] for i in range(low, high)]
    return "\n".join(marked)
