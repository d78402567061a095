"""Numeric interpreter of the IR: numpy, floats in float64, integers in int64.

``evaluate_graph`` runs a single-device graph. ``evaluate_spmd`` runs one graph on several
ranks in lock step: ordinary ops run per rank; a collective gathers its operand from every
rank of each group along its mesh axis and hands back each rank's result.

Both take a ``Domain``: how a value is bound and how an op runs on values. ``NUMERIC`` (the
default) is the registry's numpy semantics in float64/int64; the checker passes its exact
symbolic domain (``check/symbolic.py``), so the one program text has one meaning in both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from trainverify_dsl.ir.graph import Graph, Node
from trainverify_dsl.ir.ops import OPS
from trainverify_dsl.ir.types import TensorType, numpy_dtype

#: axis name -> list of rank groups (each group: ranks in group order)
GroupsFn = Callable[[str], Sequence[Sequence[int]]]


class InterpError(ValueError):
    """Bad inputs for the interpreter (missing, wrong shape) or an op it cannot run."""


def as_value(array: object, type_: TensorType) -> np.ndarray:
    """An input array converted to the interpreter's carrier type, its shape checked."""
    value = np.asarray(array).astype(numpy_dtype(type_.dtype))
    if value.shape != type_.shape:
        raise InterpError(f"expected shape {type_.shape}, got {value.shape}")
    return value


def run_node(node: Node, args: tuple[np.ndarray, ...], floats: type = np.float64
             ) -> np.ndarray:
    """``node`` on ``args``, its result in the carrier type (``floats`` for a float)."""
    # NaN/inf results are values like any other (torch computes them too): no warnings.
    with np.errstate(all="ignore"):
        result = OPS[node.op].evaluate(args, node.attr_map())
    carrier = numpy_dtype(node.dtype)
    return np.asarray(result).astype(floats if carrier is np.float64 else carrier, copy=False)


class Domain:
    """Values and op semantics. This base class is the numeric domain (``NUMERIC``): the
    registry's numpy evaluation, carriers float64/int64/bool. A subclass overrides what it
    computes differently; everything that runs programs (``ir/execute.py``) asks its domain."""

    #: values may be compared with a tolerance (float round-off); ``False``: exact values
    approximate = True

    def bind(self, array: object, type_: TensorType) -> Any:
        """A program input as a value of this domain (its shape checked)."""
        return as_value(array, type_)

    def run(self, node: Node, args: tuple[Any, ...]) -> Any:
        return run_node(node, args)

    def collective(self, op: str, per_rank: list[tuple[Any, ...]], attrs: Mapping[str, Any]
                   ) -> list[Any]:
        """``op`` (a collective of the registry) on one group's operands, in group order."""
        return OPS[op].evaluate(per_rank, attrs)

    def fill(self, shape: tuple[int, ...], value: Any) -> Any:
        """A float tensor of ``shape`` holding ``value`` (an int or ``Fraction``) everywhere."""
        return np.full(shape, float(value))

    def known(self, value: Any) -> Any:
        """The number a one-element ``value`` holds when this domain knows it exactly (an
        int, float or ``Fraction``), else ``None``: a token count computed from integer
        data is known in every domain."""
        item = np.asarray(value).reshape(()).item()
        return item if isinstance(item, (bool, int, float, np.number)) else None


#: The numeric domain (numpy, float64).
NUMERIC = Domain()


class Extended(Domain):
    """The numeric domain with floats carried in ``np.longdouble`` (x87 extended precision on
    this platform: a 64-bit mantissa, round-off about 2,000 times below float64's). Not a
    meaning of its own: it measures how much float64 round-off moves a step's outputs
    (``simulate/run.Roundoff``). An op whose numpy semantics convert to float64 inside (a
    dtype conversion, ``erf``) computes that one op at float64 precision."""

    def bind(self, array: object, type_: TensorType) -> Any:
        return _widen(as_value(array, type_))

    def run(self, node: Node, args: tuple[Any, ...]) -> Any:
        return run_node(node, args, np.longdouble)

    def collective(self, op: str, per_rank: list[tuple[Any, ...]], attrs: Mapping[str, Any]
                   ) -> list[Any]:
        return [_widen(np.asarray(v)) for v in OPS[op].evaluate(per_rank, attrs)]

    def fill(self, shape: tuple[int, ...], value: Any) -> Any:
        if isinstance(value, Fraction):
            return np.full(shape, np.longdouble(value.numerator) / value.denominator)
        return np.full(shape, np.longdouble(value))


