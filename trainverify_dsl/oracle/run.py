"""Run plans as real multi-process ``torch.distributed`` steps and compare with plain torch.

``run_distributed(path)`` (one plan) and ``run_many(paths)`` (several, one after another):

1. in this process: resolve the plan, build its (shrunk) spec model, lower it, draw values
   from the seed and run the single-device reference step (``oracle.reference``: torch
   autograd and ``torch.optim``, float64);
2. fork one process per rank (``oracle.worker``): each joins a gloo world of the plan's size,
   runs its rank's step (``oracle.rank``) and compares its local pieces with the reference's;
3. here: the logical loss (docs/semantics.md §4.6: the mean over data blocks and microbatches,
   every copy over the other axes equal), and every rank's comparisons, in program order.

Forking (not spawning) is what keeps this cheap: the ranks inherit the lowered programs, so a
plan is lowered once, not once per rank, and no interpreter starts or imports torch again.
Rank processes are killed (by their own ids) on a timeout; nothing is left running.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainverify_dsl.oracle.mesh import Mesh
from trainverify_dsl.oracle.rank import OracleError
from trainverify_dsl.oracle.worker import RankJob, rank_main, rel_error
from trainverify_dsl.plan.checks import INTERLEAVED

#: The largest mesh the oracle runs (one process per rank on this machine).
MAX_RANKS = 8
#: A tensor is compared relative to its largest entry, but never relative to less than this
#: fraction of the largest expected value of the whole step (a gradient that is zero in real
#: arithmetic is round-off on both sides).
FLOOR = 1e-6
#: Relative error below which the distributed step agrees with the reference.
TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class Difference:
    tensor: str
    rank: int
    rel_error: float


@dataclass
class OracleResult:
    plan: str
    ranks: int
    max_rel_error: float = math.inf
    compared: int = 0
    #: every tensor (and rank) whose relative error is not below TOLERANCE, in program order
    differences: list[Difference] = field(default_factory=list)
    seconds: float = 0.0
    #: why the plan did not run (``None`` if it ran)
    error: str | None = None
    #: the plan cannot be lowered (``error`` has the lowering's message)
    lowering_error: bool = False
    #: the slowest rank's seconds in its distributed step (of ``seconds``)
    rank_seconds: float = 0.0
    #: how the inputs compared were drawn, when not the first draw (``COUNT_DRAW``)
    draw: str = ""
    #: the full-size layout pass's errors (``RankJob.layout_errors``): a plan with any is
    #: never said to agree, whatever its values
    layout_errors: tuple[str, ...] = ()

    @property
    def values_agree(self) -> bool:
        return self.error is None and not self.differences and self.max_rel_error < TOLERANCE

    @property
    def agrees(self) -> bool:
        return self.values_agree and not self.layout_errors

    @property
    def first(self) -> Difference | None:
        return self.differences[0] if self.differences else None

    def summary(self) -> str:
        if self.error is not None:
            return f"{self.plan}: not run: {self.error}"
        verdict = "agrees" if self.agrees else "rejected: its values agree" \
            if self.values_agree else "differs"
        text = (f"{self.plan}: {verdict} with single-device torch: max relative error "
                f"{self.max_rel_error:.3g} over {self.compared} tensors on {self.ranks} ranks "
                f"({self.seconds:.1f} s)")
        if self.first is not None:
            f = self.first
            where = "" if f.rank < 0 else f" on rank {f.rank}"
            text += f"; first difference: {f.tensor}{where} (relative error {f.rel_error:.3g})"
        if self.draw:
            text += f"; the inputs compared: {self.draw} (the first draw agreed)"
        if self.layout_errors:
            count = len(self.layout_errors)
            unseen = ", which no value compared here shows" if self.values_agree else ""
            text += (f"; the layout pass reports {count} error{'' if count == 1 else 's'}"
                     f"{unseen} (first: {self.layout_errors[0]}); run `tvp lint --spec`")
        return text


def _at(origin: Any, path: Path) -> str:
    """``file:line:col`` of a plan statement (an origin's report span, or a span: ``Span``
    prints so), else the plan file's 1:1."""
    span = getattr(origin, "report_span", origin)
    return str(span) if span is not None else f"{path}:1:1"


