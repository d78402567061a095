"""The lowering's meaning, checked against torch itself: for small plans, the lowered per-rank
local programs run under a real ``torch.distributed`` world (gloo, one CPU process per rank,
``DistCommunicator``) give the same per-microbatch losses and accumulated parameter gradients
as the IR path (AOTAutograd joint graph -> IR -> numpy SPMD interpreter,
``ir.execute.evaluate_parallel(..., step=False)``), and as the same programs run as threads
(``oracle.eager.run_threaded``). A negative control shows the comparison can fail: the IR
results of a buggy twin plan (``backward all-reduce`` on a Megatron output all-reduce) are far
from the correct plan's gloo results, and match the bug plan's own gloo run.

Every gloo process re-does everything from the plan path (prepare, spec trace, lowering,
random values from the seed): no FX graph or fake tensor crosses a process boundary.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trainverify_dsl.ir.mesh import MeshGroups
from trainverify_dsl.lower.collectives import parse_axes

#: about 80 s of gloo processes: the distributed oracle covers real torch.distributed in the
#: fast loop (tests/test_oracle_distributed.py)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PLANS = ["plans/mlp_tiny_dp.tvp", "plans/llama_tiny_tp.tvp", "plans/llama_tiny_sp.tvp",
         "plans/deepseek_tiny_ep.tvp"]
BUG_PLAN = "plans/bugs/backward_allreduce.tvp"
#: The correct twin of BUG_PLAN.
BUG_TWIN = "plans/llama_tiny_tp.tvp"
SEED = 0
TOL = 1e-10
TIMEOUT = 180


def _plan_id(path: str) -> str:
    return Path(path).stem


# --------------------------------------------------------------------------- shared by both sides


@dataclass
class Prepared:
    lowered: Any
    values: dict[str, np.ndarray]


def prepare_plan(plan_path: str, seed: int) -> Prepared:
    """prepare + spec trace + lower + random values: identical in the parent and every worker
    (same code, same plan file, same seed)."""
    from trainverify_dsl.api import prepare, spec_optimizer
    from trainverify_dsl.lower.lowering import lower
    from trainverify_dsl.simulate.run import random_inputs
    from trainverify_dsl.spec.trace import trace_training_step

    setup = prepare(ROOT / plan_path)
    spec = trace_training_step(setup.fake_model, setup.input_specs,
                               spec_optimizer(setup.plan), reuse=False)
    lowered = lower(setup.plan, setup.fake_model, setup.fake_inputs)
    values = random_inputs(spec.program.inputs, setup.real_model, np.random.default_rng(seed))
    return Prepared(lowered, values)


def collective_axes(lowered: Any) -> list[tuple[str, ...]]:
    """Every axis list the stages' ``tvp.collective`` calls use, sorted (so every process
    creates its ``torch.distributed`` groups in the same order)."""
    found: set[tuple[str, ...]] = set()
    for stage in lowered.stages:
        for node in stage.gm.graph.nodes:
            if node.op == "call_function" and node.target is torch.ops.tvp.collective.default:
                axes = node.kwargs["axes"] if "axes" in node.kwargs else node.args[2]
                found.add(parse_axes(axes))
    return sorted(found)


def _loss_key(m: int) -> str:
    return f"loss|{m}"


def _grad_key(param: str) -> str:
    return f"grad|{param}"


# --------------------------------------------------------------------------- gloo processes


def dist_worker(plans: list[tuple[str, int]], seed: int, rank: int, out_dir: str) -> None:
    """Entry point of one long-lived gloo process, run once for all plans (saves a process
    start-up per plan). For each (plan, world size) in turn, if this rank is in that world:
    prepare and lower the plan, join a fresh gloo world of that size (its own FileStore), run
    this rank's local step and save it to ``out_dir/<plan>/rank{rank}.npz`` (or the error to
    ``rank{rank}.err``)."""
    import datetime
    import traceback

    import torch.distributed as dist

    from trainverify_dsl.lower.collectives import DistCommunicator, use_communicator
    from trainverify_dsl.oracle.eager import rank_step

    torch.set_num_threads(1)
    for plan_path, world_size in plans:
        if rank >= world_size:
            continue
        out = Path(out_dir) / _plan_id(plan_path)
        try:
            prepared = prepare_plan(plan_path, seed)
            lowered = prepared.lowered
            assert MeshGroups(lowered.mesh_axes).world_size == world_size
            axes_lists = collective_axes(lowered)
            dist.init_process_group("gloo", init_method=f"file://{out / 'store'}", rank=rank,
                                    world_size=world_size,
                                    timeout=datetime.timedelta(seconds=TIMEOUT / 2))
            try:
                comm = DistCommunicator(MeshGroups(lowered.mesh_axes), axes_lists)
                calls: list[tuple[str, ...]] = []
                exchange = comm.exchange

                def counted(x: torch.Tensor, axes: tuple[str, ...],
                            exchange: Any = exchange, calls: list = calls) -> list[torch.Tensor]:
                    calls.append(tuple(axes))
                    return exchange(x, axes)

                comm.exchange = counted  # type: ignore[method-assign]
                with use_communicator(comm):
                    losses, grads = rank_step(lowered, prepared.values, rank)
                backend = dist.get_backend()
                dist.barrier()
            finally:
                dist.destroy_process_group()
            results: dict[str, np.ndarray] = {_loss_key(m): np.array(v)
                                              for m, v in enumerate(losses)}
            results |= {_grad_key(p): g for p, g in grads.items()}
            results["meta|backend"] = np.array(backend)
            results["meta|axes"] = np.array([",".join(a) for a in axes_lists], dtype=str)
            results["meta|exchanges"] = np.array(len(calls))
            np.savez(out / f"rank{rank}.npz", **results)
        except Exception:  # reported by the parent; on to the next plan
            (out / f"rank{rank}.err").write_text(traceback.format_exc())


# --------------------------------------------------------------------------- parent side


@dataclass
class RankResult:
    losses: list[float]
    grads: dict[str, np.ndarray]
    meta: dict[str, np.ndarray]


@functools.cache
def ir_side(plan_path: str) -> tuple[Prepared, dict[tuple[int, int], float],
                                     dict[int, dict[str, np.ndarray]]]:
    """The parent's lowering and values, and the IR/numpy losses and gradients."""
    from trainverify_dsl.ir.execute import evaluate_parallel
    from trainverify_dsl.lower.program import parallel_program

    prepared = prepare_plan(plan_path, SEED)
    out = evaluate_parallel(parallel_program(prepared.lowered), prepared.values, step=False)
    return prepared, out.losses, out.grads


