"""The one torch custom op for collectives in local programs: ``torch.ops.tvp.collective``.

A lowered local program calls ``torch.ops.tvp.collective(x, kind, axes, group_size, op, dim,
dim2, backward)`` wherever the plan states a collective. The op has three faces:

- a **fake** (meta) implementation giving the output shape, so AOTAutograd can trace a local
  program on fake tensors into a joint forward+backward graph whose nodes (forward and
  backward) are ``tvp.collective`` calls, which ``spec/convert.py`` maps to IR collectives;
- an **autograd** formula: the backward of a collective is the collective named by
  ``backward`` applied to the output cotangent with ``op="sum"`` (docs/semantics.md Rule 3.2),
  with the same dim, and the split and concat dims swapped for an all-to-all;
- an **eager** CPU implementation for running a local program per rank with real tensors. It
  talks to the other ranks only through a ``Communicator`` (``exchange`` and ``group_index``),
  installed per thread with ``use_communicator``; all collective arithmetic lives here, in
  ``_combine_local``, whatever moves the tensors (``ThreadCommunicator`` for ranks as threads
  of one process, ``DistCommunicator`` for ``torch.distributed`` processes).

Arguments (exact meanings: docs/semantics.md §3.2). In a group of ``n`` ranks with pieces
``x_0 .. x_{n-1}`` in group order, rank ``k`` of the group gets:

=================  ==========================================================================
``kind``           ``y_k``
=================  ==========================================================================
``all_reduce``     ``op_j x_j`` (``op`` in sum, avg, max, min)
``all_gather``     ``cat_dim(x_0, ..., x_{n-1})``
``reduce_scatter`` block ``k`` of ``n`` equal blocks along ``dim`` of ``op_j x_j``
``all_to_all``     ``cat_dim2(blk_k^dim(x_0), ..., blk_k^dim(x_{n-1}))`` (``dim`` = split dim,
                   ``dim2`` = concat dim)
``scatter``        ``blk_k^dim(x_k)`` (no communication)
``identity``       ``x_k`` (a copy; with ``backward="all_reduce"`` this is Megatron's ``copy``)
=================  ==========================================================================

``axes`` is the comma-joined ordered axis list (``"dp,tp"``), ``group_size`` the number of ranks
in the group. ``op`` matters only for all_reduce and reduce_scatter, ``dim`` is ignored by
all_reduce and identity, and ``dim2`` is used only by all_to_all (pass ``-1`` otherwise; it is
ignored). Negative dims count from the end of ``x``. ``backward`` is one of the kinds or
``"none"`` (not differentiable: differentiating through it raises).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import torch
from torch import Tensor

from trainverify_dsl.ir.collectives import COLLECTIVES
from trainverify_dsl.ir.mesh import MeshGroups

#: The local-program kinds, from the one table of collective semantics (``ir/collectives.py``).
KINDS: tuple[str, ...] = tuple(dict.fromkeys(c.kind for c in COLLECTIVES.values()))
BACKWARDS: tuple[str, ...] = KINDS + ("none",)
REDUCE_OPS: tuple[str, ...] = ("sum", "avg", "max", "min")

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Argument checking and shapes (shared by the fake and the eager implementation)


def parse_axes(axes: str) -> tuple[str, ...]:
    """``"dp,tp"`` -> ``("dp", "tp")``."""
    parts = tuple(a.strip() for a in axes.split(","))
    if not axes or any(not a for a in parts):
        raise ValueError(f"tvp.collective: bad axes {axes!r} (want e.g. 'dp' or 'dp,tp')")
    return parts


def _norm(dim: int, rank: int, what: str) -> int:
    if not -max(rank, 1) <= dim < max(rank, 1):
        raise ValueError(f"tvp.collective: {what} {dim} out of range for a {rank}-d tensor")
    return dim % max(rank, 1)


def _dims(kind: str, rank: int, dim: int, dim2: int) -> tuple[int, int]:
    """(dim, dim2) normalised against the input rank; unused dims become -1."""
    if kind in ("all_reduce", "identity"):
        return -1, -1
    if kind == "all_to_all":
        return _norm(dim, rank, "split dim"), _norm(dim2, rank, "concat dim")
    return _norm(dim, rank, "dim"), -1


def _shape_of(kind: str, shape: Sequence[int], n: int, dim: int, dim2: int) -> list[int]:
    """The output shape of ``kind`` over ``n`` ranks (dims already normalised)."""
    out = list(shape)
    if kind == "all_gather":
        out[dim] *= n
    elif kind in ("reduce_scatter", "scatter"):
        if out[dim] % n:
            raise ValueError(f"tvp.collective {kind}: size {out[dim]} of dim {dim} is not "
                             f"divisible by the group size {n}")
        out[dim] //= n
    elif kind == "all_to_all":
        if out[dim] % n:
            raise ValueError(f"tvp.collective all_to_all: size {out[dim]} of split dim {dim} "
                             f"is not divisible by the group size {n}")
        out[dim] //= n
        out[dim2] *= n
    return out


def _backward_dims(backward: str, dim: int, dim2: int) -> tuple[int, int]:
    """The backward collective's dims: the forward's, split and concat swapped for all_to_all."""
    if backward == "all_to_all":
        return dim2, dim
    return dim, dim2


def output_shape(x_shape: Sequence[int], kind: str, axes: str, group_size: int, op: str,
                 dim: int, dim2: int, backward: str) -> list[int]:
    """Check the op's arguments and return its output shape.

    Also checks Rule 3.3: the stated backward, applied to a cotangent of the output's shape,
    must give the input's shape. Raises ``ValueError`` with a readable message."""
    if kind not in KINDS:
        raise ValueError(f"tvp.collective: unknown kind {kind!r} (one of {', '.join(KINDS)})")
    if backward not in BACKWARDS:
        raise ValueError(f"tvp.collective: unknown backward {backward!r} "
                         f"(one of {', '.join(BACKWARDS)})")
    if op not in REDUCE_OPS:
        raise ValueError(f"tvp.collective: unknown reduce op {op!r} "
                         f"(one of {', '.join(REDUCE_OPS)})")
    if group_size < 1:
        raise ValueError(f"tvp.collective: group_size must be positive, got {group_size}")
    parse_axes(axes)
    rank = len(x_shape)
    d, d2 = _dims(kind, rank, dim, dim2)
    out = _shape_of(kind, x_shape, group_size, d, d2)
    if backward != "none":
        bd, bd2 = _backward_dims(backward, dim, dim2)
        bd, bd2 = _dims(backward, rank, bd, bd2)
        back = _shape_of(backward, out, group_size, bd, bd2)
        if back != list(x_shape):
            raise ValueError(f"tvp.collective: backward {backward!r} of {kind!r} maps the "
                             f"output shape {tuple(out)} to {tuple(back)}, not the input shape "
                             f"{tuple(x_shape)} (docs/semantics.md Rule 3.3)")
    return out


