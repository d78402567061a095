"""The proof of a pair: both programs run on symbols, the checks compare exact values.

Every float input of the step (parameters, optimizer states, float data, float buffers) is a
tensor of fresh variables; integer and boolean inputs take the pair's known values. The
reference step runs through ``ir.program.evaluate_program`` and the plan's parallel program
through ``ir.execute.evaluate_parallel``, both in the ``SymbolicDomain``: the same code that
gives them their numeric meaning. Then the named checks of ``ir/compare.py`` run with the
``Exact`` comparator: two elements are equal when their normal forms are the same term;
every other pair of elements is an *obligation*, decided by multiplying both sides out
(``check/expand.py``) or else by z3 (``check/solver.py``). The proof holds when the checks
found nothing structural (coverage, missing updates, recipe) and every obligation is proven.

Where the plan sends the hidden state between blocks from one stage to another, the run is
cut there (``check/stages.py``): both sides read fresh variables after the boundary, and
the cut's own obligations say each side computed the same boundary value and cotangent.
Blocks whose stages have one canonical form are run and compared once
(``check/symmetry.py``). If that proof does not hold, the step is proven again as one stage.

The first proof runs in the lean normal form (``terms.DISTRIBUTE_LEAN``: only two-term sums
distribute), the small one at tensor-parallel widths, and stops at its first open
obligation; then the whole proof is made again in the wide one (``DISTRIBUTE_WIDE``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainverify_dsl.check import symmetry
from trainverify_dsl.check import terms as t
from trainverify_dsl.check.pair import POINT, CheckPair
from trainverify_dsl.check.solver import prove_equal
from trainverify_dsl.check.symbolic import SymbolicDomain, Unsupported, variables
from trainverify_dsl.ir.compare import Comparison, Pair, run_checks
from trainverify_dsl.ir.execute import evaluate_parallel
from trainverify_dsl.ir.program import evaluate_program
from trainverify_dsl.ir.types import is_float


@dataclass
class Obligation:
    where: Comparison
    index: tuple[int, ...]
    got: Any
    want: Any

    def describe(self) -> str:
        w = self.where
        rank = f" on rank {w.rank}" if w.rank >= 0 else ""
        index = f"[{','.join(map(str, self.index))}]" if self.index else ""
        return f"{w.check}: {w.tensor}{index}{rank}"


class Exact:
    """The checks' comparator over exact values (``ir.compare.Comparator``): equal normal
    forms are equal; any other pair of elements becomes an obligation. It answers "equal"
    for those too, so every check runs to the end and records every obligation; the
    verdict is decided by proving them."""

    def __init__(self, covers: Callable[[Comparison], bool] = lambda where: False) -> None:
        self.obligations: list[Obligation] = []
        self.elements = 0
        self.lineage_differences = 0
        #: tensors whose comparisons other blocks' proofs stand for (``check/symmetry.py``)
        self.covers = covers
        self.covered = 0

    def equal(self, got: Any, want: Any, where: Comparison) -> tuple[bool, float]:
        if self.covers(where):
            if where.check != "lineages":
                self.covered += int(np.size(got))
            return True, 0.0
        g = _objects(got)
        w = _objects(want)
        differs = []
        for index in np.ndindex(*g.shape):
            a, b = g[index], w[index]
            if a is not b:
                differs.append((index, a, b))
        if where.check == "lineages":  # a derived lineage never decides the verdict
            self.lineage_differences += bool(differs)
            return not differs, 0.0
        self.elements += g.size
        for index, a, b in differs:
            self.obligations.append(Obligation(where, index, a, b))
        return True, 0.0


def _objects(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray) and x.dtype == object:
        return x
    if isinstance(x, np.ndarray):
        from trainverify_dsl.check.symbolic import floats

        return floats(x)
    out = np.empty((), dtype=object)
    out[()] = x if isinstance(x, (t.Poly, t.Inf)) else t.Poly.constant(x)
    return out


@dataclass
class Proof:
    """What the symbolic run proved."""

    #: ``proven``, ``failed`` (structural findings of the checks), ``open`` (obligations not
    #: proven) or ``unsupported`` (an op without an exact meaning here)
    status: str
    reason: str = ""
    elements: int = 0
    by_normal_form: int = 0
    #: proven by multiplying out (``check/expand.py``)
    by_expansion: int = 0
    by_solver: int = 0
    #: obligations not proven: (where, why)
    open: list[tuple[str, str]] = field(default_factory=list)
    #: obligations left untried once the verdict could no longer be ``verified``
    not_attempted: int = 0
    #: obligations the solver refuted (under uninterpreted functions), for confirmation
    refuted: list[tuple[Obligation, Any]] = field(default_factory=list)
    structural: list[Any] = field(default_factory=list)
    seconds_symbolic: float = 0.0
    seconds_solver: float = 0.0
    term_count: int = 0
    #: orderings of computed values (top-k routing, sorts) taken at the witness
    assumed_orders: int = 0
    #: the stages the step was proven in (``check/stages.py``): cut boundaries + 1
    stages: int = 1
    #: why a proof cut at stage boundaries was not used, or why the step was not proven
    #: again uncut ("": neither applies)
    uncut: str = ""
    #: why the step was proven again in the wide normal form (``terms.DISTRIBUTE_WIDE``)
    widened: str = ""
    #: obligations of the cuts themselves (``check/stages.py``) left open or not attempted
    cuts_unproven: int = 0
    #: stages not run, proven by a representative of the same canonical form
    #: (``check/symmetry.py``), and what merged them
    merged: int = 0
    symmetry: str = ""
    #: elements compared in the representatives' place
    by_symmetry: int = 0
    #: a merged block orders computed values: it is proven under its representative's
    #: drawn routing (``Symmetry.ordered``)
    merged_orders: bool = False


def symbolic_inputs(pair: CheckPair, zeros: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Every input of the step by spec name: float ones as fresh variables, the rest as
    known values; ``zeros``: float inputs nothing compared reads (``check/symmetry.py``)."""
    values: dict[str, Any] = {}
    for name, (shape, dtype) in pair.inputs.items():
        if name in zeros:
            values[name] = np.zeros(shape)
        elif is_float(dtype):
            values[name] = variables(name, shape)
        elif name in pair.known:
            values[name] = pair.known[name]
        else:
            raise Unsupported(f"the integer input {name!r} has no known value")
    return values


