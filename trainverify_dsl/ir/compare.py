"""The named checks of a plan's step against the reference step (docs/semantics.md §8).

``Pair`` holds the parallel program, the reference step's final outputs and its values at
marked points, and what the plan's program produced (``ir/execute.py``) on the same inputs.
``CHECKS`` run in order (Alive2's discipline: each has a stable name; all run): the copies of
the loss, the logical loss (§4.6), gradient coverage, every gradient copy in its final layout,
the plan's layout claims (§2.4), the optimizer recipe, every rank's gradient-clipping
coefficient (§6.3), every updated parameter and optimizer state, and the derived lineages at
marked points.

The checks say *what* is compared with *what*; a ``Comparator`` says whether two values are
equal. ``tvp simulate`` compares float64 values with a tolerance (``simulate/run.py``);
``tvp check`` compares exact symbolic values and hands what normalisation cannot decide to the
solver (``check/``). Both run these same checks, so a plan means one thing to both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from trainverify_dsl.ir.execute import ParallelOutcome
from trainverify_dsl.ir.interp import NUMERIC, Domain
from trainverify_dsl.ir.layout import MICROBATCH_AXIS, TLayout, take_local
from trainverify_dsl.ir.mesh import MeshGroups
from trainverify_dsl.ir.parallel import ParallelProgram
from trainverify_dsl.report.span import Span


@dataclass(frozen=True, slots=True)
class Mismatch:
    tensor: str
    rank: int
    rel_error: float
    span: Span | None
    detail: str = ""
    #: the named check that found it (``CHECKS``)
    check: str = ""


class Comparator(Protocol):
    """Whether the plan's value ``got`` equals the reference's ``want`` (same shape)."""

    def equal(self, got: Any, want: Any, where: Comparison) -> tuple[bool, float]:
        """``(equal, error)``: ``error`` is a relative error for numeric comparators (the
        worst is reported), ``0.0`` or ``inf`` otherwise."""
        ...


@dataclass(frozen=True, slots=True)
class Comparison:
    """What is being compared, for a comparator that records obligations."""

    check: str
    tensor: str
    rank: int
    span: Span | None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Recipe:
    """The optimizer recipe as the checks need it: whether the reference step updates the
    parameters (its ``spec-optimizer``), and what is wrong with the plan's recipe against it
    (``None``: the same recipe; computed by the driver, which knows the optimizer configs)."""

    reference_updates: bool
    problem: str | None = None
    #: what is wrong with each per-rank override's recipe (§6.4): (index into the optimizer's
    #: ``overrides``, the difference), reported at the override
    override_problems: tuple[tuple[int, str], ...] = ()
    #: parameters whose update differs from the reference's where a side has parameter
    #: groups (§6.5): (the plan statement that chose the update, the difference)
    param_problems: tuple[tuple[Span | None, str], ...] = ()


@dataclass
class Pair:
    """The reference step and the plan's program, evaluated on the same values."""

    program: ParallelProgram
    #: the reference step's final outputs (``loss``, ``grad(p)``, ``new(...)``)
    want: Mapping[str, Any]
    #: the reference's values at marked points (its ``point:`` outputs), for lineages and
    #: point claims
    points: Mapping[str, Any]
    got: ParallelOutcome
    recipe: Recipe
    comparator: Comparator
    domain: Domain = NUMERIC
    mesh: MeshGroups = field(init=False)
    compared: int = 0
    worst: float = 0.0
    mismatches: list[Mismatch] = field(default_factory=list)
    lineage_mismatches: list[Mismatch] = field(default_factory=list)
    _observed: dict[str, dict[tuple[int, int], Any]] | None = None

    def __post_init__(self) -> None:
        self.mesh = MeshGroups(self.program.mesh)

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
        where = Comparison(check, tensor, rank, span, detail)
        if np.shape(got) != np.shape(want):
            equal, err = False, math.inf
        else:
            equal, err = self.comparator.equal(got, want, where)
        self.worst = max(self.worst, err)
        if equal:
            return True
        self.mismatches.append(Mismatch(tensor, rank, err, span, detail, check))
        return False

    def fail(self, check: str, tensor: str, span: Span | None, detail: str) -> None:
        self.mismatches.append(Mismatch(tensor, -1, math.inf, span, detail, check))

    def reconstruct(self, pieces: Mapping[tuple[int, int], np.ndarray], layout: TLayout,
                    rank: int, m: int) -> Any:
        """The rank's value under ``layout``: its piece, combined over its partial group."""
        if not layout.partial:
            return pieces.get((rank, m))
        op, axes = layout.partial
        axes = tuple(a for a in axes if a in self.mesh.sizes)
        group = self.mesh.group(rank, axes) if axes else [rank]
        members = [pieces.get((r, m)) for r in group]
        if any(x is None for x in members) or op not in ("sum", "avg", "max", "min"):
            return None
        return self.domain.collective("all_reduce", [(x,) for x in members],
                                      {"axis": ",".join(axes), "op": op,
                                       "group_size": len(group)})[0]


