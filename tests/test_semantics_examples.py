"""The worked examples of docs/semantics.md, executed, so the document cannot drift from arithmetic.

Ranks are simulated as plain Python lists of float64 tensors (no processes). A collective is one
autograd function over the list of its group's pieces, with the forward and backward local
operations that docs/semantics.md §3 gives it; every device's local program is ordinary torch
code, so torch's autograd plays the role of "each device's local backward". Each test compares a
plan's values with the spec's (torch autograd on the single-device function) and, where the
document names a bug, shows that the bug changes the result by the factor the document states.

The last section runs the same statements through the product (its collective op with every
rank a thread, its default backwards, rank order, groups and block distribution) and asserts
the document's values exactly: the document, this file and the package cannot drift apart.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from stdlib.models.common import RMSNorm, apply_rope, causal_attention, lm_loss, rope_tables

F64 = torch.float64
TIGHT = {"rtol": 1e-12, "atol": 1e-12}


@pytest.fixture(autouse=True)
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(previous)


# --------------------------------------------------------------------------- §1 mesh and ranks


def rank_of(coords: dict[str, int], mesh: dict[str, int]) -> int:
    """Row-major rank over the mesh axes, first axis outermost."""
    rank = 0
    for axis, size in mesh.items():
        rank = rank * size + coords[axis]
    return rank


def coords_of(rank: int, mesh: dict[str, int]) -> dict[str, int]:
    coords = {}
    for axis, size in reversed(mesh.items()):
        coords[axis] = rank % size
        rank //= size
    return {axis: coords[axis] for axis in mesh}


def block_index(coords: dict[str, int], axes: tuple[str, ...], mesh: dict[str, int]) -> int:
    """Index of a rank inside its group along `axes`: row-major over `axes` as written."""
    index = 0
    for axis in axes:
        index = index * mesh[axis] + coords[axis]
    return index


def group(rank: int, axes: tuple[str, ...], mesh: dict[str, int]) -> list[int]:
    """The ranks that differ from `rank` only in `axes`, ordered by their block index."""
    mine = coords_of(rank, mesh)
    members = [
        r
        for r in range(math.prod(mesh.values()))
        if all(coords_of(r, mesh)[a] == mine[a] for a in mesh if a not in axes)
    ]
    return sorted(members, key=lambda r: block_index(coords_of(r, mesh), axes, mesh))


MESH_3D = {"pp": 2, "dp": 2, "tp": 2}


def test_rank_order_and_groups():
    assert rank_of({"pp": 1, "dp": 0, "tp": 1}, MESH_3D) == 5  # 1*4 + 0*2 + 1
    assert coords_of(6, MESH_3D) == {"pp": 1, "dp": 1, "tp": 0}
    assert group(5, ("tp",), MESH_3D) == [4, 5]
    assert group(5, ("dp",), MESH_3D) == [5, 7]
    assert group(5, ("dp", "tp"), MESH_3D) == [4, 5, 6, 7]
    assert group(5, ("tp", "dp"), MESH_3D) == [4, 6, 5, 7]  # the written order is the order
    assert group(2, ("pp",), MESH_3D) == [2, 6]


# --------------------------------------------------------------------------- §2 layouts


def shard_piece(full: torch.Tensor, dim: int, index: int, count: int) -> torch.Tensor:
    size = full.shape[dim]
    assert size % count == 0, "split sizes must divide"
    block = size // count
    return full.narrow(dim, index * block, block)


def test_shard_block_index_several_axes_on_one_dim():
    mesh = {"dp": 2, "ep": 2}
    tokens = torch.arange(8.0).reshape(8, 1)  # 8 sequences of length 1
    pieces = {}
    for rank in range(4):
        c = coords_of(rank, mesh)
        k = block_index(c, ("dp", "ep"), mesh)  # split tokens [(dp, ep), -]
        pieces[rank] = shard_piece(tokens, 0, k, 4)
    # rank (dp=1, ep=0) = rank 2 has block 1*2 + 0 = 2: rows 4, 5
    assert pieces[2].flatten().tolist() == [4.0, 5.0]
    assert pieces[1].flatten().tolist() == [2.0, 3.0]
    rebuilt = torch.cat(
        [
            pieces[r]
            for r in sorted(
                pieces, key=lambda r: block_index(coords_of(r, mesh), ("dp", "ep"), mesh)
            )
        ]
    )
    assert torch.equal(rebuilt, tokens)
    # [(ep, dp), -] is another layout: rank 1 (dp=0, ep=1) now holds block 1*2 + 0 = 2
    assert shard_piece(
        tokens, 0, block_index(coords_of(1, mesh), ("ep", "dp"), mesh), 4
    ).flatten().tolist() == [4.0, 5.0]


def test_partial_reconstruction():
    pieces = [torch.tensor([1.0, -2.0]), torch.tensor([3.0, 5.0])]
    assert torch.equal(pieces[0] + pieces[1], torch.tensor([4.0, 3.0]))  # Partial(sum)
    assert torch.equal((pieces[0] + pieces[1]) / 2, torch.tensor([2.0, 1.5]))  # Partial(avg)
    assert torch.equal(torch.maximum(*pieces), torch.tensor([3.0, 5.0]))  # Partial(max)
    assert torch.equal(torch.minimum(*pieces), torch.tensor([1.0, -2.0]))  # Partial(min)


# --------------------------------------------------------------------------- §3 collectives


def _reduce(op: str, xs: list[torch.Tensor]) -> torch.Tensor:
    if op == "sum":
        return functools.reduce(torch.add, xs)
    if op == "avg":
        return functools.reduce(torch.add, xs) / len(xs)
    if op == "max":
        return functools.reduce(torch.maximum, xs)
    if op == "min":
        return functools.reduce(torch.minimum, xs)
    raise ValueError(op)


def all_reduce(xs, op="sum"):
    total = _reduce(op, xs)
    return [total.clone() for _ in xs]


def all_gather(xs, dim):
    return [torch.cat(xs, dim) for _ in xs]


def reduce_scatter(xs, dim, op="sum"):
    return [piece.clone() for piece in _reduce(op, xs).chunk(len(xs), dim)]


def all_to_all(xs, split_dim, concat_dim):
    n = len(xs)
    return [torch.cat([x.chunk(n, split_dim)[k] for x in xs], concat_dim) for k in range(n)]


def identity(xs):
    return [x.clone() for x in xs]


def scatter(xs, dim):
    return [x.chunk(len(xs), dim)[k].clone() for k, x in enumerate(xs)]


class _Collective(torch.autograd.Function):
    """Forward and backward as list functions over the group's pieces (in group order)."""

    @staticmethod
    def forward(ctx, fwd, bwd, *xs):
        ctx.bwd = bwd
        return tuple(fwd(list(xs)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *ctx.bwd(list(grads)))


DEFAULT_BACKWARD = {
    "all-reduce": "identity",
    "copy": "all-reduce",
    "all-gather": "reduce-scatter",
    "reduce-scatter": "all-gather",
    "all-to-all": "all-to-all",
    "scatter": "all-gather",
}


def collective(kind, xs, *, op="sum", dim=None, split_dim=None, concat_dim=None, backward=None):
    """One collective statement of docs/language.md over one group (xs in group order)."""
    forward = {
        "all-reduce": lambda ys: all_reduce(ys, op),
        "all-gather": lambda ys: all_gather(ys, dim),
        "reduce-scatter": lambda ys: reduce_scatter(ys, dim, op),
        "all-to-all": lambda ys: all_to_all(ys, split_dim, concat_dim),
        "copy": identity,
        "scatter": lambda ys: scatter(ys, dim),
    }[kind]
    # Backward collectives always combine with sum; dims come from the forward statement, and
    # the all-to-all backward swaps its split and concat dims (the inverse exchange).
    back = {
        "identity": identity,
        "all-reduce": lambda gs: all_reduce(gs, "sum"),
        "all-gather": lambda gs: all_gather(gs, dim),
        "reduce-scatter": lambda gs: reduce_scatter(gs, dim, "sum"),
        "all-to-all": lambda gs: all_to_all(gs, concat_dim, split_dim),
        "scatter": lambda gs: scatter(gs, dim),
    }[backward or DEFAULT_BACKWARD[kind]]
    return list(_Collective.apply(forward, back, *xs))


def test_all_to_all_backward_is_the_inverse_exchange():
    xs = [torch.randn(4, 2, requires_grad=True) for _ in range(2)]
    ys = collective("all-to-all", xs, split_dim=0, concat_dim=1)
    assert ys[0].shape == (2, 4)
    assert torch.equal(ys[1][:, 2:], xs[1][2:].detach())  # block 1 of rank 1 stays on rank 1
    weights = [torch.randn(2, 4) for _ in range(2)]
    torch.autograd.backward(ys, weights)
    back = all_to_all(weights, 1, 0)
    for x, g in zip(xs, back, strict=True):
        assert torch.equal(x.grad, g)  # the adjoint of a permutation is its inverse


# --------------------------------------------------------------------------- §3 tp=2 MLP


def megatron_mlp_tp2(x, w1, w2, out_backward=None, copy_backward=None):
    """Column-parallel w1 [f, h] split [tp, -], row-parallel w2 [h, f] split [-, tp], ReLU.

    Returns the per-rank leaves and the per-rank loss copies (loss = 0.5 * |y|^2, replicated).
    """
    w1_pieces = [p.detach().clone().requires_grad_() for p in w1.chunk(2, 0)]
    w2_pieces = [p.detach().clone().requires_grad_() for p in w2.chunk(2, 1)]
    x_copies = [x.detach().clone().requires_grad_() for _ in range(2)]  # replicated input
    xin = collective("copy", x_copies, backward=copy_backward)
    hidden = [F.relu(xin[r] @ w1_pieces[r].T) for r in range(2)]
    partial = [hidden[r] @ w2_pieces[r].T for r in range(2)]
    y = collective("all-reduce", partial, backward=out_backward)
    losses = [0.5 * (y[r] * y[r]).sum() for r in range(2)]
    torch.autograd.backward(losses, [torch.tensor(1.0)] * 2)  # seed 1 on every copy
    return x_copies, w1_pieces, w2_pieces, losses


def spec_mlp(x, w1, w2):
    x, w1, w2 = (t.detach().clone().requires_grad_() for t in (x, w1, w2))
    y = F.relu(x @ w1.T) @ w2.T
    loss = 0.5 * (y * y).sum()
    loss.backward()
    return loss, x.grad, w1.grad, w2.grad


def test_megatron_mlp_worked_numbers():
    x = torch.tensor([[1.0, 2.0]])
    w1 = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    w2 = torch.tensor([[1.0, 2.0], [0.0, 1.0]])
    loss, gx, gw1, gw2 = spec_mlp(x, w1, w2)
    assert loss.item() == 29.0
    assert gx.tolist() == [[24.0, 17.0]]
    assert gw1.tolist() == [[7.0, 14.0], [17.0, 34.0]]
    assert gw2.tolist() == [[7.0, 21.0], [3.0, 9.0]]
    xs, w1s, w2s, losses = megatron_mlp_tp2(x, w1, w2)
    assert [loss.item() for loss in losses] == [29.0, 29.0]
    assert xs[0].grad.tolist() == [[24.0, 17.0]] == xs[1].grad.tolist()
    assert torch.cat([w.grad for w in w1s], 0).tolist() == gw1.tolist()
    assert torch.cat([w.grad for w in w2s], 1).tolist() == gw2.tolist()
    # `all-reduce ... backward all-reduce`: every gradient before the all-reduce doubles
    xs, w1s, w2s, _ = megatron_mlp_tp2(x, w1, w2, out_backward="all-reduce")
    assert xs[0].grad.tolist() == [[48.0, 34.0]]
    assert torch.cat([w.grad for w in w2s], 1).tolist() == [[14.0, 42.0], [6.0, 18.0]]


def test_megatron_mlp_defaults_match_autograd_and_backward_allreduce_is_tp_times():
    x, w1, w2 = torch.randn(3, 4), torch.randn(6, 4), torch.randn(4, 6)
    loss, gx, gw1, gw2 = spec_mlp(x, w1, w2)
    xs, w1s, w2s, losses = megatron_mlp_tp2(x, w1, w2)
    for r in range(2):
        torch.testing.assert_close(losses[r], loss, **TIGHT)
        torch.testing.assert_close(xs[r].grad, gx, **TIGHT)
        torch.testing.assert_close(w1s[r].grad, gw1.chunk(2, 0)[r], **TIGHT)
        torch.testing.assert_close(w2s[r].grad, gw2.chunk(2, 1)[r], **TIGHT)
    xs, w1s, w2s, _ = megatron_mlp_tp2(x, w1, w2, out_backward="all-reduce")
    for r in range(2):
        torch.testing.assert_close(xs[r].grad, 2 * gx, **TIGHT)
        torch.testing.assert_close(w1s[r].grad, 2 * gw1.chunk(2, 0)[r], **TIGHT)
        torch.testing.assert_close(w2s[r].grad, 2 * gw2.chunk(2, 1)[r], **TIGHT)
    # a missing copy (identity backward): each rank's input gradient is only its partial share
    xs, _, _, _ = megatron_mlp_tp2(x, w1, w2, copy_backward="identity")
    torch.testing.assert_close(xs[0].grad + xs[1].grad, gx, **TIGHT)
    assert not torch.allclose(xs[0].grad, gx)


# --------------------------------------------------------------------------- §4 microbatches, dp


def test_global_batch_index_of_a_microbatch():
    batch, dp, mb = 8, 2, 2
    rows = torch.arange(batch)
    for m in range(mb):
        micro = rows.chunk(mb)[m]  # microbatches first (Megatron's sampler), then split [dp, -]
        for d in range(dp):
            local = micro.chunk(dp)[d]
            expected = [m * (batch // mb) + d * (batch // (dp * mb)) + i for i in range(2)]
            assert local.tolist() == expected


def test_linear_worked_example_loss_scaling():
    x = torch.arange(1.0, 9.0)  # loss = mean_b(w * x_b), w = 1: d loss / d w = mean(x) = 4.5
    local = {
        (d, m): x[m * 4 + d * 2 : m * 4 + d * 2 + 2].mean() for d in range(2) for m in range(2)
    }
    assert [local[k].item() for k in sorted(local)] == [1.5, 5.5, 3.5, 7.5]

    def synced(scale, op):
        acc = [scale * (local[(d, 0)] + local[(d, 1)]) for d in range(2)]
        return (acc[0] + acc[1]) / (2 if op == "avg" else 1)

    assert synced(1 / 2, "avg").item() == 4.5  # correct
    assert synced(1, "avg").item() == 9.0  # no loss scale: x mb
    assert synced(1 / 4, "avg").item() == 2.25  # scaled twice: / mb
    assert synced(1 / 2, "sum").item() == 9.0  # sum where avg is needed: x dp
    assert synced(1 / 4, "sum").item() == 4.5  # sum with loss-scale 1/(dp*mb): correct
    assert sum(local.values()).item() / 4 == 4.5  # the logical loss: mean of local losses


def mlp_params():
    return [torch.randn(8, 4), torch.randn(8), torch.randn(3, 8), torch.randn(3)]


def mlp_loss(params, x, target):
    w1, b1, w2, b2 = params
    error = F.relu(x @ w1.T + b1) @ w2.T + b2 - target
    return (error * error).mean()


def dp_mb_step(params, x, target, *, dp, mb, scale, op):
    """Returns the logical loss and the synchronised gradients (identical on every dp rank)."""
    rows = x.shape[0] // (dp * mb)
    grads, losses = [], []
    for d in range(dp):
        local = [p.detach().clone().requires_grad_() for p in params]  # replicated params
        for m in range(mb):
            start = m * (x.shape[0] // mb) + d * rows
            loss = mlp_loss(local, x[start : start + rows], target[start : start + rows])
            loss.backward(torch.tensor(scale))  # accumulates into .grad
            losses.append(loss.detach())
        grads.append([p.grad for p in local])
    synced = [all_reduce([grads[d][i] for d in range(dp)], op)[0] for i in range(len(params))]
    return sum(losses) / len(losses), synced


def test_mlp_dp_microbatch_loss_scaling():
    params, x, target = mlp_params(), torch.randn(8, 4), torch.randn(8, 3)
    spec = [p.clone().requires_grad_() for p in params]
    spec_loss = mlp_loss(spec, x, target)
    spec_loss.backward()
    cases = {  # (loss-scale, dp op) -> factor of the spec gradient
        (1 / 2, "avg"): 1.0,
        (1.0, "avg"): 2.0,  # loss not scaled
        (1 / 4, "avg"): 0.5,  # scaled twice
        (1 / 2, "sum"): 2.0,  # sum instead of avg
        (1 / 4, "sum"): 1.0,  # sum with loss-scale 1/(dp*microbatches)
    }
    for (scale, op), factor in cases.items():
        loss, grads = dp_mb_step(params, x, target, dp=2, mb=2, scale=scale, op=op)
        torch.testing.assert_close(loss, spec_loss.detach(), **TIGHT)
        for got, p in zip(grads, spec, strict=True):
            torch.testing.assert_close(got, factor * p.grad, **TIGHT)


# --------------------------------------------------------------------------- §5 pipeline


def test_pipeline_transfers_and_a_send_to_the_wrong_stage():
    blocks = [torch.randn(3, 3) for _ in range(3)]  # layers.i: h -> tanh(h @ W_i)
    h0 = torch.randn(2, 3)
    spec = h0
    for w in blocks:
        spec = torch.tanh(spec @ w)
    # implied transfers: stage i receives layers.(i-1).out
    received = {0: h0}
    for stage, w in enumerate(blocks):
        out = torch.tanh(received[stage] @ w)
        received[stage + 1] = out
    torch.testing.assert_close(received[3], spec, **TIGHT)
    # `send layers.0.out from 0 to 2`: stage 2 binds layers.0.out as its boundary input, stage 1's
    # boundary input is unconstrained (any value: here a random one)
    out0 = torch.tanh(h0 @ blocks[0])
    torch.tanh(torch.randn(2, 3) @ blocks[1])  # stage 1 runs on a free value; nobody reads it
    wrong = torch.tanh(out0 @ blocks[2])
    assert not torch.allclose(wrong, spec)


def test_schedules_only_reorder_a_sum():
    grads = [torch.randn(5) for _ in range(4)]  # per-microbatch gradients of one stage
    gpipe = grads[0] + grads[1] + grads[2] + grads[3]
    other = grads[2] + grads[0] + grads[3] + grads[1]
    torch.testing.assert_close(gpipe, other, **TIGHT)  # equal over the reals, here up to rounding


# --------------------------------------------------------------------------- §6 optimizer


def sgd_step(p, g, buf, *, lr, momentum=0.0, weight_decay=0.0):
    g = g + weight_decay * p
    if momentum:
        buf = momentum * buf + g
        g = buf
    return p - lr * g, buf


def adam_step(p, g, m, v, t, *, lr, betas, eps, weight_decay, decoupled):
    b1, b2 = betas
    if decoupled:
        p = p * (1 - lr * weight_decay)
    else:
        g = g + weight_decay * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat = m / (1 - b1**t)
    v_hat = v / (1 - b2**t)
    return p - lr * m_hat / (torch.sqrt(v_hat) + eps), m, v


def test_update_equations_match_torch_optim():
    p0, grads = torch.randn(4, 6), [torch.randn(4, 6) for _ in range(2)]
    for name, kwargs in [
        ("sgd", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
        ("adam", {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}),
        ("adamw", {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}),
    ]:
        param = p0.clone().requires_grad_()
        optim = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[
            name
        ]([param], **kwargs)
        p, s1, s2 = p0.clone(), torch.zeros(4, 6), torch.zeros(4, 6)
        for t, g in enumerate(grads, start=1):
            param.grad = g.clone()
            optim.step()
            if name == "sgd":
                p, s1 = sgd_step(p, g, s1, **kwargs)
            else:
                p, s1, s2 = adam_step(p, g, s1, s2, t, decoupled=name == "adamw", **kwargs)
        torch.testing.assert_close(param.detach(), p, **TIGHT)


def test_zero1_block_update_equals_full_update():
    """W [8, 6] split [tp, -] (tp=2), AdamW sharded over dp=2: dim 0 over (tp, dp)."""
    mesh = {"dp": 2, "tp": 2}
    kw = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "decoupled": True}
    w, g, m, v = torch.randn(8, 6), torch.randn(8, 6), torch.randn(8, 6), torch.rand(8, 6)
    full_p, full_m, full_v = adam_step(w, g, m, v, 3, **kw)
    gathered = {}
    for rank in range(4):
        c = coords_of(rank, mesh)
        tp_piece = lambda t, c=c: shard_piece(t, 0, c["tp"], 2)  # noqa: E731  the tp layout
        k = block_index(c, ("tp", "dp"), mesh)  # ZeRO layout: dim 0 over (tp, dp), rows 2k, 2k+1
        assert torch.equal(shard_piece(tp_piece(w), 0, c["dp"], 2), shard_piece(w, 0, k, 4))
        blk = [shard_piece(tp_piece(t), 0, c["dp"], 2) for t in (w, g, m, v)]
        new_p, new_m, new_v = adam_step(*blk, 3, **kw)
        torch.testing.assert_close(new_m, shard_piece(full_m, 0, k, 4), **TIGHT)
        torch.testing.assert_close(new_v, shard_piece(full_v, 0, k, 4), **TIGHT)
        gathered[rank] = new_p
    for rank in range(4):  # all-gather over dp along dim 0 -> the tp piece of the new W
        tp_rank = coords_of(rank, mesh)["tp"]
        pieces = [gathered[r] for r in group(rank, ("dp",), mesh)]
        torch.testing.assert_close(
            torch.cat(pieces, 0), shard_piece(full_p, 0, tp_rank, 2), **TIGHT
        )
        # gathering in the wrong rank order gives a different parameter
        assert not torch.allclose(torch.cat(pieces[::-1], 0), shard_piece(full_p, 0, tp_rank, 2))


# --------------------------------------------------------------------------- §7 algorithms


def test_vocab_parallel_embedding():
    vocab, hidden, tp = 6, 3, 2
    table = torch.randn(vocab, hidden)
    ids = torch.tensor([[0, 5, 3, 2]])
    spec_w = table.clone().requires_grad_()
    spec_out = F.embedding(ids, spec_w)
    cot = torch.randn(*spec_out.shape)
    spec_out.backward(cot)
    pieces = [p.clone().requires_grad_() for p in table.chunk(tp, 0)]
    local = []
    for r, w in enumerate(pieces):
        start, end = r * vocab // tp, (r + 1) * vocab // tp
        masked = (ids < start) | (ids >= end)
        rows = F.embedding(torch.where(masked, 0, ids - start), w)
        local.append(rows.masked_fill(masked.unsqueeze(-1), 0.0))  # Partial(sum) over tp
    out = collective("all-reduce", local)
    for r in range(tp):
        torch.testing.assert_close(out[r], spec_out, **TIGHT)
    torch.autograd.backward(out, [cot] * tp)  # replicated cotangent, identity backward
    torch.testing.assert_close(torch.cat([p.grad for p in pieces]), spec_w.grad, **TIGHT)


def vocab_parallel_ce(logit_pieces, labels, *, detach_max=True, sum_backward=None):
    """Megatron's vocab-parallel cross-entropy over one tp group; returns the loss copies."""
    tp, width = len(logit_pieces), logit_pieces[0].shape[-1]
    local_max = [z.amax(-1) for z in logit_pieces]
    if detach_max:
        local_max = [mx.detach() for mx in local_max]
    gmax = collective("all-reduce", local_max, op="max")
    sum_exp = [torch.exp(z - gmax[r].unsqueeze(-1)).sum(-1) for r, z in enumerate(logit_pieces)]
    total = collective("all-reduce", sum_exp, backward=sum_backward)
    target = []
    for r, z in enumerate(logit_pieces):
        owned = (labels >= r * width) & (labels < (r + 1) * width)
        local_label = torch.where(owned, labels - r * width, 0)
        picked = torch.gather(z, -1, local_label.unsqueeze(-1)).squeeze(-1)
        target.append(torch.where(owned, picked, 0.0))
    tgt = collective("all-reduce", target)
    return [(torch.log(total[r]) + gmax[r] - tgt[r]).mean() for r in range(tp)]


def test_vocab_parallel_cross_entropy_worked_numbers():
    z = torch.tensor([[1.0, 2.0, 0.0, 3.0]])
    labels = torch.tensor([2])
    pieces = [p.clone().requires_grad_() for p in z.chunk(2, -1)]
    losses = vocab_parallel_ce(pieces, labels)
    expected = F.cross_entropy(z, labels)
    assert abs(expected.item() - 3.4401896985611953) < 1e-12
    for loss in losses:
        torch.testing.assert_close(loss, expected, **TIGHT)


def test_vocab_parallel_cross_entropy_matches_torch_and_the_spec_loss():
    logits, labels = torch.randn(2, 5, 8) * 3, torch.randint(0, 8, (2, 5))
    spec = logits.clone().requires_grad_()
    spec_loss = lm_loss(spec, labels)
    spec_loss.backward()
    torch.testing.assert_close(
        spec_loss, F.cross_entropy(logits.reshape(10, 8), labels.reshape(10)), **TIGHT
    )

    def run(**kwargs):
        pieces = [p.clone().requires_grad_() for p in logits.chunk(2, -1)]
        losses = vocab_parallel_ce(pieces, labels, **kwargs)
        torch.autograd.backward(losses, [torch.tensor(1.0)] * 2)
        return losses, torch.cat([p.grad for p in pieces], -1)

    losses, grad = run()
    for loss in losses:
        torch.testing.assert_close(loss, spec_loss, **TIGHT)
    torch.testing.assert_close(grad, spec.grad, **TIGHT)
    # the sum of exponentials all-reduced with an all-reduce backward: softmax part x tp
    _, wrong = run(sum_backward="all-reduce")
    assert not torch.allclose(wrong, spec.grad)
    # the max not detached: its identity backward leaks a local, non-zero cotangent
    _, leaky = run(detach_max=False)
    assert not torch.allclose(leaky, spec.grad)


def test_sequence_parallel_rmsnorm_weight_gradient_is_partial():
    norm = RMSNorm(2, eps=0.0)
    x = torch.tensor([[1.0, 1.0], [3.0, -3.0]])  # tokens 0 (tp rank 0) and 1 (tp rank 1)
    cot = torch.tensor([[2.0, 1.0], [1.0, 1.0]])
    norm(x).backward(cot)
    assert norm.weight.grad.tolist() == [3.0, 0.0]
    local = []
    for r in range(2):
        piece = RMSNorm(2, eps=0.0)
        piece(x[r : r + 1]).backward(cot[r : r + 1])
        local.append(piece.weight.grad)
    assert [g.tolist() for g in local] == [[2.0, 1.0], [1.0, -1.0]]  # Partial(sum) over tp
    assert all_reduce(local)[0].tolist() == [3.0, 0.0]  # `apply sp_norm(...)`


def test_context_parallel_attention_with_global_positions():
    b, h, s, d, cp = 1, 2, 8, 4, 2
    cos, sin = rope_tables(d, 32, 10000.0)
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    cot = torch.randn(b, h, s, d)
    sq, sk, sv = (t.clone().requires_grad_() for t in (q, k, v))
    spec = causal_attention(
        apply_rope(sq, cos[:s], sin[:s]), apply_rope(sk, cos[:s], sin[:s]), sv, 0.5
    )
    spec.backward(cot)
    n = s // cp

    def run(offset: bool):
        pq, pk, pv = ([p.clone().requires_grad_() for p in t.chunk(cp, 2)] for t in (q, k, v))
        rows = [slice(c * n, (c + 1) * n) if offset else slice(0, n) for c in range(cp)]
        rq = [apply_rope(pq[c], cos[rows[c]], sin[rows[c]]) for c in range(cp)]
        rk = [apply_rope(pk[c], cos[rows[c]], sin[rows[c]]) for c in range(cp)]
        kk = collective("all-gather", rk, dim=2)  # backward: reduce-scatter
        vv = collective("all-gather", pv, dim=2)
        outs = []
        for c in range(cp):
            q_pos = torch.arange(n) + (c * n if offset else 0)
            allowed = q_pos[:, None] >= torch.arange(s)[None, :]  # global key positions
            scores = (rq[c] @ kk[c].transpose(-2, -1) * 0.5).masked_fill(~allowed, float("-inf"))
            outs.append(torch.softmax(scores, -1) @ vv[c])
        torch.autograd.backward(outs, list(cot.chunk(cp, 2)))
        return outs, [torch.cat([p.grad for p in t], 2) for t in (pq, pk, pv)]

    outs, grads = run(offset=True)
    torch.testing.assert_close(torch.cat(outs, 2), spec.detach(), **TIGHT)
    for got, leaf in zip(grads, (sq, sk, sv), strict=True):
        torch.testing.assert_close(got, leaf.grad, **TIGHT)
    wrong, _ = run(offset=False)  # RoPE positions and mask not offset: rank 1 is wrong
    assert not torch.allclose(torch.cat(wrong, 2), spec.detach())


def moe_gate(x, gate_w, topk=2):
    scores = torch.sigmoid(x @ gate_w.T)
    chosen = torch.topk(scores.detach(), topk, dim=-1).indices
    mask = torch.zeros_like(scores).scatter(-1, chosen, 1.0)
    picked = scores * mask
    return picked / picked.sum(-1, keepdim=True)


def expert_ffn(per_expert, w1, w2, w3):
    """SwiGLU per expert: per_expert [E, T, H], w1/w3 [E, I, H], w2 [E, H, I] -> [E, T, H]."""
    gate = torch.bmm(per_expert, w1.transpose(1, 2))
    up = torch.bmm(per_expert, w3.transpose(1, 2))
    return torch.bmm(F.silu(gate) * up, w2.transpose(1, 2))


def moe_loss(weights, out):
    """Mean over the rank's tokens of |combined output|^2 (a stand-in for the rest of the model)."""
    return ((out * weights.t().unsqueeze(-1)).sum(0) ** 2).mean()


def test_expert_parallel_grads_sync_over_dp_not_ep():
    dp, ep, experts, hidden, inter, tokens = 2, 2, 4, 3, 2, 8
    x = torch.randn(tokens, hidden)
    gate_w = torch.randn(experts, hidden)
    ws = [
        torch.randn(experts, inter, hidden),
        torch.randn(experts, hidden, inter),
        torch.randn(experts, inter, hidden),
    ]
    spec_leaves = [t.clone().requires_grad_() for t in (gate_w, *ws)]
    sg, sw1, sw2, sw3 = spec_leaves
    weights = moe_gate(x, sg)
    out = expert_ffn(x.unsqueeze(0).expand(experts, tokens, hidden), sw1, sw2, sw3)
    spec_loss = moe_loss(weights, out)
    spec_loss.backward()

    mesh = {"dp": dp, "ep": ep}
    ranks = range(dp * ep)
    leaves = {}
    for rank in ranks:
        e = coords_of(rank, mesh)["ep"]
        leaves[rank] = [gate_w.clone().requires_grad_()] + [
            shard_piece(w, 0, e, ep).clone().requires_grad_() for w in ws
        ]  # split [ep, -, -]
    losses = {}
    for d in range(dp):
        grp = group(rank_of({"dp": d, "ep": 0}, mesh), ("ep",), mesh)
        xs = {
            r: shard_piece(x, 0, block_index(coords_of(r, mesh), ("dp", "ep"), mesh), dp * ep)
            for r in grp
        }  # tokens split [(dp, ep), -]
        wts = {r: moe_gate(xs[r], leaves[r][0]) for r in grp}
        per_expert = [xs[r].unsqueeze(0).expand(experts, *xs[r].shape) for r in grp]
        dispatched = collective("all-to-all", per_expert, split_dim=0, concat_dim=1)
        results = [expert_ffn(dispatched[i], *leaves[r][1:]) for i, r in enumerate(grp)]
        combined = collective("all-to-all", results, split_dim=1, concat_dim=0)
        for i, r in enumerate(grp):
            losses[r] = moe_loss(wts[r], combined[i])
    scale = 1.0 / (dp * ep)  # loss-scale 1/(dp*ep): the gradient syncs below are sums
    torch.autograd.backward([losses[r] for r in ranks], [torch.tensor(scale)] * len(ranks))
    torch.testing.assert_close(sum(losses.values()) / len(ranks), spec_loss.detach(), **TIGHT)

    gate_synced = all_reduce([leaves[r][0].grad for r in ranks])  # over (dp, ep)
    for rank in ranks:
        torch.testing.assert_close(gate_synced[rank], sg.grad, **TIGHT)
        e = coords_of(rank, mesh)["ep"]
        over_dp = group(rank, ("dp",), mesh)
        over_all = group(rank, ("dp", "ep"), mesh)
        for i, spec_w in enumerate((sw1, sw2, sw3), start=1):
            right = all_reduce([leaves[r][i].grad for r in over_dp])[0]
            torch.testing.assert_close(right, shard_piece(spec_w.grad, 0, e, ep), **TIGHT)
            wrong = all_reduce([leaves[r][i].grad for r in over_all])[0]
            assert not torch.allclose(wrong, shard_piece(spec_w.grad, 0, e, ep))


# --------------------------------------------------------------------------- the product agrees
# The examples above use this file's own copy of the semantics (so the document is checked
# against arithmetic, not against the package). Here the same statements run through the
# product: its default backwards (``plan.model.DEFAULT_BACKWARD``), its rank order and groups
# (``ir.mesh.MeshGroups``), its block distribution (``ir.layout.take_local``) and its collective
# op (``torch.ops.tvp.collective``, every rank a thread with its own autograd), and must give
# the document's values exactly.

#: docs/language.md statement kind -> the product op's kind
PRODUCT_KIND = {"all-reduce": "all_reduce", "all-gather": "all_gather",
                "reduce-scatter": "reduce_scatter", "all-to-all": "all_to_all",
                "scatter": "scatter", "copy": "identity", "identity": "identity"}


def product_collective(kind, xs, weights, *, op="sum", dim=None, split_dim=None,
                       concat_dim=None, backward=None):
    """Rank r holds xs[r] and seeds weights[r] on its output; returns every rank's output and
    input gradient, through the product's collective op over a ThreadWorld."""
    from trainverify_dsl.lower.collectives import ThreadWorld, run_threads
    from trainverify_dsl.plan.model import DEFAULT_BACKWARD as PRODUCT_DEFAULTS

    n = len(xs)
    d = dim if dim is not None else (split_dim if split_dim is not None else 0)
    d2 = concat_dim if concat_dim is not None else -1
    back = PRODUCT_KIND[backward or PRODUCT_DEFAULTS[kind]]

    def rank(r):
        x = xs[r].detach().clone().requires_grad_()
        y = torch.ops.tvp.collective(x, PRODUCT_KIND[kind], "g", n, op, d, d2, back)
        (y * weights[r]).sum().backward()
        return y.detach(), x.grad

    return run_threads(ThreadWorld([("g", n)], timeout=30), rank)


CASES = [
    ("all-reduce", {"op": "sum"}), ("all-reduce", {"op": "avg"}),
    ("all-reduce", {"op": "max"}), ("all-reduce", {"op": "min"}),
    ("all-reduce", {"op": "sum", "backward": "all-reduce"}),
    ("all-gather", {"dim": 0}), ("all-gather", {"dim": 1}),
    ("all-gather", {"dim": 1, "backward": "scatter"}),
    ("reduce-scatter", {"dim": 0}), ("reduce-scatter", {"dim": 1, "op": "avg"}),
    ("all-to-all", {"split_dim": 0, "concat_dim": 1}),
    ("all-to-all", {"split_dim": 1, "concat_dim": 0}),
    ("copy", {}), ("copy", {"backward": "identity"}),
    ("scatter", {"dim": 0}), ("scatter", {"dim": 1}),
]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize(("kind", "options"), CASES,
                         ids=[f"{k}-{'-'.join(f'{a}={b}' for a, b in o.items())}"
                              for k, o in CASES])
def test_the_product_collective_is_the_documented_one(kind, options, n):
    xs = [torch.randn(8, 4) for _ in range(n)]
    doc_inputs = [x.clone().requires_grad_() for x in xs]
    doc_outputs = collective(kind, doc_inputs, **options)
    weights = [torch.randn(y.shape) for y in doc_outputs]
    torch.autograd.backward(doc_outputs, weights)
    for r, (y, grad) in enumerate(product_collective(kind, xs, weights, **options)):
        assert torch.equal(y, doc_outputs[r].detach()), (kind, r)
        assert torch.equal(grad, doc_inputs[r].grad), (kind, r, "backward")


def test_the_product_default_backwards_are_the_documented_ones():
    from trainverify_dsl.plan.model import DEFAULT_BACKWARD as PRODUCT_DEFAULTS

    assert PRODUCT_DEFAULTS == DEFAULT_BACKWARD


@pytest.mark.parametrize("axes", [("tp",), ("dp",), ("pp",), ("dp", "tp"), ("tp", "dp"),
                                  ("pp", "dp", "tp")])
def test_the_product_rank_order_and_groups_are_the_documented_ones(axes):
    from trainverify_dsl.ir.mesh import MeshGroups

    mesh = MeshGroups(list(MESH_3D.items()))
    for rank in range(8):
        assert mesh.coords(rank) == coords_of(rank, MESH_3D)
        assert mesh.group(rank, axes) == group(rank, axes, MESH_3D)
        assert mesh.group_index(rank, axes) == block_index(coords_of(rank, MESH_3D), axes,
                                                           MESH_3D)


def test_the_product_block_distribution_is_the_documented_one():
    """`split tokens [(dp, ep), -]` on mesh dp=2, ep=2 (§2): ir.layout.take_local gives every
    rank the block this file's shard_piece gives it."""
    from trainverify_dsl.ir.layout import Factor, TLayout, take_local

    mesh = {"dp": 2, "ep": 2}
    tokens = torch.arange(16.0).reshape(8, 2).numpy()
    for axes in (("dp", "ep"), ("ep", "dp")):
        lay = TLayout(((Factor(8, axes),), (Factor(2),)))
        for rank in range(4):
            c = coords_of(rank, mesh)
            want = shard_piece(torch.from_numpy(tokens), 0, block_index(c, axes, mesh), 4)
            assert (take_local(tokens, lay, c, mesh) == want.numpy()).all(), (axes, rank)


def test_megatron_mlp_worked_example_through_the_product_collectives():
    """§3's tp=2 MLP as two ranks' local programs over the product's `copy` and `all-reduce`
    (default backwards): the same gradients as the document's list version and the spec."""
    from trainverify_dsl.lower.collectives import ThreadWorld, run_threads

    x, w1, w2 = torch.randn(3, 4), torch.randn(6, 4), torch.randn(4, 6)
    _, w1_doc, w2_doc, _ = megatron_mlp_tp2(x, w1, w2)

    def rank(r):
        w1_r = w1.chunk(2, 0)[r].clone().requires_grad_()
        w2_r = w2.chunk(2, 1)[r].clone().requires_grad_()
        xin = torch.ops.tvp.collective(x.clone(), "identity", "tp", 2, "sum", 0, -1,
                                       "all_reduce")
        partial = F.relu(xin @ w1_r.T) @ w2_r.T
        y = torch.ops.tvp.collective(partial, "all_reduce", "tp", 2, "sum", 0, -1, "identity")
        (0.5 * (y * y).sum()).backward()
        return w1_r.grad, w2_r.grad

    _, _, w1_grad, w2_grad = spec_mlp(x, w1, w2)
    for r, (g1, g2) in enumerate(run_threads(ThreadWorld([("tp", 2)], timeout=30), rank)):
        assert torch.equal(g1, w1_doc[r].grad) and torch.equal(g2, w2_doc[r].grad)
        torch.testing.assert_close(g1, w1_grad.chunk(2, 0)[r], **TIGHT)
        torch.testing.assert_close(g2, w2_grad.chunk(2, 1)[r], **TIGHT)