def _prepare(path: Path, folder: Path, seed: int, timeout: float,
             allow_model_outside_root: bool = False, few: bool = False,
             layout_errors: tuple[str, ...] | None = None) -> RankJob:
    """Resolve, build, lower (here, once: the ranks are forked from this process), draw the
    values and run the reference step. Raises ``LoweringError`` / ``OracleError``;
    ``allow_model_outside_root``: see ``api.prepare``. ``layout_errors``: the layout pass's,
    when a first draw of the plan found them already."""
    from trainverify_dsl.api import _layout_pass, prepare, resolve_plan, unheld_mask
    from trainverify_dsl.lower.lowering import lower
    from trainverify_dsl.oracle.reference import draw_values, reference_step
    from trainverify_dsl.report.diagnostics import Severity
    from trainverify_dsl.simulate.run import model_vocab, unheld_masks

    plan = resolve_plan(path)
    if plan.mesh is None:
        raise OracleError(f"{path}:1:1: the plan has no mesh")
    world = math.prod(a.size for a in plan.mesh.axes)
    if world > MAX_RANKS:
        raise OracleError(f"{_at(plan.mesh.span, path)}: the mesh has {world} ranks; the "
                          "distributed oracle runs "
                          f"one process per rank and takes at most {MAX_RANKS} (use `tvp "
                          "simulate` for larger meshes)")
    if plan.schedule == INTERLEAVED:
        raise OracleError(f"{_at(plan.header_origin('microbatches'), path)}: the oracle "
                          "runs one stage per pp rank; virtual stages "
                          "(`schedule interleaved-1f1b`) are not run by it (use `tvp "
                          "simulate`)")
    if plan.overrides:
        raise OracleError(f"{_at(plan.overrides[0].origin, path)}: per-rank overrides (`on "
                          "...: optimizer ...`) are not run by the oracle (every rank runs "
                          "the plan-wide optimizer; use `tvp simulate`)")
    if plan.loss_reduction is not None and plan.loss_reduction.mode != "local-mean":
        raise OracleError(f"{_at(plan.loss_reduction.origin, path)}: `loss-reduction "
                          f"{plan.loss_reduction.mode}` is not run by "
                          "the oracle (its ranks run the default local mean, each dividing its "
                          "loss by its own count, not the plan's reduction; use `tvp simulate`)")
    # the full-size layout pass of every other command: its errors (a false layout claim, a
    # view the model's own code would run otherwise on a rank: TVP313) change no value the
    # ranks compare, so the plan is never said to agree beside them
    if layout_errors is None:
        findings, _ = _layout_pass(path, allow_model_outside_root)
        layout_errors = tuple(f"{d.span.file}:{d.span.line}:{d.span.col}: {d.message} "
                              f"[{d.code.id}]" for d in findings
                              if d.severity is Severity.ERROR)
    setup = prepare(path, allow_model_outside_root=allow_model_outside_root)
    assert setup.real_model is not None
    lowered = lower(setup.plan, setup.fake_model, setup.fake_inputs)
    _refuse_partial_embedding_groups(path, lowered)
    if plan.optimizer is not None and plan.spec_optimizer is None:
        raise OracleError(f"{path}: the plan has an `optimizer` but no `spec-optimizer`: the "
                          "single-device step's recipe is unknown")
    if plan.optimizer and plan.spec_optimizer and plan.optimizer.kind != plan.spec_optimizer.kind:
        raise OracleError(f"{path}: the plan's optimizer ({plan.optimizer.kind}) is not the "
                          f"spec's ({plan.spec_optimizer.kind}); `tvp lint` reports it (TVP280)")
    masks, ranges = _input_draws(setup, plan)
    values = draw_values(setup.real_model, setup.input_specs, plan.optimizer, seed, masks,
                         ranges, few)
    # the reference is the single-device step: the spec's own optimizer recipe
    try:
        reference = reference_step(setup.real_model, values, list(setup.input_specs),
                                   plan.spec_optimizer, plan.spec_param_groups)
    except IndexError:  # a masked value past a shrunk table: TVP312, as tvp simulate says
        vocab = model_vocab(setup.real_model) or 2
        unheld_mask(unheld_masks(masks, ranges, vocab), setup.real_model)
        raise
    folder.mkdir(parents=True)
    magnitude = max((float(np.max(np.abs(v))) for v in reference.values() if v.size), default=1)
    return RankJob(lowered, values, reference, folder, seed, FLOOR * magnitude, timeout,
                   layout_errors=layout_errors)


