"""IR nodes and graphs.

A graph numbers its values: inputs are values ``0 .. len(inputs) - 1`` and node ``k`` defines
value ``len(inputs) + k``. Node operands are value numbers, so a graph is a plain immutable
value: equal graphs compare and hash equal. Origins (torch module path, phase, plan span) are
carried on nodes but are not part of equality, so two traces of identical code are equal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from trainverify_dsl.ir.ops import OPS, ShapeError
from trainverify_dsl.ir.types import TensorType
from trainverify_dsl.report.span import Span

#: Kinds of graph inputs.
INPUT_KINDS = ("param", "buffer", "data", "tangent", "activation", "state", "hyper")

AttrItems = tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a node comes from: torch module path and phase, or a plan span."""

    module: str = ""
    #: ``forward``, ``backward``, ``optimizer`` or ``""``.
    phase: str = ""
    #: The source op (e.g. ``aten.addmm.default``).
    source: str = ""
    #: Innermost user-code frame as ``path:line`` (e.g. ``stdlib/models/llama.py:88``).
    stack: str = ""
    span: Span | None = None

    def with_prefix(self, prefix: str) -> Origin:
        if not prefix:
            return self
        module = f"{prefix}.{self.module}" if self.module else prefix
        return replace(self, module=module)


NO_ORIGIN = Origin()


def canonical_value(value: Any) -> Any:
    """Attribute values are hashable and canonical: lists become tuples, numpy scalars Python."""
    if isinstance(value, (list, tuple)):
        return tuple(canonical_value(v) for v in value)
    if hasattr(value, "item") and not isinstance(value, (bool, int, float, str)):
        value = value.item()
    if isinstance(value, float) and value == 0.0:
        return 0.0  # -0.0 == 0.0 compares equal, so it must also print the same
    return value


def make_attrs(attrs: Mapping[str, Any] | None = None) -> AttrItems:
    """Attributes in canonical (sorted key) order."""
    return tuple(sorted((k, canonical_value(v)) for k, v in (attrs or {}).items()))


@dataclass(frozen=True, slots=True)
class Node:
    op: str
    inputs: tuple[int, ...]
    attrs: AttrItems
    type: TensorType
    origin: Origin = field(default=NO_ORIGIN, compare=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    def attr_map(self) -> dict[str, Any]:
        return dict(self.attrs)

    def replace(self, **changes: Any) -> Node:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class GraphInput:
    name: str
    kind: str
    type: TensorType


@dataclass(frozen=True, slots=True)
class Graph:
    """A straight-line program: named inputs, nodes in topological order, named outputs."""

    inputs: tuple[GraphInput, ...]
    nodes: tuple[Node, ...]
    #: (output name, value number)
    outputs: tuple[tuple[str, int], ...]

    def value_type(self, value: int) -> TensorType:
        if value < len(self.inputs):
            return self.inputs[value].type
        return self.nodes[value - len(self.inputs)].type

    def input_index(self, name: str) -> int:
        for i, graph_input in enumerate(self.inputs):
            if graph_input.name == name:
                return i
        raise KeyError(name)

    def output_value(self, name: str) -> int:
        return dict(self.outputs)[name]

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.outputs)


class GraphBuilder:
    """Builds a graph node by node; types come from the op's shape rule unless given."""

    def __init__(self) -> None:
        self._inputs: list[GraphInput] = []
        self._nodes: list[Node] = []
        self._outputs: list[tuple[str, int]] = []
        self._input_names: set[str] = set()

    def add_input(self, name: str, kind: str, type_: TensorType) -> int:
        assert not self._nodes, "inputs must be added before nodes"
        assert kind in INPUT_KINDS, kind
        assert name not in self._input_names, f"duplicate input {name!r}"
        self._input_names.add(name)
        self._inputs.append(GraphInput(name, kind, type_))
        return len(self._inputs) - 1

    def value_type(self, value: int) -> TensorType:
        if value < len(self._inputs):
            return self._inputs[value].type
        return self._nodes[value - len(self._inputs)].type

    def add(self, op: str, inputs: Iterable[int], attrs: Mapping[str, Any] | None = None,
            type_: TensorType | None = None, origin: Origin = NO_ORIGIN) -> int:
        operands = tuple(inputs)
        items = make_attrs(attrs)
        if type_ is None:
            operand_types = tuple(self.value_type(v) for v in operands)
            type_ = OPS[op].shape_rule(operand_types, dict(items))
        self._nodes.append(Node(op, operands, items, type_, origin))
        return len(self._inputs) + len(self._nodes) - 1

    def add_output(self, name: str, value: int) -> None:
        self._outputs.append((name, value))

    def set_output(self, name: str, value: int) -> None:
        """``add_output``, replacing an earlier output of that name."""
        self._outputs = [(n, v) for n, v in self._outputs if n != name]
        self._outputs.append((name, value))

    def build(self) -> Graph:
        return Graph(tuple(self._inputs), tuple(self._nodes), tuple(self._outputs))


def prune(graph: Graph) -> Graph:
    """Drop nodes no output depends on (inputs are kept); renumbers values."""
    n_in = len(graph.inputs)
    live = {value for _, value in graph.outputs}
    for k in range(len(graph.nodes) - 1, -1, -1):
        if n_in + k in live:
            live.update(graph.nodes[k].inputs)
    renumber = {i: i for i in range(n_in)}
    nodes: list[Node] = []
    for k, node in enumerate(graph.nodes):
        if n_in + k in live:
            renumber[n_in + k] = n_in + len(nodes)
            nodes.append(node.replace(inputs=tuple(renumber[v] for v in node.inputs)))
    outputs = tuple((name, renumber[value]) for name, value in graph.outputs)
    return Graph(graph.inputs, tuple(nodes), outputs)


def restrict(graph: Graph, outputs: tuple[str, ...], drop_inputs: bool = False) -> Graph:
    """``graph`` with only the named ``outputs`` and the nodes they need; with
    ``drop_inputs`` also without the inputs they do not read."""
    kept = prune(Graph(graph.inputs, graph.nodes,
                       tuple((n, v) for n, v in graph.outputs if n in outputs)))
    if not drop_inputs:
        return kept
    n_in = len(kept.inputs)
    used = sorted({v for node in kept.nodes for v in node.inputs if v < n_in}
                  | {v for _, v in kept.outputs if v < n_in})
    renumber = {old: new for new, old in enumerate(used)}
    for k in range(len(kept.nodes)):
        renumber[n_in + k] = len(used) + k
    nodes = tuple(node.replace(inputs=tuple(renumber[v] for v in node.inputs))
                  for node in kept.nodes)
    return Graph(tuple(kept.inputs[i] for i in used), nodes,
                 tuple((name, renumber[v]) for name, v in kept.outputs))


__all__ = ["Graph", "GraphBuilder", "GraphInput", "Node", "Origin", "NO_ORIGIN", "ShapeError",
           "make_attrs", "prune", "restrict"]
