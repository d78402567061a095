"""Bounded work: what a simulation will hold in memory, estimated before anything is allocated,
and mesh axes that cannot change the result (issue 13, item 2).

Plans come from pull requests and search tools, and ``tvp simulate`` runs in CI: a plan with
an idle ``tp=1048576`` axis, or ``--no-shrink`` on an 8B model, must be refused in seconds with
the estimate, not grow until the machine kills it.

- **Idle axes** (``trainverify_dsl/shrink.py``) run at size 1 before anything is estimated.
- **The estimate** of the bytes the interpreter holds, from the lowered program's types
  alone: for each stage, its ranks times the peak of its graph's live values
  (inputs held for the whole call, every other value freed after its last use); the largest
  stage (stages run one at a time); every rank's accumulated gradients and observed values
  across microbatches; the global values (parameters, optimizer states, inputs), the pieces
  of them the stages read (each distinct piece taken once and kept) and the reference step's
  values at the simulated sizes. Rank batching computes values every rank
  holds identically once, which the estimate does not count on. Measured on
  ``llama3_8b_3d`` (128 ranks, shrunk): estimate 2.85 GB, peak RSS 3.16 GB of which about
  0.4 GB is Python, torch and numpy before any value exists
  (``bench/results/simulate.md``). It is an estimate, not a bound.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

from trainverify_dsl.ir.graph import Graph
from trainverify_dsl.ir.parallel import ParallelProgram
from trainverify_dsl.ir.program import Program
from trainverify_dsl.ir.types import TensorType

#: The fraction of the machine's memory a simulation may plan to use by default.
DEFAULT_FRACTION = 0.5


def machine_memory() -> int:
    """Physical memory in bytes (``/proc/meminfo`` or ``sysconf``; 8 GiB if neither)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_budget() -> int:
    return int(machine_memory() * DEFAULT_FRACTION)


def parse_bytes(text: str) -> int:
    """``4G``, ``512M``, ``1.5GiB``, ``1000000`` -> bytes (binary units)."""
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    value = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = value[-1] if value and value[-1] in units else ""
    number = float(value[:-1] if unit else value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"not a positive size: {text!r}")
    return int(number * units[unit])


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError


# -- the estimate ----------------------------------------------------------------------------


def _bytes(t: TensorType) -> int:
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
    live = sum(_bytes(g.type) for g in graph.inputs)
    peak = live
    for i, node in enumerate(graph.nodes):
        live += _bytes(node.type)
        peak = max(peak, live)
        for v in set(node.inputs):
            if v >= n_in and last.get(v) == i:
                live -= _bytes(graph.value_type(v))
        if last.get(n_in + i) is None:  # never used: freed at once
            live -= _bytes(node.type)
    return peak


@dataclass(frozen=True, slots=True)
class Estimate:
    ranks: int
    bytes: int
    #: (what, bytes), largest first
    parts: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        shown = ", ".join(f"{what} {human(n)}" for what, n in self.parts[:3])
        return f"about {human(self.bytes)} for {self.ranks:,} ranks ({shown})"


def reference_bytes(program: Program) -> int:
    """The reference step's evaluation (``ir.program.evaluate_program``): every call result
    is kept in its environment, and one call's graph is live at a time."""
    table = dict(program.graphs)
    kept = sum(_bytes(table[c.graph].value_type(v)) for c in program.calls
               for (_, v) in table[c.graph].outputs)
    return kept + max((peak_live_bytes(g) for g in table.values()), default=0)


def estimate(program: ParallelProgram, global_values: Iterable[TensorType],
             reference: Program) -> Estimate:
    """The estimate of the module docstring, in bytes."""
    sizes = dict(program.mesh)
    world = math.prod(sizes.values())
    stage_ranks = world // sizes.get(program.pipeline_axis, 1) if program.pipeline_axis \
        else world
    stages = max((stage_ranks * peak_live_bytes(s.graph) for s in program.stages), default=0)
    axis_sizes = {**sizes, "@mb": program.microbatches}
    kept = 0
    for s in program.stages:
        for slot in s.outputs:
            shape = slot.layout.local_shape(axis_sizes)
            copies = program.microbatches if slot.kind == "lineage" else 1
            kept += stage_ranks * copies * 8 * max(math.prod(shape), 1)
    values = sum(_bytes(t) for t in global_values)
    # each distinct piece of an input a stage reads is taken once and kept for the step
    # (``ir.execute``): the pieces of one layout partition the value
    layouts = {(slot.spec, slot.layout.dims): math.prod(slot.layout.local_shape(axis_sizes)) *
               math.prod(axis_sizes[a] for a in slot.layout.shard_axes())
               for s in program.stages for slot in s.inputs
               if slot.kind in ("param", "buffer", "data")}
    pieces = 8 * sum(layouts.values())
    reference_step = reference_bytes(reference)
    parts = sorted([("per-rank stage values", stages), ("kept per-rank outputs", kept),
                    ("global values", values), ("input pieces", pieces),
                    ("reference step", reference_step)], key=lambda p: -p[1])
    return Estimate(world, stages + kept + values + pieces + reference_step, tuple(parts))