def _input_draws(setup: Any, plan: Any
                 ) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """The integer inputs drawn masked and every integer input's range, as ``tvp simulate``
    draws them: masked where the model declares it and where the single-device step tests
    against a constant (a label's ``ignore_index``, a 0/1 mask), read from the traced step,
    so a model need not declare ``masked_inputs()`` (a plan dividing each rank's loss by its
    own count agreed here while ``tvp simulate`` differed); in range of the tables they index
    (``input_ranges``: a ``position_ids`` input was drawn up to the vocabulary)."""
    from trainverify_dsl.api import spec_optimizer
    from trainverify_dsl.simulate.run import input_masks, input_ranges, model_vocab
    from trainverify_dsl.spec.trace import trace_training_step

    spec = trace_training_step(setup.fake_model, setup.input_specs,
                               spec_optimizer(plan, setup.fake_model))
    ranges = input_ranges(spec.program, model_vocab(setup.real_model) or 2)
    return input_masks(setup.real_model, spec.program, ranges), ranges


def _refuse_partial_embedding_groups(path: Path, lowered: Any) -> None:
    """The oracle runs the embedding group (``all-reduce grad(P) over pp``, §5.4) over the
    whole pp group only: a tied parameter held on some of the stages would need a process
    group of its holders."""
    from trainverify_dsl.oracle.rank import tied_stages

    stages = len(lowered.stages)
    for statement, names in lowered.binding.grad_statements:
        if "pp" not in statement.axes:
            continue
        partial = [p for p in names if len(tied_stages(lowered).get(p, ())) != stages]
        if partial:
            raise OracleError(f"{path}: `{statement.kind} {statement.target} over pp` sums the "
                              f"copies of `{partial[0]}` held on some of the {stages} stages; "
                              "the oracle runs an embedding group over every pp rank only "
                              "(use `tvp simulate`)")


def run_distributed(path: str | Path, seed: int = 0, timeout: float = 120.0,
                    allow_model_outside_root: bool = False) -> OracleResult:
    """One plan. Raises ``LoweringError`` if the plan cannot be lowered, ``OracleError`` if the
    oracle cannot run it (too many ranks, an unsupported statement, a rank that fails)."""
    with tempfile.TemporaryDirectory(prefix="tvp-oracle-") as tmp:
        start = time.perf_counter()
        job = _prepare(Path(path).resolve(), Path(tmp) / "plan", seed, timeout,
                       allow_model_outside_root)
        result = _run(str(path), job, timeout)
        if result.values_agree and (job.lowered.local_counts or job.lowered.fixed_count):
            # a plan dividing by per-block counts (TVP415): drawn again so that the blocks
            # count differently, as `tvp simulate` does
            from trainverify_dsl.simulate.run import COUNT_DRAW

            again = _run(str(path), _prepare(Path(path).resolve(), Path(tmp) / "again",
                                             seed, timeout, allow_model_outside_root,
                                             few=True, layout_errors=job.layout_errors),
                         timeout)
            if again.error is None and not again.values_agree:
                again.draw, result = COUNT_DRAW, again
        result.seconds = time.perf_counter() - start
    if result.error is not None:
        raise OracleError(result.error)
    return result


def run_many(paths: list[str | Path], seed: int = 0, timeout: float = 120.0,
             collectives: str = "torch") -> dict[str, OracleResult]:
    """Several plans, one after another; by plan (as given). A plan that cannot be lowered or
    run is reported (``error``, ``lowering_error``), not raised. ``timeout`` bounds each plan's
    distributed run (seconds). ``collectives="project"`` runs the project's own
    ``tvp.collective`` (``lower.collectives.DistCommunicator``) instead of one
    ``torch.distributed`` call per collective: a check of that path."""
    from trainverify_dsl.lower.findings import LoweringError

    results: dict[str, OracleResult] = {}
    with tempfile.TemporaryDirectory(prefix="tvp-oracle-") as tmp:
        for i, path in enumerate(paths):
            key = str(path)
            start = time.perf_counter()
            try:
                job = _prepare(Path(path).resolve(), Path(tmp) / f"plan{i}", seed, timeout)
                job.collectives = collectives
            except LoweringError as error:
                results[key] = OracleResult(key, 0, error=f"LoweringError: {error}",
                                            lowering_error=True)
            except OracleError as error:
                results[key] = OracleResult(key, 0, error=str(error))
            else:
                results[key] = _run(key, job, timeout)
            results[key].seconds = time.perf_counter() - start
    return results


