"""Verdicts (Alive2's discipline): ``verified``, ``counterexample``, ``inconclusive``, ``error``.

``verified`` only when every obligation of every stage is proven and the checks' coverage
held; a counterexample only when numeric evaluation of both programs confirms it; anything
else is ``inconclusive`` (with the reason: a timeout, the solver's ``unknown``, an op without
an exact encoding, a difference seen only under uninterpreted functions) or ``error``. Every
verdict lists the assumptions it rests on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from trainverify_dsl.report.diagnostics import Severity

VERIFIED = "verified"
COUNTEREXAMPLE = "counterexample"
INCONCLUSIVE = "inconclusive"
ERROR = "error"

#: exit codes of ``tvp check``: a plan with errors is 1 like a counterexample (the plan is
#: wrong); usage and internal errors are 2
EXIT = {VERIFIED: 0, COUNTEREXAMPLE: 1, INCONCLUSIVE: 3, ERROR: 2}

#: What every proof rests on (listed in every verdict that proves anything).
BASE_ASSUMPTIONS = (
    "real arithmetic: both programs are read over the real numbers, not floating point",
    "uninterpreted functions: log, sqrt, sigmoid, tanh, erf, gelu, sin, cos, abs, sign are "
    "the same unknown function on both sides (congruence is their only property); exp too, "
    "with two identities of the real exp: exp(a + b) = exp(a) * exp(b) and exp(log x) = x "
    "(the argument of log positive)",
    "divisors are non-zero (x * x^-1 = 1)",
    "no real number is NaN (`isnan` is false)",
)


@dataclass
class Counterexample:
    """A difference confirmed by evaluating both programs numerically (float64)."""

    check: str
    tensor: str
    rank: int
    rel_error: float
    #: the plan line of the first failing claim or statement
    span: Any
    detail: str = ""
    #: how the values were drawn (``seed``) and the sizes evaluated at
    seed: int = 0
    #: a one-line reading of the difference (``ir/reading.py``)
    reading: str = ""
    #: the element the reading shows, the spec's value there and each shown rank's
    #: ``(coordinates, value)``
    index: tuple[int, ...] = ()
    spec_value: float | None = None
    rank_values: tuple[tuple[str, float], ...] = ()
    #: how the inputs it was found at were drawn (random, or shrunk towards small values)
    inputs: str = "random inputs"


@dataclass
class Verdict:
    verdict: str
    plan: str
    #: why the verdict is not ``verified`` (or what was proven)
    reason: str = ""
    assumptions: list[str] = field(default_factory=list)
    stages_total: int = 0
    stages_unique: int = 0
    stages_proven: int = 0
    #: elements compared; decided equal by the normal form, by multiplying out, by z3
    elements: int = 0
    by_normal_form: int = 0
    by_expansion: int = 0
    by_solver: int = 0
    seconds: float = 0.0
    #: diagnostics (``report.diagnostics.Diagnostic``) of the plan and its layout pass
    diagnostics: list[Any] = field(default_factory=list)
    counterexample: Counterexample | None = None
    #: the sizes proven at (shrunk widths) and the mesh axes run at size 1
    sizes: dict[str, Any] = field(default_factory=dict)
    idle_axes: dict[str, int] = field(default_factory=dict)
    #: the programs ran fewer microbatches than the plan's (``shrink.fewer_microbatches``):
    #: what that rests on ("": the plan's count)
    microbatches: str = ""
    #: data-parallel axes the programs ran at fewer ranks (``shrink.fewer_ranks``): the
    #: plan's size of each, and what that rests on
    reduced_axes: dict[str, int] = field(default_factory=dict)
    ranks: str = ""
    #: the proof was read from the proof cache (``check/cache.py``), not run again
    cached: bool = False
    #: the obligations left unproven (for inconclusive verdicts): ``(where, reason)``
    open: list[tuple[str, str]] = field(default_factory=list)
    #: how the proof went where that is not the verdict (a stage cut that did not hold)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.verdict == ERROR and self.diagnostics:
            return 1  # the plan has errors: it is wrong, as with a counterexample
        return EXIT[self.verdict]


def refused(plan: str, diagnostics: list[Any]) -> Verdict:
    """A plan not checked because of the work it asks for (TVP501: ranks, microbatches or
    memory over the limits): neither proven nor refuted, so ``inconclusive`` (exit 3), never
    "the plan has errors" (the plan may be correct); its diagnostics are warnings here."""
    diagnostics = [replace(d, level=Severity.WARNING) for d in diagnostics]
    return Verdict(INCONCLUSIVE, plan, diagnostics=diagnostics,
                   reason="not checked: " + "; ".join(
                       d.message + (f" (TVP501: {d.help})" if d.help else " (TVP501)")
                       for d in diagnostics))
