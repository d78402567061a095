"""Numeric simulation: the plan's parallel program and the reference step on the same values.

Two IR programs are evaluated on the same random parameters, optimizer states and inputs:

- the **reference**: the spec's traced single-device training step with the spec's own
  optimizer (``SpecProgram``, ``ir.program.evaluate_program``);
- the **plan**: its ``ParallelProgram`` (``ir.execute.evaluate_parallel``).

Then an ordered list of named checks runs (``CHECKS``): the copies of the loss, the logical
loss (docs/semantics.md §4.6), gradient coverage, every gradient copy in its final layout, the
plan's layout claims (§2.4), the optimizer's hyper-parameters against the spec's, every updated
parameter and optimizer state, and the derived lineages at marked points. The reference values
at marked points are outputs of the reference IR too (``point:<point>``: the spec is traced
with the points ``reference_points`` lists marked, ``spec/marks.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainverify_dsl.ir.execute import ParallelOutcome, evaluate_parallel
from trainverify_dsl.ir.layout import MICROBATCH_AXIS, TLayout, take_local
from trainverify_dsl.ir.mesh import MeshGroups
from trainverify_dsl.ir.ops import OPS
from trainverify_dsl.ir.parallel import ParallelProgram
from trainverify_dsl.report.span import Span
from trainverify_dsl.spec import optim
from trainverify_dsl.spec.marks import POINT, point_values

#: Relative error below which two float64 results agree (round-off of the same real numbers).
TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class Mismatch:
    tensor: str
    rank: int
    rel_error: float
    span: Span | None
    detail: str = ""
    #: the named check that found it (``CHECKS``)
    check: str = ""


@dataclass
class SimulationResult:
    plan: str
    ranks: int
    max_rel_error: float
    compared: int
    mismatches: list[Mismatch] = field(default_factory=list)
    sizes: dict[str, Any] = field(default_factory=dict)
    #: layout-pass findings of the lowering (Diagnostics)
    findings: list[Any] = field(default_factory=list)
    #: marked points whose values differ from their derived lineage, in program order
    lineage_mismatches: list[Mismatch] = field(default_factory=list)
    #: mesh axes no statement uses, simulated at size 1: ``{axis: its size in the plan}``
    idle_axes: dict[str, int] = field(default_factory=dict)
    #: the memory estimate the budget was checked against (``simulate.budget``)
    estimated_bytes: int = 0

    @property
    def agrees(self) -> bool:
        """The final outputs agree (loss, gradients, updates). A derived lineage that differs
        while they agree is not a disagreement (docs/semantics.md §8)."""
        return not self.mismatches and self.max_rel_error < TOLERANCE

    @property
    def first(self) -> Mismatch | None:
        """The first tensor in program order that differs: an intermediate value at a marked
        point if one does, else the first final output."""
        if not self.mismatches:
            return None
        return (self.lineage_mismatches or self.mismatches)[0]


#: A tensor is compared relative to its own largest entry, but never relative to less than
#: this fraction of the largest entry of all expected values: a gradient that is zero in real
#: arithmetic (GPT-2's key bias: softmax ignores a constant added to every score) is
#: round-off on both sides, and its relative error would be noise.
FLOOR = 1e-6


def rel_error(got: np.ndarray, want: np.ndarray, floor: float = 1e-12) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return math.inf
    if got.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(want))), floor)
    diff = float(np.max(np.abs(got - want)))
    return diff / scale if np.isfinite(diff) else math.inf


# -- random values --------------------------------------------------------------------------


def random_inputs(spec_inputs: Any, model: torch.nn.Module, rng: np.random.Generator
                  ) -> dict[str, np.ndarray]:
    """Parameters ~ N(0, 0.5²), states positive where they must be (Adam's v), token ids in
    range (the vocabulary is the first dimension of the embedding table), real inputs N(0,1),
    buffers as the model built them."""
    buffers = {n: b.detach().cpu().double().numpy() if b.is_floating_point() else
               b.detach().cpu().numpy() for n, b in model.named_buffers()}
    vocab = _vocab(model)
    values: dict[str, np.ndarray] = {}
    for g in spec_inputs:
        shape = g.type.shape
        if g.kind == "buffer":
            values[g.name] = buffers[g.name]
        elif g.type.dtype.startswith("i"):
            values[g.name] = rng.integers(0, vocab or 2, size=shape)
        elif g.kind == "state" and g.name.startswith("v("):
            values[g.name] = rng.uniform(0.1, 1.0, size=shape)
        else:
            values[g.name] = rng.normal(0.0, 0.5, size=shape)
    return values


def _vocab(model: torch.nn.Module) -> int | None:
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            return module.num_embeddings
    return None




def reference_points(program: ParallelProgram) -> list[str]:
    """The marked points whose reference values the checks read: every lineage's point and
    every claim on a computed tensor (not ``loss``, not ``grad(...)``). Trace the spec with
    them (``trace_training_step(..., points=...)``)."""
    points = {lin.point for lin in program.lineages}
    points |= {claim.target for claim in program.claims}
    return sorted(p for p in points if p != "loss" and not p.startswith("grad("))


# -- the checks ------------------------------------------------------------------------------


@dataclass
class _Pair:
    """The reference step and the plan's program, evaluated on the same values."""

    program: ParallelProgram
    want: dict[str, np.ndarray]
    got: ParallelOutcome
    values: Mapping[str, np.ndarray]
    reference_opt: optim.Optimizer | None
    #: the reference's values at marked points (its ``point:`` outputs), for lineages and
    #: point claims
    points: Mapping[str, np.ndarray] = field(init=False)
    mesh: MeshGroups = field(init=False)
    floor: float = field(init=False)
    compared: int = 0
    worst: float = 0.0
    mismatches: list[Mismatch] = field(default_factory=list)
    lineage_mismatches: list[Mismatch] = field(default_factory=list)
    _observed: dict[str, dict[tuple[int, int], np.ndarray]] | None = None

    def __post_init__(self) -> None:
        self.mesh = MeshGroups(self.program.mesh)
        self.points = point_values(self.want)
        magnitude = max((float(np.max(np.abs(v))) for k, v in self.want.items()
                         if not k.startswith(POINT)
                         if np.size(v) and np.all(np.isfinite(v))), default=1.0)
        self.floor = FLOOR * magnitude

    def observed_at(self, point: str) -> dict[tuple[int, int], np.ndarray]:
        """The plan's local values at ``point``, by ``(rank, microbatch)``."""
        if self._observed is None:
            self._observed = {}
            for (p, r, m), v in self.got.observed.items():
                self._observed.setdefault(p, {})[(r, m)] = v
        return self._observed.get(point, {})

    def coords(self, rank: int, m: int = 0) -> dict[str, int]:
        coords = self.mesh.coords(rank)
        coords[MICROBATCH_AXIS] = m
        return coords

    def compare(self, check: str, tensor: str, rank: int, got: Any, want: Any,
                span: Span | None, detail: str = "") -> bool:
        self.compared += 1
        err = rel_error(got, want, self.floor)
        self.worst = max(self.worst, err)
        if err < TOLERANCE:
            return True
        self.mismatches.append(Mismatch(tensor, rank, err, span, detail, check))
        return False

    def fail(self, check: str, tensor: str, span: Span | None, detail: str) -> None:
        self.mismatches.append(Mismatch(tensor, -1, math.inf, span, detail, check))

    def reconstruct(self, pieces: Mapping[tuple[int, int], np.ndarray], layout: TLayout,
                    rank: int, m: int) -> np.ndarray | None:
        """The rank's value under ``layout``: its piece, combined over its partial group."""
        if not layout.partial:
            return pieces.get((rank, m))
        op, axes = layout.partial
        axes = tuple(a for a in axes if a in self.mesh.sizes)
        group = self.mesh.group(rank, axes) if axes else [rank]
        members = [pieces.get((r, m)) for r in group]
        if any(x is None for x in members) or op not in ("sum", "avg", "max", "min"):
            return None
        return OPS["all_reduce"].evaluate([(x,) for x in members],
                                          {"axis": ",".join(axes), "op": op,
                                           "group_size": len(group)})[0]


def _check_loss_copies(pair: _Pair) -> None:
    data_axes = pair.program.loss.data_axes
    span = pair.program.loss.origin.span
    first: dict[tuple, float] = {}
    for (rank, m), value in sorted(pair.got.losses.items()):
        coords = pair.mesh.coords(rank)
        key = tuple(coords[a] for a in data_axes) + (m,)
        if key in first:
            pair.compare("loss copies", "loss (copy)", rank, np.array(value),
                         np.array(first[key]), span)
        else:
            first[key] = value


def _check_loss(pair: _Pair) -> None:
    data_axes = pair.program.loss.data_axes
    blocks: dict[tuple, float] = {}
    for (rank, m), value in sorted(pair.got.losses.items()):
        coords = pair.mesh.coords(rank)
        blocks.setdefault(tuple(coords[a] for a in data_axes) + (m,), value)
    plan_loss = float(np.mean(list(blocks.values()))) if blocks else math.nan
    pair.compare("loss", "loss", -1, np.array(plan_loss), pair.want["loss"],
                 pair.program.loss.origin.span)


def _grad_spans(program: ParallelProgram) -> dict[str, Span | None]:
    """Where a gradient's difference is reported: its last gradient statement, else the
    statement that distributes the parameter."""
    spans: dict[str, Span | None] = {p: s.span for p, s in program.param_sources}
    for sync in program.grad_syncs:
        for param in sync.params:
            spans[param] = sync.origin.span
    return spans


def _check_coverage(pair: _Pair) -> None:
    holders = {p for acc in pair.got.grads.values() for p in acc}
    for name in pair.want:
        if name.startswith("grad(") and name[5:-1] not in holders:
            pair.fail("gradient coverage", name, None, "no rank computes this gradient")


def _check_gradients(pair: _Pair) -> None:
    final = pair.program.final_grad_layouts()
    claimed = {c.target for c in pair.program.claims}
    spans = _grad_spans(pair.program)
    for rank, acc in sorted(pair.got.grads.items()):
        for param, value in acc.items():
            if f"grad({param})" in claimed:
                continue  # a claim on grad(P) replaces the default claim (§2.4)
            want = take_local(pair.want[f"grad({param})"], final[param], pair.coords(rank),
                              pair.program.sizes)
            pair.compare("gradients", f"grad({param})", rank, value, want, spans.get(param))


def _check_claims(pair: _Pair) -> None:
    sizes = pair.program.sizes
    for claim in pair.program.claims:
        span = claim.origin.span
        if claim.target.startswith("grad("):
            pieces = {(r, 0): acc[claim.target[5:-1]] for r, acc in pair.got.grads.items()
                      if claim.target[5:-1] in acc}
            want_global, micro = pair.want.get(claim.target), (0,)
        elif claim.target == "loss":
            pieces = _mean_losses(pair)
            want_global, micro = pair.want["loss"], (0,)
        else:
            pieces = pair.observed_at(claim.target)
            want_global = pair.points.get(claim.target)
            micro = tuple(range(pair.program.microbatches))
        if want_global is None:
            pair.fail("claims", claim.target, span, "the claim's value is not observable "
                      "(the reference step has no value at this point)")
            continue
        _check_claim_pieces(pair, claim, pieces, want_global, micro, sizes)


def _mean_losses(pair: _Pair) -> dict[tuple[int, int], np.ndarray]:
    """Each rank's loss averaged over its microbatches (microbatches are always averaged)."""
    by_rank: dict[int, list[float]] = {}
    for (rank, _), value in pair.got.losses.items():
        by_rank.setdefault(rank, []).append(value)
    return {(r, 0): np.array(np.mean(v)) for r, v in by_rank.items()}


def _check_claim_pieces(pair: _Pair, claim: Any, pieces: Mapping, want_global: np.ndarray,
                        micro: tuple[int, ...], sizes: Mapping[str, int]) -> None:
    for rank, m in sorted({(r, m) for r, m in pieces if m in micro}):
        got = pair.reconstruct(pieces, claim.layout, rank, m)
        want = take_local(np.asarray(want_global), claim.layout, pair.coords(rank, m), sizes)
        if got is None:
            pair.fail("claims", claim.target, claim.origin.span,
                      f"claimed {claim.layout.describe()}: a partial group is incomplete")
            return
        if not pair.compare("claims", claim.target, rank, got, want, claim.origin.span,
                            f"claimed {claim.layout.describe()}"):
            return


def _check_recipe(pair: _Pair) -> None:
    opt = pair.program.optimizer
    ref = pair.reference_opt
    if opt is None and ref is None:
        return
    if opt is None:
        pair.fail("optimizer recipe", "optimizer", None, "the spec's step updates the "
                  "parameters, but the plan has no `optimizer` statement")
        return
    span = opt.origin.span
    if ref is None:
        pair.fail("optimizer recipe", "optimizer", span, "the plan states no `spec-optimizer`, "
                  "so its update cannot be checked: state the reference step's recipe "
                  "(`spec-optimizer adamw lr=3e-4 ...`)")
        return
    mine = optim.optimizer_config(opt.kind, dict(opt.hyper))
    if mine != ref:
        pair.fail("optimizer recipe", "optimizer", span,
                  f"the plan's optimizer {_describe_opt(mine)} differs from the spec's "
                  f"{_describe_opt(ref)}")


def _describe_opt(opt: optim.Optimizer) -> str:
    import dataclasses

    fields = [f"{f.name}={getattr(opt, f.name)}" for f in dataclasses.fields(opt)
              if f.name != "step"]
    return f"{type(opt).__name__}({', '.join(fields)})"


def _check_updates(pair: _Pair) -> None:
    opt = pair.program.optimizer
    if opt is None or pair.reference_opt is None:
        return
    span, sizes = opt.origin.span, pair.program.sizes
    for u in opt.updates:
        outputs = [(f"new({u.param})", u.layout)]
        outputs += [(f"new({s}({u.param}))", u.block) for s in u.states]
        for name, layout in outputs:
            if name not in pair.want:
                pair.fail("updates", name, span, "the spec's optimizer has no such state")
                continue
            for rank, mine in sorted(pair.got.updates.items()):
                if name in mine:
                    want = take_local(pair.want[name], layout, pair.coords(rank), sizes)
                    pair.compare("updates", name, rank, mine[name], want, span)
    for name in pair.want:
        if name.startswith("new(") and not any(name in m for m in pair.got.updates.values()):
            pair.fail("updates", name, span, "no rank computes this update")


def _check_lineages(pair: _Pair) -> None:
    sizes = pair.program.sizes
    for lineage in pair.program.lineages:
        want_global = pair.points.get(lineage.point)
        lay = lineage.layout
        if want_global is None or (lay.partial and MICROBATCH_AXIS in lay.partial[1]):
            continue  # a mean over microbatches is no local piece to compare
        pieces = pair.observed_at(lineage.point)
        for rank, m in sorted(pieces):
            got = pair.reconstruct(pieces, lay, rank, m)
            if got is None:
                continue
            want = take_local(want_global, lay, pair.coords(rank, m), sizes)
            err = rel_error(got, want, pair.floor)
            if not err < TOLERANCE:
                pair.lineage_mismatches.append(Mismatch(
                    lineage.point, rank, err, lineage.origin.span,
                    f"local piece vs lineage {lay.describe()}, microbatch {m}", "lineages"))
                break


#: The named checks, in order (Alive2's discipline: each has a stable name; all run).
CHECKS: tuple[tuple[str, Callable[[_Pair], None]], ...] = (
    ("loss copies", _check_loss_copies),
    ("loss", _check_loss),
    ("gradient coverage", _check_coverage),
    ("gradients", _check_gradients),
    ("claims", _check_claims),
    ("optimizer recipe", _check_recipe),
    ("updates", _check_updates),
    ("lineages", _check_lineages),
)


def compare_programs(program: ParallelProgram, want: dict[str, np.ndarray],
                     values: Mapping[str, np.ndarray], reference_opt: optim.Optimizer | None
                     ) -> SimulationResult:
    """Evaluate the parallel program on ``values`` and run ``CHECKS`` against the reference
    step's outputs ``want`` on the same values (its ``point:`` outputs are the values at
    marked points)."""
    got = evaluate_parallel(program, values)
    pair = _Pair(program, want, got, values, reference_opt)
    for _, check in CHECKS:
        check(pair)
    result = SimulationResult(program.name, pair.mesh.world_size, pair.worst, pair.compared,
                              pair.mismatches)
    result.lineage_mismatches = pair.lineage_mismatches
    return result


def plan_states(program: ParallelProgram, values: dict[str, np.ndarray],
                rng: np.random.Generator) -> None:
    """Random optimizer states the plan's optimizer reads and the reference has none of (its
    recipe differs: the recipe check reports it; the update still runs)."""
    if program.optimizer is None:
        return
    for u in program.optimizer.updates:
        for s in u.states:
            name = f"{s}({u.param})"
            if name not in values:
                shape = values[u.param].shape
                values[name] = rng.uniform(0.1, 1.0, size=shape) if s == "v" else \
                    rng.normal(0.0, 0.5, size=shape)
