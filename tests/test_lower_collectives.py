"""``torch.ops.tvp.collective``: eager forward and backward on a dp=2, tp=2 mesh against a numpy
transcription of docs/semantics.md §3.2 and against the IR's numpy semantics; the same local
steps under real ``torch.distributed`` (gloo) processes, also against torch's own collectives;
and AOTAutograd tracing, whose joint graph holds the backward collectives and converts to IR
that the SPMD interpreter runs to the eager results.
"""

from __future__ import annotations

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
from torch import nn

from trainverify_dsl.ir.mesh import MeshGroups
from trainverify_dsl.ir.ops import OPS
from trainverify_dsl.lower.collectives import (
    DistCommunicator,
    ThreadWorld,
    current_communicator,
    parse_axes,
    run_threads,
    use_communicator,
)

F64 = torch.float64
MESH = MeshGroups((("dp", 2), ("tp", 2)))
#: Groups of the dp=2, tp=2 mesh (rank = dp*2 + tp), written out by hand, in group order.
GROUPS: dict[tuple[str, ...], list[list[int]]] = {
    ("tp",): [[0, 1], [2, 3]],
    ("dp",): [[0, 2], [1, 3]],
    ("dp", "tp"): [[0, 1, 2, 3]],
    ("tp", "dp"): [[0, 2, 1, 3]],
}
SHAPE = (4, 8)


@dataclass(frozen=True)
class Case:
    kind: str
    op: str = "sum"
    dim: int = 0
    dim2: int = -1
    backward: str = "identity"

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.op}-{self.dim}-{self.dim2}-{self.backward}"


CASES = [
    Case("all_reduce", "sum"),
    Case("all_reduce", "avg"),
    Case("all_reduce", "max"),
    Case("all_reduce", "min"),
    Case("all_reduce", "sum", backward="all_reduce"),
    Case("all_gather", dim=1, backward="reduce_scatter"),
    Case("all_gather", dim=-2, backward="reduce_scatter"),
    Case("reduce_scatter", "sum", dim=0, backward="all_gather"),
    Case("reduce_scatter", "max", dim=1, backward="all_gather"),
    Case("all_to_all", dim=1, dim2=0, backward="all_to_all"),
    Case("all_to_all", dim=0, dim2=-1, backward="all_to_all"),
    Case("scatter", dim=1, backward="all_gather"),
    Case("identity", backward="all_reduce"),
    Case("identity", backward="identity"),
]


def _axes_id(axes: tuple[str, ...]) -> str:
    return ",".join(axes)


# --------------------------------------------------------------------------- one rank's step


def rank_input(rank: int) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(100 + rank), dtype=F64)