def _run(key: str, job: RankJob, timeout: float) -> OracleResult:
    """Fork one process per rank, wait (at most ``timeout`` seconds), collect."""
    context = multiprocessing.get_context("fork")
    world = Mesh(job.lowered.mesh_axes).world_size
    procs = [context.Process(target=rank_main, args=(job, rank), name=f"tvp-oracle-rank{rank}",
                             daemon=True) for rank in range(world)]
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.join(max(0.1, deadline - time.monotonic()))
    finally:
        for proc in procs:  # only our own processes, by their ids
            if proc.is_alive():
                proc.kill()
                proc.join()
    return _collect(key, job, world, timeout)


def _collect(key: str, job: RankJob, world: int, timeout: float) -> OracleResult:
    result = OracleResult(key, world, layout_errors=job.layout_errors)
    ranks: list[dict[str, Any]] = []
    reported: list[tuple[int, str, str]] = []
    killed: list[int] = []
    for rank in range(world):
        done = job.folder / f"rank{rank}.json"
        failed = job.folder / f"rank{rank}.error.json"
        if failed.exists():
            report = json.loads(failed.read_text())
            reported.append((rank, f"{report['kind']}: {report['message']}",
                             report["traceback"]))
        elif done.exists():
            ranks.append(json.loads(done.read_text()))
        else:
            killed.append(rank)
    if reported or killed:
        # the root cause first: a rank's own error, not the timeouts it caused on the ranks
        # waiting for it, nor the ranks killed while they waited
        causes = [e for e in reported if "imeout" not in e[1] and "timed out" not in e[1]]
        if causes or reported:
            rank, message, trace = (causes or reported)[0]
            result.error = f"rank {rank}: {message}\n{trace[-2000:]}".rstrip()
        else:
            result.error = (f"ranks {', '.join(map(str, killed))}: no result within "
                            f"{timeout:.0f} s (killed)")
        return result
    _compare(result, job, ranks)
    result.rank_seconds = max(r["seconds"] for r in ranks)
    return result


def _compare(result: OracleResult, job: RankJob, ranks: list[dict[str, Any]]) -> None:
    found: list[tuple[int, int, Difference]] = []
    order = {name: i for i, name in enumerate(job.reference)}
    worst = 0.0
    compared = 0

    def record(name: str, rank: int, err: float) -> None:
        nonlocal worst, compared
        compared += 1
        worst = max(worst, err)
        if not err < TOLERANCE:
            found.append((order.get(name, -1), rank, Difference(name, rank, err)))

    copies: dict[tuple[Any, ...], list[tuple[int, float]]] = {}
    for data in ranks:
        for m, (block, value) in enumerate(data["losses"]):
            copies.setdefault((*block, m), []).append((data["rank"], value))
    for items in copies.values():
        for rank, value in items[1:]:
            record("loss (copy)", rank, rel_error(np.array(value), np.array(items[0][1]),
                                                  job.floor))
    plan_loss = np.mean([items[0][1] for items in copies.values()]) if copies else math.nan
    record("loss", -1, rel_error(np.array(plan_loss), job.reference["loss"], job.floor))
    held = set()
    for data in ranks:
        for name, err in data["checks"]:
            held.add(name)
            record(name, data["rank"], err)
    for name in job.reference:
        if name != "loss" and name not in held:
            found.append((order[name], -1, Difference(f"{name} (no rank holds it)", -1,
                                                      math.inf)))
            worst = math.inf
    result.max_rel_error = worst
    result.compared = compared
    result.differences = [d for _, _, d in sorted(found, key=lambda x: (x[0], x[1]))]