def _widen(value: np.ndarray) -> np.ndarray:
    return value.astype(np.longdouble) if value.dtype == np.float64 else value


#: The numeric domain in extended precision.
EXTENDED = Extended()


def _bind_inputs(graph: Graph, inputs: Mapping[str, object],
                 domain: Domain = NUMERIC) -> list[Any]:
    missing = [g.name for g in graph.inputs if g.name not in inputs]
    if missing:
        raise InterpError(f"missing graph inputs: {', '.join(missing[:5])}")
    return [domain.bind(inputs[g.name], g.type) for g in graph.inputs]


def evaluate_graph(graph: Graph, inputs: Mapping[str, object],
                   domain: Domain = NUMERIC) -> dict[str, np.ndarray]:
    """Evaluate ``graph`` on named input arrays; returns the named outputs. Values are dropped
    after their last use (a full training step keeps only its live values)."""
    values: list[Any] = _bind_inputs(graph, inputs, domain)
    dead = _dead_after(graph)
    for k, node in enumerate(graph.nodes):
        if OPS[node.op].collective:
            raise InterpError(f"collective {node.op!r} needs evaluate_spmd")
        values.append(domain.run(node, tuple(values[v] for v in node.inputs)))
        for v in dead[k]:
            values[v] = None
    return {name: values[value] for name, value in graph.outputs}


def _run_collective(node: Node, per_rank: list[list[Any]], groups: GroupsFn,
                    domain: Domain = NUMERIC) -> None:
    attrs = node.attr_map()
    results: dict[int, Any] = {}
    for group in groups(attrs["axis"]):
        operands = [tuple(per_rank[r][v] for v in node.inputs) for r in group]
        outs = domain.collective(node.op, operands, attrs)
        for rank, out in zip(group, outs, strict=True):
            results[rank] = np.asarray(out).astype(numpy_dtype(node.dtype), copy=False) \
                if domain.approximate else out
    for rank, values in enumerate(per_rank):
        if rank not in results:
            raise InterpError(f"rank {rank} is in no group of axis {attrs['axis']!r}")
        values.append(results[rank])


def _dead_after(graph: Graph) -> list[list[int]]:
    """For each node, the values no later node or output reads (freed after it runs)."""
    last: dict[int, int] = {}
    for k, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[v] = k
    kept = {value for _, value in graph.outputs}
    dead: list[list[int]] = [[] for _ in graph.nodes]
    for value, k in last.items():
        if value not in kept:
            dead[k].append(value)
    return dead


def evaluate_spmd(graph: Graph, rank_inputs: Sequence[Mapping[str, object]],
                  groups: GroupsFn | None = None, domain: Domain = NUMERIC
                  ) -> list[dict[str, np.ndarray]]:
    """Evaluate ``graph`` on every rank; ``groups(axis)`` gives the rank groups of an axis
    (default: one group of all ranks). Values are dropped after their last use, so memory
    follows the live values, not the whole graph times the ranks."""
    n_ranks = len(rank_inputs)
    groups = groups or (lambda axis: [list(range(n_ranks))])
    per_rank: list[list[Any]] = [_bind_inputs(graph, inputs, domain) for inputs in rank_inputs]
    dead = _dead_after(graph)
    for k, node in enumerate(graph.nodes):
        if OPS[node.op].collective:
            _run_collective(node, per_rank, groups, domain)
        else:
            for values in per_rank:
                values.append(domain.run(node, tuple(values[v] for v in node.inputs)))
        for v in dead[k]:
            for values in per_rank:
                values[v] = None
    return [{name: values[value] for name, value in graph.outputs} for values in per_rank]
