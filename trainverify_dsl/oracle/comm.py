"""Collectives as real ``torch.distributed`` calls, and the local programs run with them.

The lowered stage programs call ``torch.ops.tvp.collective``; the oracle runs them with an FX
``Interpreter`` that sends each such call to ``DistCollective`` instead: the forward is one
``torch.distributed`` collective (``all_reduce``, ``all_gather``, ``reduce_scatter``,
``all_to_all``) over the process group of the statement's axes, and the backward is the stated
backward collective applied to the output cotangent with ``sum`` (docs/semantics.md §3.2,
Rule 3.2), again a real ``torch.distributed`` call. Nothing here reuses the project's collective
arithmetic (``lower/collectives.py``), so an error there is a disagreement, not a shared one.

A process group's own rank order is its sorted global ranks; group order (the order of blocks
and of concatenation, docs/semantics.md §1) is the written axis order. ``World`` keeps both and
maps one onto the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from trainverify_dsl.oracle.mesh import Mesh

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
        "avg": dist.ReduceOp.SUM}  # avg: a sum, then divided by the group size


class World:
    """This process's rank, and a process group for every group of every axis list.

    ``torch.distributed.new_group`` must be called by all processes in the same order, so every
    group of every axis list in ``axes_lists`` is created here, in sorted order; construct it
    with the same arguments in every process."""

    def __init__(self, mesh: Mesh, axes_lists: Iterable[Sequence[str]]) -> None:
        self.mesh = mesh
        self.rank = dist.get_rank()
        self._by_members: dict[tuple[int, ...], Any] = {}
        self._mine: dict[tuple[str, ...], tuple[list[int], Any]] = {}
        for axes in sorted({tuple(a) for a in axes_lists}):
            for members in mesh.groups(axes):
                key = tuple(sorted(members))
                if key not in self._by_members:
                    self._by_members[key] = dist.new_group(ranks=list(key))
                if self.rank in members:
                    self._mine[axes] = (members, self._by_members[key])

    def group(self, axes: Sequence[str]) -> tuple[list[int], Any]:
        """(this rank's group over ``axes`` in group order, its process group)."""
        return self._mine[tuple(axes)]

    def group_index(self, axes: Sequence[str]) -> int:
        members, _ = self.group(axes)
        return members.index(self.rank)


def _positions(members: list[int], group: Any) -> list[int]:
    """The process-group rank of each member, members in group order."""
    return [dist.get_group_rank(group, m) for m in members]


def collective(world: World, x: Tensor, kind: str, axes: Sequence[str], op: str, dim: int,
               dim2: int) -> Tensor:
    """Rank ``k``'s result of one collective in its group over ``axes`` (docs/semantics.md
    §3.2); ``dim`` and ``dim2`` already non-negative."""
    members, group = world.group(axes)
    n, k = len(members), members.index(world.rank)
    if kind == "identity":
        return x.clone()
    if kind == "scatter":
        return x.chunk(n, dim)[k].clone()
    x = x.detach().contiguous()
    where = _positions(members, group)
    if kind == "all_reduce":
        out = x.clone()
        dist.all_reduce(out, op=_OPS[op], group=group)
        return out / n if op == "avg" else out
    if kind == "all_gather":
        gathered = [torch.empty_like(x) for _ in members]
        dist.all_gather(gathered, x, group=group)
        return torch.cat([gathered[p] for p in where], dim)
    blocks = [b.contiguous() for b in x.chunk(n, dim)]
    if any(b.shape != blocks[0].shape for b in blocks) or len(blocks) != n:
        raise ValueError(f"{kind} over {tuple(axes)}: dim {dim} of {tuple(x.shape)} is not "
                         f"divisible by the group size {n}")
    sendlist: list[Tensor] = [blocks[0]] * n
    for j, p in enumerate(where):
        sendlist[p] = blocks[j]  # block j goes to group member j
    if kind == "reduce_scatter":
        out = torch.empty_like(blocks[k])
        dist.reduce_scatter(out, sendlist, op=_OPS[op], group=group)
        return out / n if op == "avg" else out
    if kind == "all_to_all":
        received = [torch.empty_like(blocks[0]) for _ in members]
        dist.all_to_all(received, sendlist, group=group)
        return torch.cat([received[p] for p in where], dim2)
    raise ValueError(f"unknown collective kind {kind!r}")


class DistCollective(torch.autograd.Function):
    """A collective with its stated backward, both real ``torch.distributed`` calls."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, world: World, kind: str, axes: tuple[str, ...], op: str,
                dim: int, dim2: int, backward: str) -> Tensor:
        ctx.world, ctx.axes, ctx.backward = world, axes, backward
        # the backward's dims: the forward's, split and concat swapped for an all-to-all
        ctx.dims = (dim2, dim) if backward == "all_to_all" else (dim, dim2)
        return collective(world, x, kind, axes, op, dim, dim2)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        if ctx.backward == "none":
            raise RuntimeError(f"a collective over {ctx.axes} has backward 'none'")
        dim, dim2 = ctx.dims
        grad_x = collective(ctx.world, grad, ctx.backward, ctx.axes, "sum", dim, dim2)
        return grad_x, None, None, None, None, None, None, None


_ARGS = ("x", "kind", "axes", "group_size", "op", "dim", "dim2", "backward")


def _norm(dim: int, rank: int) -> int:
    """A non-negative dim (``-1`` marks an unused dim; any value will do for it)."""
    return dim % max(rank, 1)


class StageRunner(torch.fx.Interpreter):
    """Runs a lowered stage program eagerly; ``tvp.collective`` calls go to ``DistCollective``."""

    def __init__(self, gm: torch.fx.GraphModule, world: World) -> None:
        super().__init__(gm)
        self.world = world

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target is not torch.ops.tvp.collective.default:
            return super().call_function(target, args, kwargs)
        bound = dict(zip(_ARGS, args, strict=False)) | dict(kwargs)
        x = bound["x"]
        axes = tuple(a.strip() for a in bound["axes"].split(","))
        members, _ = self.world.group(axes)
        if len(members) != bound["group_size"]:
            raise ValueError(f"collective over {axes}: the program says {bound['group_size']} "
                             f"ranks, the mesh group has {len(members)}")
        rank = x.dim()
        dim = _norm(bound["dim"], rank)
        dim2 = _norm(bound["dim2"], rank)
        return DistCollective.apply(x, self.world, bound["kind"], axes, bound["op"], dim, dim2,
                                    bound["backward"])


def program_axes(gm: torch.fx.GraphModule) -> set[tuple[str, ...]]:
    """The axis lists of every ``tvp.collective`` call in a stage program."""
    found = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.tvp.collective.default:
            bound = dict(zip(_ARGS, node.args, strict=False)) | dict(node.kwargs)
            found.add(tuple(a.strip() for a in bound["axes"].split(",")))
    return found