#: After this many open obligations the verdict is inconclusive whatever the rest give; the
#: rest are counted, not attempted.
MAX_OPEN = 10


def prove(pair: CheckPair, timeout_s: float = 60.0,
          progress: Callable[[str], None] = lambda phase: None,
          deadline: float | None = None, symmetric: bool = True) -> Proof:
    """Prove the pair's two programs equal by every check of ``ir/compare.py``. Past
    ``deadline`` (``time.perf_counter()``) the proof stops: ``unsupported`` with the reason
    if it is still running the programs, ``open`` if obligations remain. ``symmetric``:
    identical blocks are proven once (``check/symmetry.py``)."""
    t.set_deadline(deadline)
    try:
        t.set_distribute(t.DISTRIBUTE_LEAN)
        proof = _prove(pair, timeout_s, progress, deadline, symmetric, lean=True)
        if proof.status != "open" or proof.refuted:
            return proof
        # a lean normal form leaves more pairs to the expansion, and some beyond its budget:
        # prove the step again with the wide one (each proof stands on its own; neither
        # decides anything the other did not)
        lean = proof.reason
        del proof  # its obligations hold terms of the lean run
        t.set_distribute(t.DISTRIBUTE_WIDE)
        progress("an obligation left open: proving again with the wide normal form")
        proof = _prove(pair, timeout_s, progress, deadline, symmetric)
        proof.widened = f"the proof with two-term sums distributed left an obligation open " \
                        f"({lean}); the step was proven again with sums of up to " \
                        f"{t.DISTRIBUTE_WIDE - 1} terms distributed"
        return proof
    except t.OutOfTime:
        return Proof("unsupported", "the time limit was reached before both programs ran on "
                                    "symbols and were compared")
    finally:
        t.set_deadline(None)
        t.set_distribute(t.DISTRIBUTE_WIDE)  # and frees the proof's terms


