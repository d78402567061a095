"""The process of one rank: ``python -m trainverify_dsl.oracle.worker JOB RANK``.

``JOB`` is a JSON file written by ``oracle.run`` listing plans; for each plan whose world
includes ``RANK`` the process lowers the plan itself (no FX graph crosses a process boundary,
and nothing is unpickled: values and the reference come as ``.npz`` without pickle), joins a
fresh gloo world for it, runs its rank's step (``oracle.rank``), compares its pieces with the
reference, and writes ``rank<RANK>.json`` (or ``rank<RANK>.error.json``) in the plan's folder.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


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


def run_plan(job: dict[str, Any], rank: int) -> dict[str, Any]:
    import torch.distributed as dist

    from trainverify_dsl.lower.layout import take_local
    from trainverify_dsl.lower.lowering import lower
    from trainverify_dsl.oracle.comm import World
    from trainverify_dsl.oracle.mesh import Mesh
    from trainverify_dsl.oracle.rank import axes_lists, run_rank
    from trainverify_dsl.simulate.setup import prepare

    folder = Path(job["dir"])
    start = time.perf_counter()
    setup = prepare(job["path"], real=False)
    lowered = lower(setup.plan, setup.fake_model, setup.fake_inputs)
    values = _load(folder / "values.npz")
    reference = _load(folder / "reference.npz")
    mesh = Mesh(lowered.mesh_axes)
    lowered_at = time.perf_counter()
    dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=rank,
                            world_size=mesh.world_size,
                            timeout=datetime.timedelta(seconds=job["timeout"]))
    try:
        world = World(mesh, axes_lists(lowered))
        output = run_rank(lowered, values, world, job["seed"])
        dist.barrier()
    finally:
        dist.destroy_process_group()
    coords = mesh.coords(rank)
    checks = []
    for name, (piece, layout) in output.pieces.items():
        want = take_local(reference[name], layout, coords, lowered.sizes)
        checks.append([name, rel_error(piece, want, job["floor"])])
    return {"rank": rank, "stage": coords.get("pp", 0), "losses": output.losses,
            "checks": checks, "lower_seconds": lowered_at - start,
            "step_seconds": time.perf_counter() - lowered_at}


def main(argv: list[str]) -> int:
    import torch

    torch.set_num_threads(1)
    job_path, rank = Path(argv[0]), int(argv[1])
    plans = json.loads(job_path.read_text())["plans"]
    for job in plans:
        if rank >= job["world"]:
            continue
        folder = Path(job["dir"])
        try:
            result = run_plan(job, rank)
            (folder / f"rank{rank}.json").write_text(json.dumps(result))
        except Exception as error:  # reported by the parent; on to the next plan
            from trainverify_dsl.lower.findings import LoweringError

            report = {"rank": rank, "kind": type(error).__name__,
                      "lowering": isinstance(error, LoweringError),
                      "message": str(error), "traceback": traceback.format_exc()}
            (folder / f"rank{rank}.error.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
