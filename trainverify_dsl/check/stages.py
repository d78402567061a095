"""Stage cuts: the proof cut where the data flow narrows to one tensor between stages.

Where the plan sends the hidden state between two blocks from one stage to the next (a
``Transfer`` whose value is a block boundary the lowering marked, and a ``Boundary`` of the
reference step at the same point), the proof replaces the value by fresh variables ``X``
on both sides: the reference step reads ``X`` after the boundary and every receiving rank
reads its piece of ``X`` (``take_local`` under the receive's layout). The same for the
cotangent flowing back: the reference reads fresh ``Y`` as the loss's gradient with respect
to the boundary and every sending rank reads ``c`` times its piece of ``Y``, where ``c`` is
the constant ratio between the plan's local cotangent and the reference's (the loss scale
and the data split put it there: 1 for a plain mean over one data block, the number of data
blocks when the plan averages gradients over them), measured at the drawn values and proven
as part of the cut. The obligations of a cut are that each rank's computed value (and
cotangent) equals its piece of the reference's computed value (times ``c``); the final
checks then compare terms in ``X`` and ``Y``, one stage deep instead of the whole step.

Why that is sound (docs/checking.md, "Stage cuts"): write the plan's step after a boundary as
``G(in, X, Y)`` and the reference's as ``R(in, X, Y)``. The cut run proves, for every value
of the inputs and of ``X`` and ``Y``: (1) the plan's boundary value is the local piece of the
reference's, both computed from the inputs (and the earlier cuts' variables); (2) the plan's
cotangent, computed from its pieces of ``X``, is ``c`` times the piece of the reference's,
computed from ``X``; (3) ``G(in, local(X), c local(Y)) = R(in, X, Y)`` for every final
value. Instantiating ``X`` with the reference's boundary value and ``Y`` with its cotangent,
(1) and (2) say the plan computed exactly those pieces, so (3) is the equality of the real
step. A cut whose obligations do not hold proves nothing about the plan: the caller then
proves the step uncut (``check/prove.py``); a cut never yields a counterexample.

A cut is made only where the reference traced its blocks (``spec.trace`` with block reuse)
and the plan sends a boundary value between stages; a boundary whose layout is partial
(a sum still owed), or whose cotangent is not a constant multiple of the reference's at the
drawn values, is not cut (the cotangent alone may stay uncut).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from trainverify_dsl.ir.compare import Comparison
from trainverify_dsl.ir.execute import evaluate_parallel
from trainverify_dsl.ir.layout import MICROBATCH_AXIS, TLayout, take_local
from trainverify_dsl.ir.parallel import ParallelProgram, Transfer
from trainverify_dsl.ir.program import Boundary, evaluate_program
from trainverify_dsl.ir.types import is_float

#: a cotangent ratio is a fraction with a denominator at most this, matching to this
#: relative error at the drawn values (then proven exactly, as an obligation of the cut)
MAX_DENOMINATOR = 1 << 20
RATIO_TOLERANCE = 1e-9
CHECK = "stage cuts"


@dataclass(frozen=True)
class Cut:
    """One boundary the proof cuts at: the reference's names for its value and cotangent,
    the plan's transfers carrying it, their layouts, and the cotangent's ratio ``scale``
    (``None``: the cotangent is not cut)."""

    point: str
    boundary: Boundary
    transfers: tuple[Transfer, ...]
    layout: TLayout
    cotangent_layout: TLayout | None
    scale: Fraction | None


def candidates(program: ParallelProgram, boundaries: tuple[Boundary, ...]
               ) -> list[tuple[Boundary, list[Transfer], TLayout, TLayout | None]]:
    """Boundaries the plan sends between stages, in data order, with their transfers and
    the layouts of the receive and of the sender's cotangent input."""
    by_point = {p: b for b in boundaries for p in b.points}
    found: dict[int, tuple[Boundary, list[Transfer], TLayout, TLayout | None]] = {}
    mixed: set[int] = set()  # received in two layouts: not cut
    order = {id(b): k for k, b in enumerate(boundaries)}
    for t in program.transfers:
        if t.source is None or t.point is None or t.point not in by_point:
            continue
        boundary = by_point[t.point]
        recv = next((s for s in program.stages[t.dest].inputs
                     if s.kind == "recv" and s.spec == t.value), None)
        if recv is None:
            continue
        cot = next((s for s in program.stages[t.source].inputs
                    if s.kind == "cotangent" and s.spec == f"send.{t.sent}"), None)
        if recv.layout.partial is not None:
            continue
        k = order[id(boundary)]
        if k in found:
            if found[k][2] != recv.layout:
                mixed.add(k)
            found[k][1].append(t)
            continue
        cot_layout = cot.layout if cot is not None and cot.layout.partial is None else None
        found[k] = (boundary, [t], recv.layout, cot_layout)
    return [found[k] for k in sorted(found) if k not in mixed]