def _prove(pair: CheckPair, timeout_s: float, progress: Callable[[str], None],
           deadline: float | None, symmetric: bool = True, lean: bool = False) -> Proof:
    """The proof cut at the pair's stage boundaries when it has some and that proof holds;
    else the whole step as one stage (a cut that does not hold proves nothing either way:
    ``check/stages.py``), unless the cut run could not run at all (an op without an exact
    meaning, too many terms), which the uncut run could not either. ``lean``: a first try
    in the lean normal form, which stops at its first open obligation and is never proven
    again uncut (``prove`` widens the normal form instead)."""
    max_open = 1 if lean else MAX_OPEN
    cut = _prove_cut(pair, timeout_s, progress, deadline, symmetric, max_open)
    if lean:
        return cut if cut is not None else _prove_stage(pair, timeout_s, progress, deadline,
                                                        None, max_open=max_open)
    # an op without an encoding, or a step too large on symbols, is as much so uncut
    if cut is not None and cut.status in ("proven", "unsupported"):
        return cut
    if cut is not None and cut.status == "open" and not cut.refuted and \
            not cut.cuts_unproven:
        # every cut holds and nothing was refuted: the open obligations are final checks
        # over the cut variables, which uncut are the same checks with each variable
        # replaced by the whole computation before it, larger still
        cut.uncut = "the step was not proven again as one stage: every cut's own " \
                    "obligations hold and none of the open ones was refuted (uncut they " \
                    "would be larger)"
        return cut
    note = "" if cut is None else f"the proof cut at {cut.stages - 1} stage boundaries did " \
        f"not hold ({cut.reason}); the step was proven as one stage"
    del cut  # its obligations hold terms of the cut run: free them before the uncut run
    proof = _prove_stage(pair, timeout_s, progress, deadline, None)
    proof.uncut = note
    return proof


def _prove_cut(pair: CheckPair, timeout_s: float, progress: Callable[[str], None],
               deadline: float | None, symmetric: bool = True,
               max_open: int = MAX_OPEN) -> Proof | None:
    from trainverify_dsl.check.stages import numeric_values, plan_cuts

    if not pair.boundaries:
        return None
    drawn = numeric_values(pair.inputs, pair.known, pair.witness)
    if drawn is None:
        return None
    progress("finding the stage boundaries to cut at")
    try:
        cuts, witness = plan_cuts(pair.reference, pair.program, pair.boundaries, drawn)
    except (ValueError, KeyError, IndexError, ArithmeticError):
        return None  # the boundaries could not be measured: the step is proven uncut
    if not cuts:
        return None
    classes = symmetry.find(pair, cuts) if symmetric else None
    if classes is not None:
        merged = len(classes.skipped_stages)
        progress(f"{len(cuts) + 1 - merged} of {len(cuts) + 1} stages distinct, {merged} "
                 f"proven by symmetry")
    proof = _prove_stage(pair, timeout_s, progress, deadline, (cuts, witness), classes,
                         max_open)
    proof.stages = len(cuts) + 1
    if classes is not None:
        proof.merged, proof.symmetry = len(classes.skipped_stages), classes.describe()
        proof.merged_orders = classes.ordered
    return proof


def _prove_stage(pair: CheckPair, timeout_s: float, progress: Callable[[str], None],
                 deadline: float | None, cut: tuple[list[Any], dict[str, Any]] | None,
                 classes: symmetry.Symmetry | None = None, max_open: int = MAX_OPEN) -> Proof:
    from trainverify_dsl.check.stages import GradientCut, SymbolicCuts

    t.reset()
    start = time.perf_counter()
    env = pair.witness_env()
    hooks = None
    skip_stages = classes.skipped_stages if classes is not None else frozenset()
    skip_calls = classes.skipped_calls if classes is not None else frozenset()
    if cut is not None:
        cuts, witness = cut
        hooks = SymbolicCuts(cuts, pair.program.sizes, variables, skip_stages)
        if env is not None:
            for name, array in witness.items():
                for index in np.ndindex(*array.shape):
                    env[f"{name}[{','.join(map(str, index))}]"] = float(array[index])
    domain = SymbolicDomain(env)
    try:
        unread = classes.unread if classes is not None else frozenset()
        values = symbolic_inputs(pair, unread)
        grads = GradientCut(pair.program, pair.reference, variables, unread)

        def replace(name: str, value: Any) -> Any:
            return grads.replace(name, value if hooks is None else hooks.replace(name, value))
        progress("running the reference step on symbols")
        outputs = evaluate_program(pair.reference, values, domain, replace=replace,
                                   skip=skip_calls)
        grads.restore(outputs, pair.reference)
        progress("running the parallel program on symbols")
        got = evaluate_parallel(pair.program, values, domain=domain, boundaries=hooks,
                                skip=skip_stages, gradients=grads.gradient)
    except (Unsupported, t.TooManyTerms) as error:
        t.reset()  # free the terms now
        return Proof("unsupported", str(error), seconds_symbolic=time.perf_counter() - start)
    want = {k: v for k, v in outputs.items() if not k.startswith(POINT)}
    points = {k[len(POINT):]: v for k, v in outputs.items() if k.startswith(POINT)}
    exact = Exact(classes.covers) if classes is not None else Exact()
    progress("comparing normal forms")
    try:
        # the cuts' own obligations first: they are decided before the final checks'
        if hooks is not None and hooks.compare(exact.equal) < 0:
            t.reset()
            return Proof("failed", "a stage cut was never reached by the parallel program",
                         seconds_symbolic=time.perf_counter() - start)
        checked = run_checks(Pair(pair.program, want, points, got, pair.recipe, exact, domain))
    except t.TooManyTerms as error:
        t.reset()
        return Proof("unsupported", str(error), seconds_symbolic=time.perf_counter() - start)
    proof = Proof("proven", elements=exact.elements,
                  seconds_symbolic=time.perf_counter() - start, term_count=len(t._TABLE),
                  assumed_orders=domain.assumed_orders,
                  by_symmetry=exact.covered + (hooks.covered if hooks is not None else 0))
    proof.by_normal_form = exact.elements - len(exact.obligations)
    if checked.mismatches:
        proof.status, proof.structural = "failed", list(checked.mismatches)
        proof.reason = "; ".join(f"{m.check}: {m.tensor}: {m.detail}"
                                 for m in checked.mismatches[:3])
        return proof
    _solve(exact.obligations, proof, timeout_s, progress, deadline, max_open)
    return proof