def _check_loss_copies(pair: Pair) -> None:
    data_axes = pair.program.loss.data_axes
    span = pair.program.loss.origin.span
    first: dict[tuple, Any] = {}
    for (rank, m), value in sorted(pair.got.losses.items()):
        coords = pair.mesh.coords(rank)
        key = tuple(coords[a] for a in data_axes) + (m,)
        if key in first:
            pair.compare("loss copies", "loss (copy)", rank, value, first[key], span)
        else:
            first[key] = value


def _mean(values: list[Any]) -> Any:
    """The mean of 0-d values of any domain (a sum, then one division)."""
    return _sum(values) / len(values)


def _sum(values: list[Any]) -> Any:
    scalars = [np.asarray(v)[()] for v in values]
    total = scalars[0]
    for v in scalars[1:]:
        total = total + v
    return total


def _check_loss(pair: Pair) -> None:
    """The logical loss (§4.6): one local loss per data block and microbatch, summed over
    the blocks along the reduction's summed axes (and the microbatches, unless a
    ``local-mean``), averaged over the rest."""
    loss = pair.program.loss
    data_axes = loss.data_axes
    blocks: dict[tuple, Any] = {}
    for (rank, m), value in sorted(pair.got.losses.items()):
        coords = pair.mesh.coords(rank)
        blocks.setdefault(tuple(coords[a] for a in data_axes) + (m,), value)
    if not blocks:
        pair.fail("loss", "loss", loss.origin.span, "no rank computes the loss")
        return
    if loss.mode == "local-mean":
        logical = _mean(list(blocks.values()))
    else:
        summed = [i for i, a in enumerate(data_axes) if a in loss.summed] + [len(data_axes)]
        groups: dict[tuple, list[Any]] = {}
        for key, value in blocks.items():
            rest = tuple(k for i, k in enumerate(key) if i not in summed)
            groups.setdefault(rest, []).append(value)
        logical = _mean([_sum(v) for v in groups.values()])
    pair.compare("loss", "loss", -1, logical, pair.want["loss"], loss.origin.span)


def _grad_spans(program: ParallelProgram) -> dict[str, Span | None]:
    """Where a gradient's difference is reported: its last gradient statement, else the
    statement that distributes the parameter. A statement that runs before the last
    microbatch (``after=k``, ``k`` below the microbatches) leaves the later microbatches'
    contributions out of what it reduces: when one acts on the parameter, the difference
    is reported there (the statements after it receive what it left). In a plan that splits
    no data, a parameter no statement names is reported where the backward seed is stated
    (``loss-scale``, else ``microbatches``): the seed is then all that scales its gradient.
    With data split, such a gradient most likely lacks its reduction, which no line states
    (the layout pass's TVP410 stands at the split)."""
    fallback = None if program.loss.data_axes else program.seed_origin.span
    spans: dict[str, Span | None] = {p: fallback for p, _ in program.param_layouts}
    spans.update((p, s.span) for p, s in program.param_sources)
    early: set[str] = set()
    for sync in program.grad_syncs:
        for param in sync.params:
            if param in early:
                continue
            spans[param] = sync.origin.span
            if 0 < sync.after < program.microbatches:
                early.add(param)
    return spans


def _check_coverage(pair: Pair) -> None:
    holders = {p for acc in pair.got.grads.values() for p in acc}
    for name in pair.want:
        if name.startswith("grad(") and name[5:-1] not in holders:
            pair.fail("gradient coverage", name, None, "no rank computes this gradient")


def _check_gradients(pair: Pair) -> None:
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


def _check_claims(pair: Pair) -> None:
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


def _mean_losses(pair: Pair) -> dict[tuple[int, int], Any]:
    """Each rank's loss over its microbatches: averaged, or summed when the loss reduction
    sums them (§4.3)."""
    by_rank: dict[int, list[Any]] = {}
    for (rank, _), value in sorted(pair.got.losses.items()):
        by_rank.setdefault(rank, []).append(value)
    combine = _sum if pair.program.loss.sums_microbatches else _mean
    return {(r, 0): combine(v) for r, v in by_rank.items()}