# ---------------------------------------------------------------------------------------------
# Communicators


class Communicator(Protocol):
    """Moves tensors between the ranks of one group; knows nothing about collectives."""

    def group_index(self, axes: tuple[str, ...]) -> int:
        """This rank's index in its group over ``axes`` (docs/semantics.md §1)."""
        ...

    def exchange(self, x: Tensor, axes: tuple[str, ...]) -> list[Tensor]:
        """Every group member's ``x`` (this rank's included), in group order."""
        ...


_LOCAL = threading.local()


@contextlib.contextmanager
def use_communicator(comm: Communicator) -> Iterator[Communicator]:
    """Make ``comm`` the current thread's communicator inside the ``with`` block."""
    previous = getattr(_LOCAL, "comm", None)
    _LOCAL.comm = comm
    try:
        yield comm
    finally:
        _LOCAL.comm = previous


def current_communicator() -> Communicator:
    """The communicator installed by ``use_communicator`` in this thread."""
    comm = getattr(_LOCAL, "comm", None)
    if comm is None:
        raise RuntimeError("tvp.collective needs a communicator: run the local program inside "
                           "`with use_communicator(comm):` (or under run_threads)")
    return comm


# ---------------------------------------------------------------------------------------------
# The op


def _reduce(pieces: list[Tensor], op: str) -> Tensor:
    stacked = torch.stack(pieces)
    if op == "sum":
        return stacked.sum(0)
    if op == "avg":
        return stacked.sum(0) / len(pieces)
    if op == "max":
        return stacked.amax(0)
    return stacked.amin(0)


