"""One rank's training step, for real: its stage's local program under ``torch.distributed``.

Per microbatch, in order: receive the stage's boundary inputs from earlier stages
(``dist.recv``), run the local program with autograd (collectives as real ``torch.distributed``
calls, ``comm.StageRunner``), send boundary outputs to the later stages that read them
(``dist.isend``); then receive the cotangents of those outputs from the later stages (summed
over readers), run the backward seeded with the plan's loss scale, and send the gradients of
the boundary inputs back. Parameter gradients accumulate in ``.grad`` over microbatches. Then
the plan's gradient statements (real collectives), and the optimizer step with ``torch.optim``
on the rank's local pieces — under ZeRO-1 on the rank's block of the rows of its piece, then an
all-gather over the shard axes (docs/semantics.md Rule 6.1).

Schedules do not change values (docs/semantics.md §5), so every microbatch runs forward and
backward through all stages before the next one starts.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from trainverify_dsl.ir.layout import MICROBATCH_AXIS, TLayout, append_axes, take_local
from trainverify_dsl.lower.lowering import Lowered, Slot
from trainverify_dsl.oracle.comm import StageRunner, World, collective
from trainverify_dsl.oracle.reference import STATES, make_optimizer, seed_states
from trainverify_dsl.plan.checks import sync_time
from trainverify_dsl.spec.float64 import Float64

GRAD_KINDS = {"all-reduce": "all_reduce", "reduce-scatter": "reduce_scatter"}


class OracleError(Exception):
    """A plan the oracle cannot run (the message says why)."""


@dataclass
class RankOutput:
    """A rank's results: local pieces with the layout each is compared in."""

    #: per microbatch: the data block (coordinates on the data axes) and the local loss
    losses: list[tuple[tuple[int, ...], float]] = field(default_factory=list)
    #: name (``grad(p)``, ``new(p)``, ``new(exp_avg(p))``) -> (local piece, its layout)
    pieces: dict[str, tuple[np.ndarray, TLayout]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Boundaries:
    """Where each boundary value goes (docs/semantics.md §5, Rule 5.2)."""

    #: boundary id -> the stage whose program outputs it
    sender: dict[str, int]
    #: boundary id -> stages reading it, in order
    readers: dict[str, list[int]]
    #: boundary id -> a small integer for message tags
    index: dict[str, int]

    @staticmethod
    def of(lowered: Lowered) -> Boundaries:
        sender = {slot.spec: stage.index for stage in lowered.stages
                  for slot in stage.outputs if slot.kind == "send"}
        readers: dict[str, list[int]] = {}
        for stage in lowered.stages:
            for slot in stage.inputs:
                source = source_of(lowered, stage.index, slot)
                if slot.kind == "recv" and source is not None:
                    readers.setdefault(source, []).append(stage.index)
        return Boundaries(sender, readers, {b: i for i, b in enumerate(sorted(sender))})

    def tag(self, boundary: str, m: int, backward: bool) -> int:
        return (m * len(self.index) + self.index[boundary]) * 2 + int(backward)


def source_of(lowered: Lowered, stage: int, slot: Slot) -> str | None:
    """The boundary a recv input really receives, ``None`` for a free value (Rule 5.2)."""
    return lowered.routes.get((stage, slot.spec), slot.spec)


class RankStep:
    def __init__(self, lowered: Lowered, values: Mapping[str, np.ndarray], world: World,
                 seed: int, project_comm: Any = None) -> None:
        self.lw, self.values, self.world, self.seed = lowered, values, world, seed
        self.sizes = lowered.sizes
        self.coords = world.mesh.coords(world.rank)
        self.stage = self.coords.get("pp", 0)
        self.program = lowered.stages[self.stage]
        self.runner = StageRunner(self.program.gm, world)
        #: a ``lower.collectives.DistCommunicator``: run the project's own ``tvp.collective``
        #: (its arithmetic over a gloo all-gather) instead of ``DistCollective``
        self.project_comm = project_comm
        self.bounds = Boundaries.of(lowered)
        self.scale = float(lowered.plan.loss_scale)
        self.params: dict[str, Tensor] = {}
        self.layouts: dict[str, TLayout] = {}
        for slot in self.program.inputs:
            if slot.kind == "param":
                piece = take_local(values[slot.spec], slot.layout, self.coords, self.sizes)
                self.params[slot.spec] = _tensor(piece).requires_grad_(True)
                self.layouts[slot.spec] = slot.layout
        self.pending: list[Any] = []
        self.out = RankOutput()
        #: with timed gradient statements: the reduced contributions so far, and the layout
        #: the statements leave each gradient in
        self.total: dict[str, Tensor] = {}
        self.final: dict[str, TLayout] = dict(self.layouts)

    def peer(self, stage: int) -> int:
        return self.world.mesh.rank({**self.coords, "pp": stage})

    # -- one microbatch -----------------------------------------------------------------

    def microbatch(self, m: int) -> None:
        if self.project_comm is None:
            self._microbatch(m)
            return
        from trainverify_dsl.lower.collectives import use_communicator

        with use_communicator(self.project_comm):  # the backward's collectives need it too
            self._microbatch(m)

    def _microbatch(self, m: int) -> None:
        args, received = self._inputs(m)
        if self.project_comm is None:
            results = self.runner.run(*args)
        else:
            results = self.program.gm(*args)
        results = results if isinstance(results, (tuple, list)) else (results,)
        roots: list[Tensor] = []
        cotangents: list[Tensor] = []
        for slot, value in zip(self.program.outputs, results, strict=True):
            if slot.kind == "loss":
                self.out.losses.append((self._data_block(), float(value.detach())))
                roots.append(value)
                cotangents.append(torch.full_like(value, self.scale))
            elif slot.kind == "send":
                for stage in self.bounds.readers.get(slot.spec, []):
                    self.pending.append(dist.isend(value.detach().contiguous(), self.peer(stage),
                                                   tag=self.bounds.tag(slot.spec, m, False)))
        for slot, value in zip(self.program.outputs, results, strict=True):
            if slot.kind == "send" and value.is_floating_point():
                total = None
                for stage in self.bounds.readers.get(slot.spec, []):
                    cot = torch.empty_like(value.detach())
                    dist.recv(cot, self.peer(stage), tag=self.bounds.tag(slot.spec, m, True))
                    total = cot if total is None else total + cot
                if total is not None:
                    roots.append(value)
                    cotangents.append(total)
        live = [(r, c) for r, c in zip(roots, cotangents, strict=True) if r.requires_grad]
        if live:
            torch.autograd.backward([r for r, _ in live], [c for _, c in live])
        for source, leaf in received:
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            self.pending.append(dist.isend(grad.contiguous(),
                                           self.peer(self.bounds.sender[source]),
                                           tag=self.bounds.tag(source, m, True)))

    def _inputs(self, m: int) -> tuple[list[Any], list[tuple[str, Tensor]]]:
        coords = {**self.coords, MICROBATCH_AXIS: m}
        args: list[Any] = []
        received: list[tuple[str, Tensor]] = []
        placeholders = [n for n in self.program.gm.graph.nodes if n.op == "placeholder"]
        for slot, node in zip(self.program.inputs, placeholders, strict=True):
            if slot.kind == "param":
                args.append(self.params[slot.spec])
            elif slot.kind == "coord":
                args.append(torch.tensor(coords[slot.spec], dtype=torch.int64))
            elif slot.kind in ("data", "buffer"):
                args.append(_tensor(take_local(self.values[slot.spec], slot.layout, coords,
                                               self.sizes)))
            else:
                args.append(self._receive(slot, node, m, received))
        return args, received

    def _receive(self, slot: Slot, node: Any, m: int,
                 received: list[tuple[str, Tensor]]) -> Tensor:
        shape = slot.layout.local_shape(self.sizes)
        meta = node.meta.get("val")
        floating = meta is None or meta.dtype.is_floating_point
        source = source_of(self.lw, self.stage, slot)
        if source is None:  # a free value: whatever the buffer held (Rule 5.2)
            rng = np.random.default_rng([self.seed, self.world.rank, m,
                                         zlib.crc32(slot.spec.encode())])
            return _tensor(rng.normal(0.0, 1.0, size=shape))
        value = torch.empty(shape, dtype=torch.float64 if floating else meta.dtype)
        dist.recv(value, self.peer(self.bounds.sender[source]),
                  tag=self.bounds.tag(source, m, False))
        if floating:
            value.requires_grad_(True)
            received.append((source, value))
        return value

    def _data_block(self) -> tuple[int, ...]:
        return tuple(self.coords[a] for a in sorted(self.lw.binding.data_axes()))

    # -- after the backward -------------------------------------------------------------

    def timed(self) -> bool:
        """Whether a gradient statement runs before the last microbatch (Rule 4.4)."""
        return any(sync_time(st, self.lw.plan.microbatches) != "last"
                   for st, _ in self.lw.binding.grad_statements)

    def sync_microbatch(self, m: int) -> None:
        """With timed statements: microbatch ``m``'s gradient contributions through the
        statements that run at or after it, added to the running total (Rule 4.4)."""
        contribution = {p: (t.grad if t.grad is not None else torch.zeros_like(t)).detach()
                        .clone() for p, t in self.params.items()}
        for t in self.params.values():
            t.grad = None
        reduced, self.final = self._statements(contribution, m)
        self.total = {p: self.total[p] + g if p in self.total else g
                      for p, g in reduced.items()}

    def _statements(self, grads: dict[str, Tensor], m: int | None
                    ) -> tuple[dict[str, Tensor], dict[str, TLayout]]:
        """The gradient statements on ``grads`` (all of them when ``m`` is ``None``, else
        those that reduce microbatch ``m``'s contribution)."""
        final = dict(self.layouts)
        microbatches = self.lw.plan.microbatches
        for statement, names in self.lw.binding.grad_statements:
            time = sync_time(statement, microbatches)
            if m is not None and isinstance(time, int) and m >= time:
                continue
            kind = GRAD_KINDS.get(statement.kind)
            where = str(statement.origin.report_span)  # file:line:col
            if kind is None:
                raise OracleError(f"{where}: gradient statement `{statement.kind}` is not run "
                                  "by the oracle")
            axes = tuple(statement.axes)
            if "pp" in axes and (axes != ("pp",) or kind != "all_reduce"):
                raise OracleError(f"{where}: a gradient statement over `pp` other than the "
                                  "embedding group's `all-reduce grad(P) over pp` is not run "
                                  "by the oracle")
            dim = statement.dim or 0
            for p in names:
                if p in grads:
                    grads[p] = collective(self.world, grads[p], kind, axes,
                                          statement.op or "sum", dim % max(grads[p].dim(), 1),
                                          -1)
                    if kind == "reduce_scatter":
                        dims = list(final[p].dims)
                        dims[dim] = append_axes(dims[dim], axes)
                        final[p] = TLayout(tuple(dims))
        return grads, final

    def finish(self) -> RankOutput:
        for handle in self.pending:
            handle.wait()
        self.pending.clear()
        if self.timed():
            grads, final = self.total, self.final
        else:
            grads = {p: (t.grad if t.grad is not None else torch.zeros_like(t)).detach()
                     for p, t in self.params.items()}
            grads, final = self._statements(grads, None)
        for p, g in grads.items():
            self.out.pieces[f"grad({p})"] = (g.numpy(), final[p])
        if self.lw.plan.clip_grad_norm is not None:
            grads = self._clip(grads, final)
        if self.lw.plan.optimizer is not None:
            self._optimizer_step(grads, final)
        return self.out

    def _clip(self, grads: dict[str, Tensor], final: dict[str, TLayout]) -> dict[str, Tensor]:
        """Megatron's ``clip_grad_norm_fp32`` (docs/semantics.md §6.3): squares of the
        gradients this rank holds (a replicated copy only at coordinate 0 of each norm-group
        axis that does not split it), summed over the norm group, then torch's coefficient."""
        clip = self.lw.plan.clip_grad_norm
        assert clip is not None
        axes = clip_axes(self.lw)
        total = torch.zeros((), dtype=torch.float64)
        first_copy = {p: stages[0] for p, stages in tied_stages(self.lw).items()}
        for p, g in grads.items():
            split = {a for dim in final[p].dims for f in dim for a in f.axes}
            if clip.replicas == "once" and any(
                    self.coords[a] != 0 for a in axes if a not in split and a != "pp"):
                continue
            # a tied parameter's copies on several stages count once: on the first
            # (Megatron's `param_is_not_shared`)
            if clip.replicas == "once" and "pp" in axes and p in first_copy and \
                    self.coords["pp"] != first_copy[p]:
                continue
            total = total + (g.double() ** 2).sum()
        total = collective(self.world, total.reshape(1), "all_reduce", axes, "sum", 0, -1)[0]
        coef = min(1.0, float(clip.max_norm) / (math.sqrt(float(total)) + 1e-6))
        return {p: g * coef for p, g in grads.items()}

    def _optimizer_step(self, grads: dict[str, Tensor], final: dict[str, TLayout]) -> None:
        optimizer = self.lw.plan.optimizer
        assert optimizer is not None
        shard = tuple(optimizer.shard_axes)
        pieces: dict[str, Tensor] = {}
        state_layouts: dict[str, TLayout] = {}
        for p, param in self.params.items():
            lay = self.layouts[p]
            block = _zero_layout(lay, shard) if shard else lay
            piece = param.detach().clone()
            grad = grads[p]
            if shard:
                piece = self._rows_block(piece, shard)
                if final[p] == lay:  # all-reduced: this rank's block of the whole gradient
                    grad = self._rows_block(grad, shard)
            if grad.shape != piece.shape:
                raise OracleError(f"grad({p}) has local shape {tuple(grad.shape)} but the "
                                  f"optimizer updates a piece of shape {tuple(piece.shape)}")
            piece.grad = grad.clone()
            pieces[p] = piece
            state_layouts[p] = block
        opt = make_optimizer(pieces, optimizer, self.lw.plan.param_groups)
        kinds = STATES[optimizer.kind]
        seed_states(opt, {piece: {k: _tensor(take_local(self.values[f"{k}({p})"],
                                                         state_layouts[p], self.coords,
                                                         self.sizes)) for k in kinds}
                          for p, piece in pieces.items()})
        opt.step()
        for p, piece in pieces.items():
            for k in kinds:
                self.out.pieces[f"new({k}({p}))"] = (opt.state[piece][k].numpy(),
                                                     state_layouts[p])
            new = piece.detach()
            if shard:
                new = collective(self.world, new, "all_gather", shard, "sum", 0, -1)
            self.out.pieces[f"new({p})"] = (new.numpy(), self.layouts[p])

    def _rows_block(self, t: Tensor, axes: tuple[str, ...]) -> Tensor:
        """Block ``k_A`` of the rows of a local piece (Rule 6.1)."""
        n = math.prod(self.world.mesh.sizes[a] for a in axes)
        if t.shape[0] % n:
            raise OracleError(f"a local piece of {t.shape[0]} rows cannot be cut into {n} "
                              "ZeRO blocks")
        k = self.world.mesh.group(self.world.rank, axes).index(self.world.rank)
        rows = t.shape[0] // n
        return t[k * rows:(k + 1) * rows].clone()


def clip_axes(lowered: Lowered) -> tuple[str, ...]:
    """The norm group of ``clip-grad-norm``: its ``over`` axes, else every mesh axis."""
    clip = lowered.plan.clip_grad_norm
    assert clip is not None
    return tuple(clip.axes) or tuple(a for a, _ in lowered.mesh_axes)


def _zero_layout(lay: TLayout, axes: tuple[str, ...]) -> TLayout:
    """Z(P): the parameter's layout with the ZeRO axes innermost on dimension 0 (Rule 6.1)."""
    return TLayout((append_axes(lay.dims[0], axes),) + lay.dims[1:])


def _tensor(value: np.ndarray) -> Tensor:
    t = torch.from_numpy(np.ascontiguousarray(value))
    return t.double() if t.is_floating_point() else t


def run_rank(lowered: Lowered, values: Mapping[str, np.ndarray], world: World,
             seed: int, collectives: str = "torch") -> RankOutput:
    """This rank's whole step (every rank of the world must call it). ``collectives``:
    ``"torch"`` runs each collective as one ``torch.distributed`` call (``DistCollective``);
    ``"project"`` runs the project's own ``tvp.collective`` over its ``DistCommunicator``, to
    check that path against the first."""
    comm = None
    if collectives == "project":
        from trainverify_dsl.lower.collectives import DistCommunicator

        comm = DistCommunicator(lowered.mesh_axes, sorted(axes_lists(lowered)))
    elif collectives != "torch":
        raise ValueError(f"collectives must be 'torch' or 'project', not {collectives!r}")
    step = RankStep(lowered, values, world, seed, comm)
    timed = step.timed()
    with Float64():  # a cast the model writes stays float64 (spec/float64.py)
        for m in range(lowered.sizes[MICROBATCH_AXIS]):
            step.microbatch(m)
            if timed:
                step.sync_microbatch(m)
        return step.finish()


def tied_stages(lowered: Lowered) -> dict[str, list[int]]:
    """Parameters held by several pipeline stages (a tied embedding and output head), with
    the stages holding a copy (docs/semantics.md §5.4)."""
    stages: dict[str, list[int]] = {}
    for stage in lowered.stages:
        for slot in stage.inputs:
            if slot.kind == "param":
                stages.setdefault(slot.spec, []).append(stage.index)
    return {p: held for p, held in stages.items() if len(held) > 1}


def axes_lists(lowered: Lowered) -> set[tuple[str, ...]]:
    """Every axis list a rank may communicate over (stage programs, gradient statements,
    ZeRO shards): the process groups to create."""
    from trainverify_dsl.oracle.comm import program_axes

    found: set[tuple[str, ...]] = set()
    for stage in lowered.stages:
        found |= program_axes(stage.gm)
    found |= {tuple(st.axes) for st, _ in lowered.binding.grad_statements}
    if lowered.plan.clip_grad_norm is not None:
        found.add(clip_axes(lowered))
    if lowered.plan.optimizer and lowered.plan.optimizer.shard_axes:
        found.add(tuple(lowered.plan.optimizer.shard_axes))
    return found