def _check_claim_pieces(pair: Pair, claim: Any, pieces: Mapping, want_global: np.ndarray,
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


def _check_recipe(pair: Pair) -> None:
    opt = pair.program.optimizer
    if opt is None and not pair.recipe.reference_updates:
        return
    if opt is None:
        pair.fail("optimizer recipe", "optimizer", None, "the spec's step updates the "
                  "parameters, but the plan has no `optimizer` statement")
        return
    span = opt.origin.span
    if not pair.recipe.reference_updates:
        pair.fail("optimizer recipe", "optimizer", span, "the plan states no `spec-optimizer`, "
                  "so its update cannot be checked: state the reference step's recipe "
                  "(`spec-optimizer adamw lr=3e-4 ...`)")
        return
    if pair.recipe.problem is not None:
        pair.fail("optimizer recipe", "optimizer", span, pair.recipe.problem)
    for index, problem in pair.recipe.override_problems:
        pair.fail("optimizer recipe", "optimizer", opt.overrides[index].origin.span, problem)
    for where, problem in pair.recipe.param_problems:
        pair.fail("optimizer recipe", "optimizer", where, problem)


def _check_clipping(pair: Pair) -> None:
    """Every rank's ``clip-grad-norm`` squared norm and coefficient against the reference's
    (§6.3)."""
    clip = pair.program.clip
    if clip is None or "clip.coef" not in pair.want:
        return  # a recipe without clipping is the recipe check's finding
    group = f"norm group over {', '.join(clip.axes)}, replicas={clip.replicas}"
    for rank, coef in sorted(pair.got.clip_coefs.items()):
        # the norm itself first: below the bound the coefficient is 1 whatever the norm
        if "clip.total" in pair.want and rank in pair.got.clip_totals:
            pair.compare("clipping", "clip squared norm", rank, pair.got.clip_totals[rank],
                         pair.want["clip.total"], clip.origin.span, group)
        pair.compare("clipping", "clip coefficient", rank, coef, pair.want["clip.coef"],
                     clip.origin.span, group)


def _check_updates(pair: Pair) -> None:
    opt = pair.program.optimizer
    if opt is None or not pair.recipe.reference_updates:
        return
    span, sizes = opt.origin.span, pair.program.sizes
    for u in opt.updates:
        outputs = [(f"new({u.param})", u.layout)]
        outputs += [(f"new({s}({u.param}))", u.block) for s in u.states]
        for name, layout in outputs:
            if name not in pair.want:
                pair.fail("updates", name, span, "the spec's optimizer has no such state")
                continue
            # ranks under a per-rank override first: a difference there is reported at the
            # override, before the copies it reaches through a ZeRO all-gather
            for rank, mine in sorted(pair.got.updates.items(), key=lambda item: (
                    opt.override_for(pair.mesh.coords(item[0])) is None, item[0])):
                if name in mine:
                    want = take_local(pair.want[name], layout, pair.coords(rank), sizes)
                    # a rank under a per-rank override is reported at the override (§6.4)
                    override = opt.override_for(pair.mesh.coords(rank))
                    at = override.origin.span if override is not None else span
                    pair.compare("updates", name, rank, mine[name], want, at)
    for name in pair.want:
        if name.startswith("new(") and not any(name in m for m in pair.got.updates.values()):
            pair.fail("updates", name, span, "no rank computes this update")


def _check_lineages(pair: Pair) -> None:
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
            detail = f"local piece vs lineage {lay.describe()}, microbatch {m}"
            where = Comparison("lineages", lineage.point, rank, lineage.origin.span, detail)
            equal, err = pair.comparator.equal(got, want, where)
            if not equal:
                pair.lineage_mismatches.append(Mismatch(
                    lineage.point, rank, err, lineage.origin.span, detail, "lineages"))
                break


#: The named checks, in order (Alive2's discipline: each has a stable name; all run).
CHECKS: tuple[tuple[str, Callable[[Pair], None]], ...] = (
    ("loss copies", _check_loss_copies),
    ("loss", _check_loss),
    ("gradient coverage", _check_coverage),
    ("gradients", _check_gradients),
    ("claims", _check_claims),
    ("optimizer recipe", _check_recipe),
    ("clipping", _check_clipping),
    ("updates", _check_updates),
    ("lineages", _check_lineages),
)


def run_checks(pair: Pair) -> Pair:
    """Every check of ``CHECKS``, in order, on ``pair``; returns it with its findings."""
    for _, check in CHECKS:
        check(pair)
    return pair
