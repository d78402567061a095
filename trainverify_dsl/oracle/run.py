"""Run plans as real multi-process ``torch.distributed`` steps and compare with plain torch.

``run_distributed(path)`` (one plan) and ``run_many(paths)`` (several plans sharing one set of
processes, which saves the interpreter start-up and torch import of every rank for every plan):

1. in this process: resolve the plan, build its (shrunk) spec model, draw values from the seed
   and run the single-device reference step (``oracle.reference``: torch autograd and
   ``torch.optim``, float64); write values and reference as ``.npz``;
2. spawn one process per rank of the largest mesh (``oracle.worker``); each lowers the plan,
   joins a gloo world of the plan's size and runs its rank's step (``oracle.rank``), then
   compares its local pieces with the reference's;
3. here: the logical loss (docs/semantics.md §4.6: the mean over data blocks and microbatches,
   every copy over the other axes equal), and every rank's comparisons, in program order.

Processes are killed (by their own ids) on a timeout or failure; nothing is left running.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainverify_dsl.oracle.rank import OracleError

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

    @property
    def agrees(self) -> bool:
        return self.error is None and not self.differences and self.max_rel_error < TOLERANCE

    @property
    def first(self) -> Difference | None:
        return self.differences[0] if self.differences else None

    def summary(self) -> str:
        if self.error is not None:
            return f"{self.plan}: not run: {self.error}"
        verdict = "agrees" if self.agrees else "differs"
        text = (f"{self.plan}: {verdict} with single-device torch: max relative error "
                f"{self.max_rel_error:.3g} over {self.compared} tensors on {self.ranks} ranks "
                f"({self.seconds:.1f} s)")
        if self.first is not None:
            f = self.first
            where = "" if f.rank < 0 else f" on rank {f.rank}"
            text += f"; first difference: {f.tensor}{where} (relative error {f.rel_error:.3g})"
        return text


@dataclass
class _Prepared:
    path: Path
    folder: Path
    world: int
    reference: dict[str, np.ndarray]
    floor: float


def _prepare(path: Path, folder: Path, seed: int) -> _Prepared:
    from trainverify_dsl.oracle.reference import draw_values, reference_step
    from trainverify_dsl.simulate.setup import prepare, resolve_plan

    plan = resolve_plan(path)
    if plan.mesh is None:
        raise OracleError(f"{path}: the plan has no mesh")
    world = math.prod(a.size for a in plan.mesh.axes)
    if world > MAX_RANKS:
        raise OracleError(f"{path}: the mesh has {world} ranks; the distributed oracle runs "
                          f"one process per rank and takes at most {MAX_RANKS} (use `tvp "
                          "simulate` for larger meshes)")
    if plan.clip_grad_norm is not None:
        raise OracleError(f"{path}: `clip-grad-norm` is not run by the oracle")
    setup = prepare(path)
    assert setup.real_model is not None
    values = draw_values(setup.real_model, setup.input_specs, plan.optimizer, seed)
    reference = reference_step(setup.real_model, values, list(setup.input_specs),
                               plan.optimizer)
    folder.mkdir(parents=True)
    np.savez(folder / "values.npz", **values)
    np.savez(folder / "reference.npz", **reference)
    magnitude = max((float(np.max(np.abs(v))) for v in reference.values() if v.size), default=1)
    return _Prepared(path, folder, world, reference, FLOOR * magnitude)


def run_distributed(path: str | Path, seed: int = 0, timeout: float = 300.0) -> OracleResult:
    """One plan. Raises ``LoweringError`` if the plan cannot be lowered, ``OracleError`` if the
    oracle cannot run it (too many ranks, an unsupported statement)."""
    result = run_many([path], seed=seed, timeout=timeout)[str(path)]
    if result.lowering_error:
        from trainverify_dsl.lower.lowering import lower
        from trainverify_dsl.simulate.setup import prepare

        setup = prepare(path, real=False)
        lower(setup.plan, setup.fake_model, setup.fake_inputs)  # raises the LoweringError
    if result.error is not None:
        raise OracleError(result.error)
    return result


def run_many(paths: list[str | Path], seed: int = 0, timeout: float = 600.0,
             work_dir: str | Path | None = None) -> dict[str, OracleResult]:
    """Several plans, one after another, on one set of processes; by plan (as given). A plan
    that cannot run has ``error`` set; ``timeout`` (seconds) bounds the whole batch."""
    with tempfile.TemporaryDirectory(prefix="tvp-oracle-", dir=work_dir) as tmp:
        return _run_many([Path(p) for p in paths], [str(p) for p in paths], seed, timeout,
                         Path(tmp))


def _run_many(paths: list[Path], keys: list[str], seed: int, timeout: float,
              tmp: Path) -> dict[str, OracleResult]:
    results: dict[str, OracleResult] = {}
    prepared: dict[str, _Prepared] = {}
    started: dict[str, float] = {}
    for i, (path, key) in enumerate(zip(paths, keys, strict=True)):
        started[key] = time.perf_counter()
        try:
            prepared[key] = _prepare(path.resolve(), tmp / f"plan{i}", seed)
        except Exception as error:  # a plan that does not even build: reported, not raised
            results[key] = OracleResult(key, 0, error=f"{type(error).__name__}: {error}")
    if prepared:
        logs = _spawn_and_wait(list(prepared.values()), seed, timeout, tmp)
        for key, prep in prepared.items():
            results[key] = _collect(key, prep, logs)
            results[key].seconds = time.perf_counter() - started[key]
    return {key: results[key] for key in keys}


def _spawn_and_wait(plans: list[_Prepared], seed: int, timeout: float, tmp: Path) -> str:
    """Run the workers; the tail of their logs (for a failure message)."""
    gloo_timeout = max(30.0, timeout / 2)
    job = {"plans": [{"path": str(p.path), "dir": str(p.folder), "world": p.world,
                      "seed": seed, "floor": p.floor, "timeout": gloo_timeout}
                     for p in plans]}
    (tmp / "job.json").write_text(json.dumps(job))
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(x for x in (str(root), os.environ.get("PYTHONPATH"))
                                          if x))
    procs: list[subprocess.Popen[bytes]] = []
    log_files = []
    try:
        for rank in range(max(p.world for p in plans)):
            log = open(tmp / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed below
            log_files.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "trainverify_dsl.oracle.worker", str(tmp / "job.json"),
                 str(rank)], env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass  # the plans without results are reported as timed out
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in log_files:
            log.close()
    tails = []
    for rank, proc in enumerate(procs):
        if proc.returncode:
            text = (tmp / f"rank{rank}.log").read_text(errors="replace")[-1500:]
            tails.append(f"rank {rank} exited with {proc.returncode}:\n{text}")
    return "\n".join(tails)


def _collect(key: str, prep: _Prepared, logs: str) -> OracleResult:
    result = OracleResult(key, prep.world)
    ranks: list[dict[str, Any]] = []
    for rank in range(prep.world):
        done, failed = prep.folder / f"rank{rank}.json", prep.folder / f"rank{rank}.error.json"
        if failed.exists():
            report = json.loads(failed.read_text())
            result.error = f"rank {rank}: {report['kind']}: {report['message']}"
            result.lowering_error = bool(report["lowering"])
            if not result.lowering_error:
                result.error += "\n" + report["traceback"][-2000:]
            return result
        if not done.exists():
            result.error = f"rank {rank} gave no result (timed out or crashed)\n{logs}"
            return result
        ranks.append(json.loads(done.read_text()))
    _compare(result, prep, ranks)
    return result


def _compare(result: OracleResult, prep: _Prepared, ranks: list[dict[str, Any]]) -> None:
    found: list[tuple[int, int, Difference]] = []
    order = {name: i for i, name in enumerate(prep.reference)}
    worst = 0.0
    compared = 0

    def record(name: str, rank: int, err: float) -> None:
        nonlocal worst, compared
        compared += 1
        worst = max(worst, err)
        if not err < TOLERANCE:
            found.append((order.get(name, -1), rank, Difference(name, rank, err)))

    from trainverify_dsl.oracle.worker import rel_error

    copies: dict[tuple[Any, ...], list[tuple[int, float]]] = {}
    for data in ranks:
        for m, (block, value) in enumerate(data["losses"]):
            copies.setdefault((*block, m), []).append((data["rank"], value))
    for items in copies.values():
        for rank, value in items[1:]:
            record("loss (copy)", rank, rel_error(np.array(value), np.array(items[0][1]),
                                                  prep.floor))
    plan_loss = np.mean([items[0][1] for items in copies.values()]) if copies else math.nan
    record("loss", -1, rel_error(np.array(plan_loss), prep.reference["loss"], prep.floor))
    held = set()
    for data in ranks:
        for name, err in data["checks"]:
            held.add(name)
            record(name, data["rank"], err)
    for name in prep.reference:
        if name != "loss" and name not in held:
            found.append((order[name], -1, Difference(f"{name} (no rank holds it)", -1,
                                                      math.inf)))
            worst = math.inf
    result.max_rel_error = worst
    result.compared = compared
    result.differences = [d for _, _, d in sorted(found, key=lambda x: (x[0], x[1]))]
