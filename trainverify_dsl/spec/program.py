"""The traced training step: a ``Program`` plus what the tracer learned about the model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from trainverify_dsl.ir.graph import Graph, GraphInput
from trainverify_dsl.ir.program import Boundary, Program, evaluate_program, inline


@dataclass(frozen=True, slots=True)
class BlockGroup:
    """Layers of one block list that share one traced graph pair (forward, backward)."""

    graph: str
    layers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SpecProgram:
    """The spec: loss, every parameter gradient (and optimizer outputs when asked for).

    Outputs are named ``loss`` and ``grad(<param path>)``; with an optimizer also
    ``new(<param path>)`` and the new states (``new(m(<path>))``...).
    """

    program: Program
    #: Torch path of the block list whose layers reuse traced graphs ("" when flat).
    block_list: str = ""
    groups: tuple[BlockGroup, ...] = ()
    trace_seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())
    #: the hidden state at each block boundary and its cotangent (empty when flat)
    boundaries: tuple[Boundary, ...] = ()

    @property
    def params(self) -> tuple[GraphInput, ...]:
        return tuple(g for g in self.program.inputs if g.kind == "param")

    @property
    def param_count(self) -> int:
        return sum(g.type.numel for g in self.params)

    def flat(self) -> Graph:
        return inline(self.program)

    def evaluate(self, inputs: Mapping[str, object]) -> dict[str, np.ndarray]:
        return evaluate_program(self.program, inputs)