def _combine_local(kind: str, pieces: list[Tensor], k: int, op: str, dim: int,
                   dim2: int) -> Tensor:
    """Rank ``k``'s result of ``kind`` from the group's pieces (dims normalised)."""
    n = len(pieces)
    if kind == "all_reduce":
        return _reduce(pieces, op)
    if kind == "all_gather":
        return torch.cat(pieces, dim)
    if kind == "reduce_scatter":
        return _reduce(pieces, op).chunk(n, dim)[k]
    if kind == "all_to_all":
        return torch.cat([p.chunk(n, dim)[k] for p in pieces], dim2)
    raise AssertionError(kind)


@torch.library.custom_op("tvp::collective", mutates_args=())
def collective(x: Tensor, kind: str, axes: str, group_size: int, op: str, dim: int, dim2: int,
               backward: str) -> Tensor:
    """One collective of a local program (module docstring); eager: via the communicator."""
    output_shape(x.shape, kind, axes, group_size, op, dim, dim2, backward)
    d, d2 = _dims(kind, x.dim(), dim, dim2)
    if kind == "identity":
        return x.clone()
    comm = current_communicator()
    names = parse_axes(axes)
    k = comm.group_index(names)
    if kind == "scatter":
        result = x.chunk(group_size, d)[k]
    else:
        pieces = comm.exchange(x.detach(), names)
        if len(pieces) != group_size:
            raise ValueError(f"tvp.collective {kind} over {axes!r}: group_size is {group_size} "
                             f"but the group has {len(pieces)} ranks")
        result = _combine_local(kind, pieces, k, op, d, d2)
    return result.clone(memory_format=torch.contiguous_format)


@collective.register_fake
def _collective_fake(x: Tensor, kind: str, axes: str, group_size: int, op: str, dim: int,
                     dim2: int, backward: str) -> Tensor:
    return x.new_empty(output_shape(x.shape, kind, axes, group_size, op, dim, dim2, backward))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, kind, axes, group_size, _op, dim, dim2, backward = inputs
    ctx.kind, ctx.axes, ctx.group_size, ctx.backward = kind, axes, group_size, backward
    ctx.dims = _backward_dims(backward, dim, dim2)


def _backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    if ctx.backward == "none":
        raise RuntimeError(f"tvp.collective {ctx.kind} over {ctx.axes!r} was stated with "
                           f"backward 'none' and cannot be differentiated")
    dim, dim2 = ctx.dims
    grad_x = torch.ops.tvp.collective(grad, ctx.backward, ctx.axes, ctx.group_size, "sum",
                                      dim, dim2, "none")
    return grad_x, None, None, None, None, None, None, None


collective.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------
# Ranks as threads of one process


class _Slot:
    """Rendezvous of one group: each member writes its piece, then everyone reads all."""

    def __init__(self, size: int, timeout: float) -> None:
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.pieces: list[Tensor | None] = [None] * size


class ThreadWorld:
    """All ranks of ``mesh`` as threads of this process; one ``ThreadCommunicator`` per rank.

    A rendezvous barrier per group: every rank of a group must call ``exchange`` over the same
    axes the same number of times (SPMD). ``timeout`` (seconds) bounds every wait."""

    def __init__(self, mesh: MeshGroups | Sequence[tuple[str, int]],
                 timeout: float = 60.0) -> None:
        self.mesh = mesh if isinstance(mesh, MeshGroups) else MeshGroups(mesh)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._slots: dict[tuple[int, ...], _Slot] = {}
        self._aborted = False
        self.communicators = [ThreadCommunicator(self, r) for r in range(self.mesh.world_size)]

    def slot(self, members: list[int]) -> _Slot:
        with self._lock:
            key = tuple(members)
            if key not in self._slots:
                self._slots[key] = _Slot(len(members), self.timeout)
            return self._slots[key]

    def abort(self) -> None:
        """Break every rendezvous so that ranks waiting for a failed rank raise."""
        with self._lock:
            for slot in self._slots.values():
                slot.barrier.abort()
            self._aborted = True

    @property
    def aborted(self) -> bool:
        """Whether a rank has failed (the world cannot be used again)."""
        return self._aborted