def local_step(rank: int, case: Case, axes: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Forward and backward of one collective on one rank (needs a current communicator)."""
    x = rank_input(rank).requires_grad_()
    n = len(GROUPS[axes][0])
    y = torch.ops.tvp.collective(x, case.kind, _axes_id(axes), n, case.op, case.dim, case.dim2,
                                 case.backward)
    gen = torch.Generator().manual_seed(200 + rank)
    cot = torch.randn(y.shape, generator=gen, dtype=F64)
    (gx,) = torch.autograd.grad(y, x, cot)
    return {"x": x.detach().numpy(), "y": y.detach().numpy(), "cot": cot.numpy(),
            "gx": gx.numpy()}


def thread_results(case: Case, axes: tuple[str, ...]) -> list[dict[str, np.ndarray]]:
    return run_threads(ThreadWorld(MESH), lambda r: local_step(r, case, axes))


# --------------------------------------------------------------------------- references


def _reduce(pieces: list[np.ndarray], op: str) -> np.ndarray:
    stacked = np.stack(pieces)
    return {"sum": stacked.sum(0), "avg": stacked.sum(0) / len(pieces),
            "max": stacked.max(0), "min": stacked.min(0)}[op]


def table(kind: str, pieces: list[np.ndarray], op: str, dim: int, dim2: int) -> list[np.ndarray]:
    """docs/semantics.md §3.2, literally: y_k for k in group order."""
    n = len(pieces)

    def blk(t: np.ndarray, k: int, d: int) -> np.ndarray:
        return np.split(t, n, axis=d)[k]

    if kind == "identity":
        return [p.copy() for p in pieces]
    if kind == "all_reduce":
        return [_reduce(pieces, op)] * n
    if kind == "all_gather":
        return [np.concatenate(pieces, axis=dim)] * n
    if kind == "reduce_scatter":
        return [blk(_reduce(pieces, op), k, dim) for k in range(n)]
    if kind == "all_to_all":
        return [np.concatenate([blk(p, k, dim) for p in pieces], axis=dim2) for k in range(n)]
    assert kind == "scatter"
    return [blk(p, k, dim) for k, p in enumerate(pieces)]


def ir_semantics(kind: str, pieces: list[np.ndarray], op: str, dim: int,
                 dim2: int) -> list[np.ndarray]:
    """The IR registry's numpy semantics (identity is no IR op: the value itself)."""
    if kind == "identity":
        return pieces
    name = "local_scatter" if kind == "scatter" else kind
    rank = pieces[0].ndim
    every = {"axis": "g", "group_size": len(pieces), "op": op, "dim": dim % rank,
             "split_dim": dim % rank, "concat_dim": dim2 % rank}
    opdef = OPS[name]
    return opdef.evaluate([(p,) for p in pieces], {a: every[a] for a in opdef.attrs})


def over_groups(fn: Any, values: list[np.ndarray], axes: tuple[str, ...], kind: str, op: str,
                dim: int, dim2: int) -> list[np.ndarray]:
    out: list[Any] = [None] * MESH.world_size
    for group in GROUPS[axes]:
        for rank, y in zip(group, fn(kind, [values[r] for r in group], op, dim, dim2),
                           strict=True):
            out[rank] = y
    return out


def expected(fn: Any, case: Case, axes: tuple[str, ...], xs: list[np.ndarray],
             cots: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(forward outputs, input cotangents) by ``fn``; the backward sums (Rule 3.2), with the
    split and concat dims swapped for an all-to-all."""
    ys = over_groups(fn, xs, axes, case.kind, case.op, case.dim, case.dim2)
    bdim, bdim2 = (case.dim2, case.dim) if case.backward == "all_to_all" else (case.dim,
                                                                                 case.dim2)
    gxs = over_groups(fn, cots, axes, case.backward, "sum", bdim, bdim2)
    return ys, gxs


# --------------------------------------------------------------------------- threads


@pytest.mark.parametrize("axes", list(GROUPS), ids=_axes_id)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_eager_threads_match_table_and_ir(case: Case, axes: tuple[str, ...]) -> None:
    results = thread_results(case, axes)
    xs = [r["x"] for r in results]
    cots = [r["cot"] for r in results]
    for fn in (table, ir_semantics):
        ys, gxs = expected(fn, case, axes, xs, cots)
        for rank, result in enumerate(results):
            np.testing.assert_allclose(result["y"], ys[rank], rtol=1e-13, atol=1e-13,
                                       err_msg=f"{fn.__name__}: forward of rank {rank}")
            np.testing.assert_allclose(result["gx"], gxs[rank], rtol=1e-13, atol=1e-13,
                                       err_msg=f"{fn.__name__}: backward of rank {rank}")


def test_group_order_matters() -> None:
    """all_gather over (dp, tp) and over (tp, dp) concatenate in different orders (Rule 1.1)."""
    a = thread_results(Case("all_gather", dim=0, backward="reduce_scatter"), ("dp", "tp"))
    b = thread_results(Case("all_gather", dim=0, backward="reduce_scatter"), ("tp", "dp"))
    xs = [rank_input(r).numpy() for r in range(4)]
    np.testing.assert_array_equal(a[0]["y"], np.concatenate([xs[0], xs[1], xs[2], xs[3]]))
    np.testing.assert_array_equal(b[0]["y"], np.concatenate([xs[0], xs[2], xs[1], xs[3]]))


def test_worked_example_3_4() -> None:
    """docs/semantics.md §3.4 (tp=2 column -> row parallel MLP), with copy and all-reduce."""
    world = ThreadWorld((("tp", 2),))
    w1_rows = [[1.0, 0.0], [1.0, 1.0]]
    w2_cols = [[1.0, 0.0], [2.0, 1.0]]

    def step(rank: int) -> tuple[float, list[float], list[float], list[float]]:
        x = torch.tensor([1.0, 2.0], dtype=F64, requires_grad=True)
        w1 = torch.tensor([w1_rows[rank]], dtype=F64, requires_grad=True)  # [1, 2]
        w2 = torch.tensor(w2_cols[rank], dtype=F64).reshape(2, 1).requires_grad_()
        xc = torch.ops.tvp.collective(x, "identity", "tp", 2, "sum", 0, -1, "all_reduce")
        z = w2 @ torch.relu(w1 @ xc)
        y = torch.ops.tvp.collective(z, "all_reduce", "tp", 2, "sum", 0, -1, "identity")
        loss = (y * y).sum() / 2
        gx, g1, g2 = torch.autograd.grad(loss, (x, w1, w2))
        return loss.item(), gx.tolist(), g1.flatten().tolist(), g2.flatten().tolist()

    r0, r1 = run_threads(world, step)
    assert r0[0] == r1[0] == 29.0
    assert r0[1] == r1[1] == [24.0, 17.0]
    assert (r0[2], r1[2]) == ([7.0, 14.0], [17.0, 34.0])
    assert (r0[3], r1[3]) == ([7.0, 3.0], [21.0, 9.0])


# --------------------------------------------------------------------------- errors


def test_shape_errors() -> None:
    x = torch.zeros(6, 3, dtype=F64)
    with pytest.raises(ValueError, match="not divisible by the group size 4"):
        torch.ops.tvp.collective(x, "reduce_scatter", "dp,tp", 4, "sum", 0, -1, "all_gather")
    with pytest.raises(ValueError, match="not divisible"):
        torch.ops.tvp.collective(x, "scatter", "tp", 4, "sum", -1, -1, "all_gather")
    with pytest.raises(ValueError, match="split dim"):
        torch.ops.tvp.collective(x, "all_to_all", "tp", 2, "sum", 2, 0, "all_to_all")
    with pytest.raises(ValueError, match="Rule 3.3"):
        torch.ops.tvp.collective(x, "all_gather", "tp", 2, "sum", 0, -1, "all_reduce")
    with pytest.raises(ValueError, match="unknown kind"):
        torch.ops.tvp.collective(x, "broadcast", "tp", 2, "sum", 0, -1, "none")
    with pytest.raises(ValueError, match="unknown reduce op"):
        torch.ops.tvp.collective(x, "all_reduce", "tp", 2, "prod", 0, -1, "identity")
    with pytest.raises(ValueError, match="bad axes"):
        torch.ops.tvp.collective(x, "all_reduce", "", 2, "sum", 0, -1, "identity")


def test_fake_shapes_and_errors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 6, dtype=F64)
        shapes = [tuple(torch.ops.tvp.collective(x, k, "tp", 2, "sum", d, d2, b).shape)
                  for k, d, d2, b in [("all_gather", -1, -1, "reduce_scatter"),
                                      ("reduce_scatter", 0, -1, "all_gather"),
                                      ("all_to_all", 1, 0, "all_to_all"),
                                      ("scatter", 1, -1, "all_gather"),
                                      ("all_reduce", 0, -1, "identity"),
                                      ("identity", 0, -1, "all_reduce")]]
        assert shapes == [(4, 12), (2, 6), (8, 3), (4, 3), (4, 6), (4, 6)]
        with pytest.raises(ValueError, match="not divisible"):
            torch.ops.tvp.collective(x, "reduce_scatter", "tp", 4, "sum", 1, -1, "all_gather")


def test_backward_none_is_not_differentiable() -> None:
    x = torch.ones(2, dtype=F64, requires_grad=True)
    y = torch.ops.tvp.collective(x, "identity", "tp", 2, "sum", 0, -1, "none")
    with pytest.raises(RuntimeError, match="backward 'none'"):
        torch.autograd.grad(y.sum(), x)


def test_identity_does_not_alias() -> None:
    x = torch.ones(3, dtype=F64)
    y = torch.ops.tvp.collective(x, "identity", "tp", 2, "sum", 0, -1, "identity")
    y.add_(1)
    assert x.tolist() == [1.0, 1.0, 1.0]


def test_needs_a_communicator() -> None:
    with pytest.raises(RuntimeError, match="needs a communicator"):
        torch.ops.tvp.collective(torch.ones(2, dtype=F64), "all_reduce", "tp", 2, "sum", 0, -1,
                                 "identity")


def test_group_size_mismatch() -> None:
    def step(rank: int) -> Any:
        return torch.ops.tvp.collective(torch.ones(4, dtype=F64), "all_reduce", "tp", 4, "sum",
                                        0, -1, "identity")

    with pytest.raises(ValueError, match="group has 2 ranks"):
        run_threads(ThreadWorld(MESH), step)


def test_failing_rank_does_not_deadlock() -> None:
    """Rank 2 fails before its collective: the others are released and rank 2's error wins."""
    def step(rank: int) -> Any:
        if rank == 2:
            raise KeyError("rank 2 failed")
        return torch.ops.tvp.collective(torch.ones(4, dtype=F64), "all_reduce", "dp,tp", 4,
                                        "sum", 0, -1, "identity")

    with pytest.raises(KeyError, match="rank 2 failed"):
        run_threads(ThreadWorld(MESH, timeout=30.0), step)


def test_communicator_is_thread_local() -> None:
    world = ThreadWorld(MESH)
    with use_communicator(world.communicators[3]):
        ranks = run_threads(world, lambda r: getattr(current_communicator(), "rank", None))
        assert ranks == [0, 1, 2, 3]
        y = torch.ops.tvp.collective(torch.arange(4.0, dtype=F64), "scatter", "dp,tp", 4,
                                     "sum", 0, -1, "all_gather")
        assert y.tolist() == [3.0]  # still rank 3's communicator in this thread


# --------------------------------------------------------------------------- AOTAutograd


class ParallelMlp(nn.Module):
    """One tp rank of §3.4, with a replicated input projection so the copy has a gradient."""

    def __init__(self, w0: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> None:
        super().__init__()
        self.w0, self.w1, self.w2 = (nn.Parameter(w.clone()) for w in (w0, w1, w2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.ops.tvp.collective(x @ self.w0, "identity", "tp", 2, "sum", 0, -1,
                                     "all_reduce")
        z = torch.relu(h @ self.w1) @ self.w2
        y = torch.ops.tvp.collective(z, "all_reduce", "tp", 2, "sum", 0, -1, "identity")
        return (y * y).sum() / 2


def _mlp_weights() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(7)
    return tuple(torch.randn(s, generator=gen, dtype=F64) for s in [(3, 4), (4, 6), (6, 4),
                                                                   (4, 6)])


def _shard(rank: int) -> tuple[torch.Tensor, ...]:
    x, w0, w1, w2 = _mlp_weights()
    return x, w0, w1.chunk(2, 1)[rank], w2.chunk(2, 0)[rank]


def _collective_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and n.target is torch.ops.tvp.collective.default]


def _depends_on(node: torch.fx.Node, source: torch.fx.Node) -> bool:
    """Whether ``source`` is ``node`` or one of its ancestors."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n is source:
            return True
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return False


def test_aot_export_module_joint_has_backward_collectives() -> None:
    from torch._functorch.aot_autograd import aot_export_module

    class AsTuple(nn.Module):  # aot_export_module wants tuple outputs
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (self.inner(x),)

    # On real tensors aot_export_module re-traces the joint with make_fx in "real" mode,
    # which runs the eager kernel (and so would need the other ranks): trace on fake tensors.
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    x, w0, w1, w2 = (mode.from_tensor(t) for t in _shard(0))
    gm, _ = aot_export_module(AsTuple(ParallelMlp(w0, w1, w2)), (x,), trace_joint=True,
                              output_loss_index=0)
    loss = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    kinds = [(n.args[1], n.args[7], _depends_on(n, loss)) for n in _collective_nodes(gm)]
    # forward: copy, all-reduce; backward (seeded from the loss, so downstream of it): the
    # all-reduce's identity, then the copy's all-reduce, both with backward "none"
    assert sorted(kinds) == sorted([("identity", "all_reduce", False),
                                    ("all_reduce", "identity", False),
                                    ("identity", "none", True), ("all_reduce", "none", True)])


def test_joint_converts_to_ir_and_runs_like_eager() -> None:
    """The repo's own tracing (``aot_export_joint_with_descriptors``) and FX import: the IR,
    run by the SPMD interpreter, gives the eager threaded loss and gradients, which are the
    single-device spec's (sharded)."""
    from trainverify_dsl.ir.interp import evaluate_spmd
    from trainverify_dsl.ir.verify import verify_graph
    from trainverify_dsl.spec.fx_import import import_joint
    from trainverify_dsl.spec.trace import _joint, _outer_namer, _outer_output

    x, w0, w1, w2 = _shard(0)
    gm = _joint(ParallelMlp(w0, w1, w2), (x,), returns_loss=True)
    assert sorted(n.args[1] for n in _collective_nodes(gm)) == ["all_reduce", "all_reduce",
                                                                 "identity", "identity"]
    graph = import_joint(gm, _outer_namer(["x"], {}), _outer_output({}))
    verify_graph(graph, allow_collectives=True)
    assert sorted(n.op for n in graph.nodes if OPS[n.op].collective) == ["all_reduce",
                                                                         "all_reduce"]
    tp = MeshGroups((("tp", 2),))
    inputs = []
    for rank in range(2):
        xr, w0r, w1r, w2r = _shard(rank)
        inputs.append({"x": xr.numpy(), "w0": w0r.numpy(), "w1": w1r.numpy(),
                       "w2": w2r.numpy()})
    ir = evaluate_spmd(graph, inputs, groups=lambda axis: tp.groups(parse_axes(axis)))

    def eager(rank: int) -> list[np.ndarray]:
        xr, *ws = _shard(rank)
        model = ParallelMlp(*ws)
        loss = model(xr)
        grads = torch.autograd.grad(loss, [model.w0, model.w1, model.w2])
        return [loss.detach().numpy()] + [g.numpy() for g in grads]

    eager_results = run_threads(ThreadWorld(tp), eager)
    x, w0, w1, w2 = (t.requires_grad_() for t in _mlp_weights())
    spec_loss = ((torch.relu(x @ w0 @ w1) @ w2) ** 2).sum() / 2
    spec = torch.autograd.grad(spec_loss, [w0, w1, w2])
    for rank in range(2):
        got = [ir[rank][k] for k in ("loss", "grad(w0)", "grad(w1)", "grad(w2)")]
        want = [spec_loss.detach().numpy(), spec[0].numpy(), spec[1].chunk(2, 1)[rank].numpy(),
                spec[2].chunk(2, 0)[rank].numpy()]
        for g, e, w in zip(got, eager_results[rank], want, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- torch.distributed

ALL_AXES = list(GROUPS)
#: Axis lists whose group order is ascending global rank (= torch.distributed's group order).
SORTED_AXES = [axes for axes, groups in GROUPS.items() if all(g == sorted(g) for g in groups)]


def _key(case: Case, axes: tuple[str, ...], what: str) -> str:
    return f"{case.id}|{_axes_id(axes)}|{what}"


def _native(rank: int, comm: DistCommunicator, axes: tuple[str, ...]) -> dict[str, np.ndarray]:
    """torch.distributed's own collectives on this rank's input, and ours beside them."""
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn

    members, group = comm.process_group(axes)
    n, a = len(members), _axes_id(axes)
    out: dict[str, np.ndarray] = {}
    x = rank_input(rank)
    cot = torch.randn(SHAPE, generator=torch.Generator().manual_seed(300 + rank), dtype=F64)

    xt = x.clone().requires_grad_()
    theirs = dnn.all_reduce(xt, group=group)
    (their_grad,) = torch.autograd.grad(theirs, xt, cot)
    xo = x.clone().requires_grad_()
    ours = torch.ops.tvp.collective(xo, "all_reduce", a, n, "sum", 0, -1, "all_reduce")
    (our_grad,) = torch.autograd.grad(ours, xo, cot)
    out |= {"all_reduce|theirs": theirs.detach().numpy(),
            "all_reduce|ours": ours.detach().numpy(),
            "all_reduce_grad|theirs": their_grad.numpy(), "all_reduce_grad|ours":
            our_grad.numpy()}

    pieces = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(pieces, x, group=group)
    out["all_gather|theirs"] = torch.cat(pieces, 1).numpy()
    out["all_gather|ours"] = torch.ops.tvp.collective(x, "all_gather", a, n, "sum", 1, -1,
                                                      "none").numpy()
    into = torch.empty(n * SHAPE[0], SHAPE[1], dtype=F64)
    dist.all_gather_into_tensor(into, x, group=group)
    out["all_gather_into_tensor|theirs"] = into.numpy()
    out["all_gather_into_tensor|ours"] = torch.ops.tvp.collective(
        x, "all_gather", a, n, "sum", 0, -1, "none").numpy()

    out["reduce_scatter|ours"] = torch.ops.tvp.collective(x, "reduce_scatter", a, n, "sum", 1,
                                                          -1, "none").numpy()
    try:
        piece = torch.empty(SHAPE[0], SHAPE[1] // n, dtype=F64)
        dist.reduce_scatter(piece, [c.contiguous() for c in x.chunk(n, 1)], group=group)
        out["reduce_scatter|theirs"] = piece.numpy()
    except (RuntimeError, NotImplementedError, ValueError) as error:
        out["reduce_scatter|unsupported"] = np.array(str(error).splitlines()[0])

    out["all_to_all|ours"] = torch.ops.tvp.collective(x, "all_to_all", a, n, "sum", 1, 0,
                                                      "none").numpy()
    try:
        received = [torch.empty(SHAPE[0], SHAPE[1] // n, dtype=F64) for _ in range(n)]
        dist.all_to_all(received, [c.contiguous() for c in x.chunk(n, 1)], group=group)
        out["all_to_all|theirs"] = torch.cat(received, 0).numpy()
    except (RuntimeError, NotImplementedError, ValueError) as error:
        out["all_to_all|unsupported"] = np.array(str(error).splitlines()[0])
    return out


def dist_worker(rank: int, world_size: int, store_file: str, out_dir: str) -> None:
    """Entry point of one gloo process: every case on every axis list, and the native ops."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank,
                            world_size=world_size)
    try:
        comm = DistCommunicator(MESH, ALL_AXES)
        results: dict[str, np.ndarray] = {}
        with use_communicator(comm):
            for case in CASES:
                for axes in ALL_AXES:
                    for what, value in local_step(rank, case, axes).items():
                        results[_key(case, axes, what)] = value
            for axes in SORTED_AXES:
                for name, value in _native(rank, comm, axes).items():
                    results[f"native|{_axes_id(axes)}|{name}"] = value
        dist.barrier()
    finally:
        dist.destroy_process_group()
    np.savez(Path(out_dir) / f"rank{rank}.npz", **results)


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, np.ndarray]]:
    """Run ``dist_worker`` in 4 gloo processes; their results, by rank."""
    tmp = tmp_path_factory.mktemp("gloo")
    tests_dir = Path(__file__).resolve().parent
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(tests_dir.parent), str(tests_dir),
                                           os.environ.get("PYTHONPATH", "")]))
    code = textwrap.dedent(f"""
        import sys
        from test_lower_collectives import dist_worker
        dist_worker(int(sys.argv[1]), 4, {str(tmp / 'store')!r}, {str(tmp)!r})
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(4)]
    failures = []
    for rank, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(f"gloo rank {rank} timed out")
        if proc.returncode:
            failures.append(f"rank {rank} exited {proc.returncode}:\n{err[-3000:]}")
    assert not failures, "\n".join(failures)
    out = []
    for rank in range(4):
        with np.load(tmp / f"rank{rank}.npz") as data:
            out.append({k: data[k] for k in data.files})
    return out


def test_gloo_matches_threads(gloo: list[dict[str, np.ndarray]]) -> None:
    for case in CASES:
        for axes in ALL_AXES:
            threads = thread_results(case, axes)
            for rank in range(4):
                for what in ("x", "cot", "y", "gx"):
                    np.testing.assert_allclose(
                        gloo[rank][_key(case, axes, what)], threads[rank][what], rtol=1e-13,
                        atol=1e-13, err_msg=f"{case.id} over {axes}: {what} of rank {rank}")


@pytest.mark.parametrize("name", ["all_reduce", "all_reduce_grad", "all_gather",
                                  "all_gather_into_tensor", "reduce_scatter", "all_to_all"])
def test_gloo_matches_torch_distributed(gloo: list[dict[str, np.ndarray]], name: str) -> None:
    """Ours against torch.distributed's (all_reduce via torch.distributed.nn, whose backward
    all-reduces: our backward="all_reduce")."""
    for axes in SORTED_AXES:
        prefix = f"native|{_axes_id(axes)}|{name}"
        for rank in range(4):
            if f"{prefix}|unsupported" in gloo[rank]:
                pytest.skip(f"gloo does not support {name}: "
                            f"{gloo[rank][prefix + '|unsupported']}")
            np.testing.assert_allclose(gloo[rank][f"{prefix}|ours"],
                                       gloo[rank][f"{prefix}|theirs"], rtol=1e-13, atol=1e-13,
                                       err_msg=f"{name} over {axes}, rank {rank}")