GLOO_PLANS = list(dict.fromkeys(PLANS + [BUG_PLAN]))


def run_gloo(plan_paths: list[str], tmp: Path) -> dict[str, list[RankResult] | str]:
    """One process per rank of the largest mesh, each running every plan in turn (the plans'
    worlds one after another); by plan, the results by rank, or the failure text."""
    from trainverify_dsl.api import resolve_plan

    sizes = {p: math.prod(a.size for a in resolve_plan(ROOT / p).mesh.axes) for p in plan_paths}
    tests_dir = Path(__file__).resolve().parent
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(tests_dir),
                                           os.environ.get("PYTHONPATH", "")]))
    for p in plan_paths:
        (tmp / _plan_id(p)).mkdir()
    code = textwrap.dedent(f"""
        import sys
        from test_lower_torch_distributed import dist_worker
        dist_worker({list(sizes.items())!r}, {SEED}, int(sys.argv[1]), {str(tmp)!r})
    """)
    procs, logs = [], []
    for r in range(max(sizes.values())):
        log = open(tmp / f"rank{r}.log", "w+")  # closed below
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-c", code, str(r)], env=env, cwd=ROOT,
                                      stdout=log, stderr=subprocess.STDOUT))
    failures = []
    try:
        for p in plan_paths:  # the parent's own side meanwhile (a cache, for the tests)
            ir_side(p)
        for rank, proc in enumerate(procs):
            try:
                proc.wait(timeout=TIMEOUT * len(plan_paths))
            except subprocess.TimeoutExpired:
                pytest.fail(f"gloo rank {rank} timed out")
            if proc.returncode:
                logs[rank].seek(0)
                failures.append(f"rank {rank} exited {proc.returncode}:\n"
                                f"{logs[rank].read()[-3000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for log in logs:
            log.close()
    assert not failures, "\n".join(failures)
    out: dict[str, list[RankResult] | str] = {}
    for plan_path in plan_paths:
        d = tmp / _plan_id(plan_path)
        errors = [f"rank {r}: {(d / f'rank{r}.err').read_text()}"
                  for r in range(sizes[plan_path]) if (d / f"rank{r}.err").exists()]
        if errors:
            out[plan_path] = "\n".join(errors)
            continue
        ranks = []
        for rank in range(sizes[plan_path]):
            with np.load(d / f"rank{rank}.npz") as data:
                n_mb = sum(k.startswith("loss|") for k in data.files)
                losses = [float(data[_loss_key(m)]) for m in range(n_mb)]
                grads = {k.removeprefix("grad|"): data[k] for k in data.files
                         if k.startswith("grad|")}
                meta = {k.removeprefix("meta|"): data[k] for k in data.files
                        if k.startswith("meta|")}
            ranks.append(RankResult(losses, grads, meta))
        out[plan_path] = ranks
    return out


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``gloo(plan_path)``: the plan's gloo results by rank (all plans run once per module)."""
    cache: dict[str, list[RankResult] | str] = {}

    def get(plan_path: str) -> list[RankResult]:
        if not cache:
            try:
                cache.update(run_gloo(GLOO_PLANS, tmp_path_factory.mktemp("gloo")))
            except BaseException as error:  # don't re-run for every test: fail them all
                cache.update(dict.fromkeys(GLOO_PLANS, f"{type(error).__name__}: {error}"))
                raise
        result = cache[plan_path]
        if isinstance(result, str):
            pytest.fail(f"{plan_path}: gloo run failed:\n{result[-4000:]}")
        return result
    return get


def compare(got: list[RankResult] | list[tuple[list[float], dict[str, np.ndarray]]],
            losses: dict[tuple[int, int], float], grads: dict[int, dict[str, np.ndarray]],
            what: str) -> float:
    """Assert every rank's losses and gradients agree with the IR's; the worst rel. error."""
    from trainverify_dsl.simulate.run import rel_error

    worst = 0.0
    assert len(got) == len(grads), what
    for rank, result in enumerate(got):
        r_losses, r_grads = ((result.losses, result.grads) if isinstance(result, RankResult)
                             else result)
        want_losses = [v for (r, _), v in sorted(losses.items()) if r == rank]
        assert len(r_losses) == len(want_losses) > 0, f"{what}: rank {rank} microbatches"
        for m, (a, b) in enumerate(zip(r_losses, want_losses, strict=True)):
            err = rel_error(np.array(a), np.array(b))
            worst = max(worst, err)
            assert err < TOL, f"{what}: loss of rank {rank}, microbatch {m}: {a} vs IR {b}"
        assert sorted(r_grads) == sorted(grads[rank]), f"{what}: rank {rank} gradient names"
        for param, g in r_grads.items():
            err = rel_error(g, grads[rank][param])
            worst = max(worst, err)
            assert err < TOL, f"{what}: grad({param}) on rank {rank}: rel. error {err:.3g}"
    return worst


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("plan_path", PLANS, ids=_plan_id)
def test_gloo_matches_ir(plan_path: str, gloo: Any) -> None:
    prepared, losses, grads = ir_side(plan_path)
    results = gloo(plan_path)
    axes = collective_axes(prepared.lowered)
    for rank, result in enumerate(results):
        assert str(result.meta["backend"]) == "gloo"
        assert list(result.meta["axes"]) == [",".join(a) for a in axes], f"rank {rank}"
        # a plan with collectives in its local program really talked to the other processes
        assert (int(result.meta["exchanges"]) > 0) == bool(axes), f"rank {rank}"
    worst = compare(results, losses, grads, f"{plan_path} gloo vs IR")
    assert worst < TOL


@pytest.mark.parametrize("plan_path", ["plans/deepseek_tiny_ep.tvp"], ids=_plan_id)
def test_gloo_matches_threads(plan_path: str, gloo: Any) -> None:
    """The same local programs as threads of this process (``ThreadWorld``) against gloo
    processes, and against the IR."""
    from trainverify_dsl.oracle.eager import run_threaded

    prepared, losses, grads = ir_side(plan_path)
    threads = run_threaded(prepared.lowered, prepared.values)
    compare(threads, losses, grads, f"{plan_path} threads vs IR")
    for rank, (result, (t_losses, t_grads)) in enumerate(zip(gloo(plan_path), threads,
                                                              strict=True)):
        np.testing.assert_allclose(result.losses, t_losses, rtol=1e-13, atol=0,
                                   err_msg=f"loss of rank {rank}")
        assert sorted(result.grads) == sorted(t_grads)
        for param, g in t_grads.items():
            np.testing.assert_allclose(result.grads[param], g, rtol=1e-12, atol=1e-14,
                                       err_msg=f"grad({param}) of rank {rank}")


def test_negative_control_backward_allreduce(gloo: Any) -> None:
    """The comparison can fail: the bug plan's IR gradients are far from the correct plan's
    gloo gradients (w2 and everything before it: tp=2 times too large), while the bug plan's
    own gloo run agrees with its IR."""
    from trainverify_dsl.simulate.run import rel_error

    bug, bug_losses, bug_grads = ir_side(BUG_PLAN)
    twin, _, _ = ir_side(BUG_TWIN)
    # same model, same seed: the same global values, so the local pieces are comparable
    assert bug.values.keys() == twin.values.keys()
    for name, v in bug.values.items():
        np.testing.assert_array_equal(v, twin.values[name])
    correct = gloo(BUG_TWIN)
    errors = {(rank, p): rel_error(g, correct[rank].grads[p])
              for rank, acc in bug_grads.items() for p, g in acc.items()}
    worst_key = max(errors, key=errors.__getitem__)
    assert errors[worst_key] > 0.5, f"bug plan not detected: worst {worst_key} {errors}"
    # the named effect: some gradient exactly tp=2 times the correct one
    doubled = [(rank, p) for (rank, p) in errors
               if rel_error(bug_grads[rank][p], 2 * correct[rank].grads[p]) < TOL]
    assert any("feed_forward.w2" in p for _, p in doubled), doubled
    # the forward is unchanged
    for rank, result in enumerate(correct):
        want = [v for (r, _), v in sorted(bug_losses.items()) if r == rank]
        np.testing.assert_allclose(result.losses, want, rtol=TOL)
    # and the bug plan's own gloo run agrees with its IR
    compare(gloo(BUG_PLAN), bug_losses, bug_grads, f"{BUG_PLAN} gloo vs IR")