class ThreadCommunicator:
    """Rank ``rank`` of a ``ThreadWorld``."""

    def __init__(self, world: ThreadWorld, rank: int) -> None:
        self.world = world
        self.rank = rank

    def group_index(self, axes: tuple[str, ...]) -> int:
        return self.world.mesh.group_index(self.rank, axes)

    def exchange(self, x: Tensor, axes: tuple[str, ...]) -> list[Tensor]:
        members = self.world.mesh.group(self.rank, axes)
        slot = self.world.slot(members)
        if self.world.aborted:
            slot.barrier.abort()
        slot.pieces[members.index(self.rank)] = x.detach().clone()
        slot.barrier.wait()  # everyone has written
        pieces = [p for p in slot.pieces if p is not None]
        slot.barrier.wait()  # everyone has read; the slot may be reused
        return pieces


def run_threads(world: ThreadWorld, fn: Callable[[int], T]) -> list[T]:
    """Run ``fn(rank)`` for every rank in its own thread, with that rank's communicator
    installed; the results in rank order. The first exception (by rank) is re-raised after
    every thread has stopped; a failing rank aborts the rendezvous so no rank deadlocks."""
    n = world.mesh.world_size
    results: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def body(rank: int) -> None:
        try:
            with use_communicator(world.communicators[rank]):
                results[rank] = fn(rank)
        except BaseException as error:  # noqa: B036 - re-raised in the caller's thread
            errors[rank] = error
            world.abort()

    threads = [threading.Thread(target=body, args=(r,), name=f"tvp-rank-{r}", daemon=True)
               for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Prefer the root cause over the BrokenBarrierErrors it caused on other ranks.
    failures = [e for e in errors if e is not None]
    roots = [e for e in failures if not isinstance(e, threading.BrokenBarrierError)]
    if failures:
        raise (roots or failures)[0]
    return results


# ---------------------------------------------------------------------------------------------
# Ranks as torch.distributed processes


class DistCommunicator:
    """This process's rank in an initialised ``torch.distributed`` world (e.g. gloo).

    ``dist.new_group`` must be called by every process for every group in the same order, so
    all groups of every axis list in ``axes_lists`` are created here, up front; call the
    constructor with the same arguments in every process. Groups with the same members (e.g.
    over ``("dp", "tp")`` and ``("tp", "dp")``) share one process group; ``exchange`` reorders
    the gathered pieces from the process group's rank order into group order."""

    def __init__(self, mesh: MeshGroups | Sequence[tuple[str, int]],
                 axes_lists: Sequence[Sequence[str]]) -> None:
        import torch.distributed as dist

        self.mesh = mesh if isinstance(mesh, MeshGroups) else MeshGroups(mesh)
        if dist.get_world_size() != self.mesh.world_size:
            raise ValueError(f"torch.distributed world has {dist.get_world_size()} ranks, the "
                             f"mesh {self.mesh.mesh} has {self.mesh.world_size}")
        self.rank: int = dist.get_rank()
        self._by_members: dict[tuple[int, ...], Any] = {}
        self._groups: dict[tuple[str, ...], tuple[list[int], Any]] = {}
        for axes in dict.fromkeys(tuple(a) for a in axes_lists):
            for members in self.mesh.groups(axes):
                key = tuple(sorted(members))
                if key not in self._by_members:
                    self._by_members[key] = dist.new_group(ranks=list(key))
                if self.rank in members:
                    self._groups[axes] = (members, self._by_members[key])

    def group_index(self, axes: tuple[str, ...]) -> int:
        return self.mesh.group_index(self.rank, axes)

    def process_group(self, axes: tuple[str, ...]) -> tuple[list[int], Any]:
        """(this rank's group over ``axes`` in group order, its ``torch.distributed`` group).

        The process group's own rank order is sorted global rank, not group order."""
        if tuple(axes) not in self._groups:
            raise KeyError(f"DistCommunicator: no process groups for axes {tuple(axes)}; pass "
                           f"them in axes_lists (known: {sorted(self._groups)})")
        return self._groups[tuple(axes)]

    def exchange(self, x: Tensor, axes: tuple[str, ...]) -> list[Tensor]:
        import torch.distributed as dist

        members, group = self.process_group(axes)
        x = x.detach().contiguous()
        gathered = [torch.empty_like(x) for _ in members]
        dist.all_gather(gathered, x, group=group)
        return [gathered[dist.get_group_rank(group, r)] for r in members]
