"""The pair: the reference step and the plan's parallel program as one value.

As Alive2 pairs a source and a target function, a ``CheckPair`` holds what ``tvp check``
proves equal: the spec's training step as an IR ``Program`` (its outputs ``loss``,
``grad(p)``, ``new(...)`` and the values at marked points ``point:<point>``), the plan's
``ParallelProgram``, the optimizer recipe as the checks need it, and the values of the integer
inputs (token ids, labels, integer buffers), which the proof takes as given, and the float
inputs' drawn values (the witness of an ordering of computed values). Plain data: it
can be printed, hashed into a cache key and sent to a worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainverify_dsl.ir.compare import Recipe
from trainverify_dsl.ir.parallel import ParallelProgram
from trainverify_dsl.ir.program import Boundary, Program

#: the reference step's outputs holding values at marked points start with this
#: (``spec/marks.py``'s ``POINT``; the checker may not import the spec package)
POINT = "point:"


@dataclass(frozen=True)
class CheckPair:
    reference: Program
    program: ParallelProgram
    recipe: Recipe
    #: the step's input values the proof takes as given, by spec name: integer and boolean
    #: tensors (token ids, labels, masks); every float input is a symbol
    known: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: shapes and dtypes of every input of the step by spec name (reference inputs and the
    #: optimizer states only the plan reads)
    inputs: Mapping[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    #: sizes the pair was built at (shrunk widths), for the report
    sizes: Mapping[str, Any] = field(default_factory=dict)
    #: the numeric pre-check's values of the float inputs, by spec name: the witness at which
    #: an ordering of computed values (top-k routing) takes its order (``None``: no
    #: ordering of computed values is decided; such an op is unsupported)
    witness: Mapping[str, np.ndarray] | None = None
    #: the reference step's block boundaries (``ir.program.Boundary``), where the proof
    #: may cut (``check/stages.py``); empty when the reference is one flat graph
    boundaries: tuple[Boundary, ...] = ()

    def witness_env(self) -> dict[str, float] | None:
        """The witness by variable name (``name[i,j]``, as ``symbolic.variables`` names)."""
        if self.witness is None:
            return None
        env: dict[str, float] = {}
        for name, array in self.witness.items():
            values = np.asarray(array, dtype=float)
            for index in np.ndindex(*values.shape):
                env[f"{name}[{','.join(map(str, index))}]"] = float(values[index])
        return env