class _Recorder:
    """Numeric run: records the boundary values and cotangents, replaces nothing."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.ref: dict[str, np.ndarray] = {}
        #: (kind, transfer id, stage, rank, microbatch) -> (transfer, coords, value)
        self.plan: dict[tuple[str, str, int | None, int, int],
                        tuple[Transfer, dict[str, int], Any]] = {}

    def replace(self, name: str, value: Any) -> Any:
        if name in self.names:
            self.ref[name] = np.asarray(value, dtype=float)
        return value

    def forward(self, t: Transfer, rank: int, coords: Mapping[str, int], value: Any) -> Any:
        self.plan[("forward", t.value, t.dest, rank, coords[MICROBATCH_AXIS])] = \
            (t, dict(coords), np.asarray(value, dtype=float))
        return value

    def cotangent(self, t: Transfer, rank: int, coords: Mapping[str, int], value: Any) -> Any:
        self.plan[("cotangent", t.sent, t.source, rank, coords[MICROBATCH_AXIS])] = \
            (t, dict(coords), np.asarray(value, dtype=float))
        return value


def _ratio(pairs: list[tuple[np.ndarray, np.ndarray]]) -> Fraction | None:
    """The one constant ``c`` with ``got == c * want`` for every pair, as a small fraction,
    or ``None``."""
    got = np.concatenate([np.ravel(g) for g, _ in pairs]) if pairs else np.zeros(0)
    want = np.concatenate([np.ravel(w) for _, w in pairs]) if pairs else np.zeros(0)
    norm = float(np.dot(want, want))
    if not got.size or norm == 0.0 or not np.all(np.isfinite(got)) \
            or not np.all(np.isfinite(want)):
        return None
    c = Fraction(float(np.dot(got, want)) / norm).limit_denominator(MAX_DENOMINATOR)
    scale = max(float(np.max(np.abs(got))), float(np.max(np.abs(want))), 1e-300)
    if float(np.max(np.abs(got - float(c) * want))) > RATIO_TOLERANCE * scale or c == 0:
        return None
    return c


def plan_cuts(reference: Any, program: ParallelProgram, boundaries: tuple[Boundary, ...],
              values: Mapping[str, Any]) -> tuple[list[Cut], dict[str, np.ndarray]]:
    """The cuts of the pair at its drawn ``values`` (every input of the step, numeric), and
    the reference's values there by variable name prefix (the witness of the cut variables:
    an ordering of computed values past a cut takes the order it has at the drawn values).
    A boundary whose forward values already differ at the drawn values is not cut."""
    found = candidates(program, boundaries)
    if not found:
        return [], {}
    names = {b.value for b, *_ in found} | {b.cotangent for b, *_ in found}
    recorder = _Recorder(names)
    evaluate_program(reference, values, replace=recorder.replace)
    evaluate_parallel(program, values, boundaries=recorder)
    sizes = program.sizes
    cuts: list[Cut] = []
    witness: dict[str, np.ndarray] = {}
    for boundary, transfers, layout, cot_layout in found:
        value = recorder.ref.get(boundary.value)
        if value is None:
            continue
        ids = {t.value for t in transfers}
        forward = [(v, take_local(value, layout, coords, sizes))
                   for (kind, vid, *_), (_, coords, v) in recorder.plan.items()
                   if kind == "forward" and vid in ids]
        if not forward or _ratio(forward) != 1:
            continue
        scale = None
        cot = recorder.ref.get(boundary.cotangent)
        sent = {t.sent for t in transfers}
        if cot_layout is not None and cot is not None:
            backward = [(v, take_local(cot, cot_layout, coords, sizes))
                        for (kind, sid, *_), (_, coords, v) in recorder.plan.items()
                        if kind == "cotangent" and sid in sent]
            scale = _ratio(backward) if backward else None
            if scale is not None:
                witness[_cot_name(boundary)] = cot
        witness[_value_name(boundary)] = value
        cuts.append(Cut(boundary.points[0], boundary, tuple(transfers), layout,
                        cot_layout if scale is not None else None, scale))
    return cuts, witness


def _value_name(b: Boundary) -> str:
    return f"cut:{b.points[0]}"


def _cot_name(b: Boundary) -> str:
    return f"cut:grad({b.points[0]})"


def numeric_values(inputs: Mapping[str, tuple[tuple[int, ...], str]],
                   known: Mapping[str, np.ndarray], witness: Mapping[str, np.ndarray] | None
                   ) -> dict[str, np.ndarray] | None:
    """Every input of the step at its drawn value, or ``None`` when one is missing."""
    if witness is None:
        return None
    out: dict[str, np.ndarray] = {}
    for name, (_, dtype) in inputs.items():
        source = witness if is_float(dtype) else known
        if name not in source:
            return None
        out[name] = np.asarray(source[name])
    return out


class SymbolicCuts:
    """The cut run's replacements (``evaluate_program``'s ``replace`` and
    ``evaluate_parallel``'s ``boundaries``), and what each side computed at the cuts, for
    the cut's obligations."""

    def __init__(self, cuts: list[Cut], sizes: Mapping[str, int], variables: Any,
                 skip: frozenset[int] = frozenset()) -> None:
        self.cuts, self.sizes, self.variables = cuts, sizes, variables
        #: stages not run (``check/symmetry.py``): the values they would compute at a cut
        #: have no obligation here (their representatives' stand for them)
        self.skip = skip
        #: the cuts the run reached
        self.reached: set[str] = set()
        #: elements of values at cuts that skipped stages computed (not compared), once each
        self.covered = 0
        self.seen: set[tuple[str, str, int, str, int, int]] = set()
        self.by_value = {c.boundary.value: c for c in cuts}
        self.by_cot = {c.boundary.cotangent: c for c in cuts if c.scale is not None}
        self.by_transfer = {(t.dest, t.value): c for c in cuts for t in c.transfers}
        self.fresh: dict[str, np.ndarray] = {}
        self.ref: dict[str, Any] = {}
        #: (kind, point, stage, transfer id, rank, microbatch) -> (coords, the plan's
        #: computed value): one entry for every value replaced, so every replacement has
        #: its obligation (the stage that receives it, or that sent it for a cotangent)
        self.plan: dict[tuple[str, str, int, str, int, int], tuple[dict[str, int], Any]] = {}

    def replace(self, name: str, value: Any) -> Any:
        cut = self.by_value.get(name)
        if cut is not None:
            self.ref[name] = value
            return self._fresh(_value_name(cut.boundary), np.shape(value))
        cut = self.by_cot.get(name)
        if cut is not None:
            self.ref[name] = value
            return self._fresh(_cot_name(cut.boundary), np.shape(value))
        return value

    def _fresh(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.fresh:
            self.fresh[name] = self.variables(name, shape)
        return self.fresh[name]

    def forward(self, t: Transfer, rank: int, coords: Mapping[str, int], value: Any) -> Any:
        cut = self.by_transfer.get((t.dest, t.value))
        fresh = self.fresh.get(_value_name(cut.boundary)) if cut is not None else None
        if cut is None or fresh is None:
            return value
        self.reached.add(cut.point)
        key = ("forward", cut.point, t.dest, t.value, rank, coords[MICROBATCH_AXIS])
        if t.source not in self.skip:
            self.plan.setdefault(key, (dict(coords), value))
        elif key not in self.seen:
            self.seen.add(key)
            self.covered += int(np.size(value))
        return take_local(fresh, cut.layout, coords, self.sizes)

    def cotangent(self, t: Transfer, rank: int, coords: Mapping[str, int], value: Any) -> Any:
        cut = self.by_transfer.get((t.dest, t.value))
        if cut is None or cut.scale is None or cut.cotangent_layout is None:
            return value
        fresh = self.fresh.get(_cot_name(cut.boundary))
        if fresh is None:
            return value
        assert t.source is not None
        self.reached.add(cut.point)
        key = ("cotangent", cut.point, t.source, str(t.sent), rank, coords[MICROBATCH_AXIS])
        if t.dest not in self.skip:
            self.plan.setdefault(key, (dict(coords), value))
        elif key not in self.seen:
            self.seen.add(key)
            self.covered += int(np.size(value))
        return take_local(fresh, cut.cotangent_layout, coords, self.sizes) * cut.scale

    def compare(self, equal: Any) -> int:
        """Each rank's value at each cut against its piece of the reference's, through the
        comparator ``equal(got, want, where)`` (the proof's ``Exact``, which records every
        element that differs in normal form as an obligation); a value computed by a skipped
        stage has none. Returns the count of comparisons; a cut that the run never reached
        is a failure of the cut (``-1``)."""
        count = 0
        for cut in self.cuts:
            if cut.point not in self.reached:
                return -1
            for (kind, point, _, _, rank, m), (coords, value) in sorted(
                    self.plan.items(), key=lambda item: item[0]):
                if point != cut.point:
                    continue
                if kind == "forward":
                    want = take_local(self.ref[cut.boundary.value], cut.layout, coords,
                                      self.sizes)
                    what = f"{cut.point} (value)"
                else:
                    assert cut.cotangent_layout is not None and cut.scale is not None
                    want = take_local(self.ref[cut.boundary.cotangent], cut.cotangent_layout,
                                      coords, self.sizes) * cut.scale
                    what = f"{cut.point} (cotangent x {cut.scale})"
                equal(value, want, Comparison(CHECK, what, rank, None, f"microbatch {m}"))
                count += 1
        return count


class GradientCut:
    """The cut at the gradients: each optimizer update proven on fresh gradient variables.

    The reference's update of parameter ``p`` reads fresh ``G_p`` in place of its computed
    gradient (``replace``, for ``evaluate_program``), and every rank's update reads its piece
    of ``G_p`` under the final gradient layout in place of its own final gradient
    (``gradient``, for ``evaluate_parallel``). The step's reported gradients are the computed
    ones on both sides (``restore``), so the final checks still compare each rank's gradient
    with its piece of the reference's, and compare the updates as identities in ``G_p``.

    Sound by substitution (docs/checking.md, "The cut at the gradients"): the gradient check
    proves ``grad_r(p) = local_r(grad(p))`` on every rank ``r`` holding ``p``, and the update
    check proves ``U_r(p, local_r(G), s) = local_r(R(p, G, s))`` for every ``G``; with
    ``G = grad(p)`` the two give the plan's real update. So a parameter is cut only where
    that gradient check exists and is exactly the value substituted: the plan does not clip
    (the update would read the clipped gradient), no claim on ``grad(p)`` replaces the
    default one, the final layout owes no sum (each rank holds a piece, not a partial), and
    every reference call reading ``grad(p)`` is ``p``'s update. Without the cut, AdamW's
    ``sqrt(v)`` holds the square of the whole gradient term on each side, factored
    differently (the plan sums partial gradients the reference computes whole), which the
    expansion of ``check/expand.py`` cannot multiply out at DeepSeek's sizes."""

    def __init__(self, program: ParallelProgram, reference: Any, variables: Any,
                 skip: frozenset[str] = frozenset()) -> None:
        """``skip``: parameters not cut (a merged block's, ``Symmetry.unread``: bound to
        zeros and not compared, their updates need no variables)."""
        self.variables, self.sizes = variables, program.sizes
        self.final = program.final_grad_layouts()
        claimed = {c.target for c in program.claims}
        readers: dict[str, list[Any]] = {}
        for call in reference.calls:
            for arg in call.args:
                readers.setdefault(arg, []).append(call)
        self.params: set[str] = set()
        if program.clip is None and program.optimizer is not None:
            for u in program.optimizer.updates:
                name = f"grad({u.param})"
                calls = readers.get(name, [])
                if u.param in skip or name in claimed or \
                        self.final[u.param].partial is not None or not calls \
                        or not all(f"new({u.param})" in c.results for c in calls):
                    continue
                self.params.add(u.param)
        self.fresh: dict[str, np.ndarray] = {}
        #: the reference's computed gradients, by tensor name
        self.ref: dict[str, Any] = {}

    def replace(self, name: str, value: Any) -> Any:
        if name.startswith("grad(") and name[5:-1] in self.params:
            self.ref[name] = value
            if name not in self.fresh:
                self.fresh[name] = self.variables(f"gradcut:{name}", np.shape(value))
            return self.fresh[name]
        return value

    def gradient(self, param: str, rank: int, coords: Mapping[str, int], value: Any) -> Any:
        fresh = self.fresh.get(f"grad({param})")
        if fresh is None:
            return value
        return take_local(fresh, self.final[param], coords, self.sizes)

    def restore(self, outputs: dict[str, Any], reference: Any) -> None:
        """The reference's outputs with its computed gradients in place of the fresh ones."""
        for out, tensor in reference.outputs:
            if tensor in self.ref:
                outputs[out] = self.ref[tensor]