#: An obligation whose two sides together have more distinct sub-terms than this is not handed
#: to z3 (which times out on them): it stays open.
SOLVER_MAX_TERMS = 400


def _solve(obligations: list[Obligation], proof: Proof, timeout_s: float,
           progress: Callable[[str], None], deadline: float | None = None,
           max_open: int = MAX_OPEN) -> None:
    from trainverify_dsl.check.expand import Expander
    from trainverify_dsl.check.stages import CHECK

    start = time.perf_counter()
    decided: dict[tuple[int, int], Any] = {}
    expander = Expander()
    rest = 0  # the first obligation not attempted
    for k, ob in enumerate(obligations):
        rest = k + 1
        if len(proof.open) >= max_open:
            proof.not_attempted, rest = len(obligations) - k, k
            break
        if k % 50 == 0:
            progress(f"deciding {len(obligations) - k:,} obligations")
        key = (id(ob.got), id(ob.want))
        try:
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left <= 0:
                raise t.OutOfTime
            outcome = decided.get(key)
            if outcome is None:
                outcome = decided[key] = _decide(
                    ob, expander, timeout_s if left is None else min(timeout_s, left))
        except t.OutOfTime:
            proof.not_attempted = len(obligations) - k
            proof.open.append((ob.describe(), "the time limit was reached"))
            proof.cuts_unproven += _is_cut(ob, CHECK)
            break
        if outcome.status == "expanded":
            proof.by_expansion += 1
        elif outcome.status == "proven":
            proof.by_solver += 1
        else:
            if outcome.status == "refuted":
                proof.refuted.append((ob, outcome))
            proof.open.append((ob.describe(), outcome.reason))
            proof.cuts_unproven += _is_cut(ob, CHECK)
    proof.cuts_unproven += sum(_is_cut(ob, CHECK) for ob in obligations[rest:])
    proof.seconds_solver = time.perf_counter() - start
    if proof.open:
        proof.status = "open"
        rest = f"; {proof.not_attempted:,} more not attempted" if proof.not_attempted else ""
        proof.reason = f"{len(proof.open)} of {len(obligations):,} obligations the normal " \
                       f"form could not decide are not proven{rest} (first: " \
                       f"{proof.open[0][0]}: {proof.open[0][1]})"


def _is_cut(ob: Obligation, check: str) -> bool:
    """Whether an obligation is a stage cut's own (``check/stages.py``)."""
    return getattr(ob.where, "check", None) == check


def _decide(ob: Obligation, expander: Any, timeout_s: float) -> Any:
    from trainverify_dsl.check.solver import Outcome

    try:
        if expander.equal(ob.got, ob.want):
            return Outcome("expanded")
    except t.TooManyTerms as error:  # the table is full: the obligation stays open
        return Outcome("unknown", f"{error} while multiplying out")
    size = t.size(ob.got) + t.size(ob.want)
    if size > SOLVER_MAX_TERMS:
        return Outcome("unknown", f"the two sides differ in normal form and are too large "
                                  f"for the solver ({size:,} sub-terms)")
    try:
        return prove_equal(ob.got, ob.want, timeout_s)
    except ValueError as error:  # an infinity that cannot be encoded
        return Outcome("unknown", str(error))
