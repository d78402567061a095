"""The process of one rank, forked from the oracle's process after it lowered the plan.

Forking hands every rank the parent's lowered stage programs, values and reference without
serialising anything (no pickle, no FX graph crossing a process boundary) and without lowering
the plan once per rank. The rank joins a fresh gloo world for the plan (a ``FileStore`` in the
plan's folder), runs its step (``oracle.rank``), compares its local pieces with the reference
and writes ``rank<RANK>.json`` (or ``rank<RANK>.error.json``) in the plan's folder.
"""

from __future__ import annotations

import datetime
import json
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainverify_dsl.lower.lowering import Lowered


def rel_error(got: np.ndarray, want: np.ndarray, floor: float) -> float:
    """Largest absolute difference over the largest expected entry (at least ``floor``)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    diff = float(np.max(np.abs(got - want)))
    scale = max(float(np.max(np.abs(want))), floor)
    return diff / scale if np.isfinite(diff) else float("inf")


@dataclass
class RankJob:
    lowered: Lowered
    values: Mapping[str, np.ndarray]
    reference: Mapping[str, np.ndarray]
    folder: Path
    seed: int
    floor: float
    #: seconds any rank waits for the others in a collective before giving up
    timeout: float
    #: ``"torch"`` (each collective one torch.distributed call) or ``"project"`` (the
    #: project's ``tvp.collective`` over its DistCommunicator)
    collectives: str = "torch"
    #: the full-size layout pass's errors (``path:line:col: message [code]``): the values
    #: may agree, the plan is still rejected (a false layout claim changes no value)
    layout_errors: tuple[str, ...] = ()


def run_rank_job(job: RankJob, rank: int) -> dict[str, Any]:
    import torch.distributed as dist

    from trainverify_dsl.ir.layout import take_local
    from trainverify_dsl.oracle.comm import World
    from trainverify_dsl.oracle.mesh import Mesh
    from trainverify_dsl.oracle.rank import axes_lists, run_rank

    start = time.perf_counter()
    mesh = Mesh(job.lowered.mesh_axes)
    dist.init_process_group("gloo", init_method=f"file://{job.folder / 'store'}", rank=rank,
                            world_size=mesh.world_size,
                            timeout=datetime.timedelta(seconds=job.timeout))
    try:
        world = World(mesh, axes_lists(job.lowered))
        output = run_rank(job.lowered, job.values, world, job.seed, job.collectives)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    coords = mesh.coords(rank)
    checks = []
    for name, (piece, layout) in output.pieces.items():
        want = take_local(job.reference[name], layout, coords, job.lowered.sizes)
        checks.append([name, rel_error(piece, want, job.floor)])
    return {"rank": rank, "losses": output.losses, "checks": checks,
            "seconds": time.perf_counter() - start}


def rank_main(job: RankJob, rank: int) -> None:
    """Entry point of a forked rank process: never raises, always leaves a report."""
    import torch

    torch.set_num_threads(1)
    try:
        result = run_rank_job(job, rank)
        (job.folder / f"rank{rank}.json").write_text(json.dumps(result))
    except BaseException as error:  # noqa: B036 - reported to the parent through the file
        report = {"rank": rank, "kind": type(error).__name__, "message": str(error),
                  "traceback": traceback.format_exc()}
        (job.folder / f"rank{rank}.error.json").write_text(json.dumps(report))
