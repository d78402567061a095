"""Run a ``ParallelProgram`` on every rank (numpy, float64): the plan's training step.

``evaluate_parallel(program, values)`` takes the step's global inputs by spec name
(parameters, buffers, model inputs, optimizer states) and runs, microbatch by microbatch, a
forward sweep over the stages (each stage's joint graph on all of its ranks at once, sends
delivered by the transfer table) and a backward sweep in reverse (cotangents of sends come
back as gradients of receives), seeded with the program's seed; then the gradient statements
and the optimizer step on local pieces (ZeRO-1: the rank's block, then an all-gather). Every
meaning comes from the program; nothing here knows the plan. Values belong to a ``Domain``
(``ir/interp.py``): numeric by default, the checker's exact symbolic one for proofs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

import numpy as np

from trainverify_dsl.ir.batched import evaluate_spmd_batched
from trainverify_dsl.ir.interp import NUMERIC, Domain, evaluate_graph, evaluate_spmd
from trainverify_dsl.ir.layout import MICROBATCH_AXIS, TLayout, take_local
from trainverify_dsl.ir.mesh import MeshGroups
from trainverify_dsl.ir.parallel import (
    ParallelProgram,
    ParamUpdate,
    Stage,
    Transfer,
    denominator_input,
)

#: Seed of the generator for free values (Rule 5.2): a fixed, documented choice, so a run is
#: reproducible and a free value is the same in the forward and the backward sweep.
FREE_VALUE_SEED = 12345


@dataclass
class ParallelOutcome:
    """What the plan's step produced, by rank."""

    #: (rank, microbatch) -> local loss (a 0-d value)
    losses: dict[tuple[int, int], Any] = field(default_factory=dict)
    #: (marked point, rank, microbatch) -> the local value there
    observed: dict[tuple[str, int, int], np.ndarray] = field(default_factory=dict)
    #: rank -> parameter -> final gradient (after the gradient statements)
    grads: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    #: rank -> name -> updated piece: ``new(p)`` in the parameter's layout, ``new(s(p))``
    #: in the block layout
    updates: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    #: rank -> its ``clip-grad-norm`` coefficient (a 0-d value), when the plan clips
    clip_coefs: dict[int, Any] = field(default_factory=dict)
    #: every rank's total squared gradient norm, after the norm group's all-reduce
    clip_totals: dict[int, Any] = field(default_factory=dict)


class Boundaries(Protocol):
    """Sees, and may replace, the values crossing stages (the checker's stage cuts,
    ``check/stages.py``): ``forward`` a received boundary value, ``cotangent`` the summed
    cotangent a stage's send gets back. Each is called with the transfer, the receiving
    rank, its coordinates (``@mb`` included) and the value, and returns the value to use;
    called again for the same arguments, it returns the same value."""

    def forward(self, t: Transfer, rank: int, coords: Mapping[str, int], value: Any) -> Any:
        ...

    def cotangent(self, t: Transfer, rank: int, coords: Mapping[str, int], value: Any) -> Any:
        ...


#: ``gradients(param, rank, coords, value)``: the final gradient the optimizer step of
#: ``param`` reads on ``rank`` (the checker's cut at the gradients, ``check/stages.py``)
Gradients = Callable[[str, int, Mapping[str, int], Any], Any]


class _Run:
    def __init__(self, program: ParallelProgram, values: Mapping[str, np.ndarray],
                 batched: bool, domain: Domain, boundaries: Boundaries | None = None,
                 skip: Collection[int] = (), gradients: Gradients | None = None) -> None:
        self.p, self.values, self.domain = program, values, domain
        self.boundaries = boundaries
        self.gradients = gradients
        self.skip = frozenset(skip)
        #: (source stage, sent id) -> the transfer delivering it (for cotangents)
        self.sent_by = {(t.source, t.sent): t for t in program.transfers
                        if t.source is not None}
        if batched and domain is NUMERIC:
            self.spmd: Any = evaluate_spmd_batched
        else:
            def spmd(graph: Any, feeds: Any, groups: Any) -> Any:
                return evaluate_spmd(graph, feeds, groups, domain)
            self.spmd = spmd
        self.mesh = MeshGroups(program.mesh)
        self.sizes = program.sizes
        self.stage_ranks = [self._ranks_of(st.rank) for st in program.stages]
        self.transfers = {(t.dest, t.value): t for t in program.transfers}
        self.free = np.random.default_rng(FREE_VALUE_SEED)
        self.free_values: dict[tuple[int, str, int, int], np.ndarray] = {}
        self.out = ParallelOutcome()
        #: (input, layout dims, coordinates it splits by) -> the piece (``_step_input``)
        self.pieces: dict[tuple[Any, ...], Any] = {}
        #: rank -> the step's token count (``token-mean``, §4.3), before the first microbatch
        self.denominators: dict[int, dict[str, Any]] = {}

    def _ranks_of(self, stage: int) -> list[int]:
        axis = self.p.pipeline_axis
        ranks = range(self.mesh.world_size)
        if axis is None:
            return list(ranks)
        return [r for r in ranks if self.mesh.coords(r)[axis] == stage]

    def coords(self, rank: int, m: int = 0) -> dict[str, int]:
        coords = self.mesh.coords(rank)
        coords[MICROBATCH_AXIS] = m
        return coords

    def peer(self, rank: int) -> int:
        """Boundary values are keyed by the rank's coordinates off the pipeline axis."""
        axis = self.p.pipeline_axis
        if axis is None:
            return rank
        coords = self.mesh.coords(rank)
        coords[axis] = 0
        return self.mesh.rank_of(coords)

    def groups(self, ranks: list[int]) -> Any:
        position = {r: i for i, r in enumerate(ranks)}

        def groups(axis: str) -> list[list[int]]:
            return [[position[r] for r in group]
                    for group in self.mesh.groups(tuple(axis.split(",")))
                    if group[0] in position]
        return groups

    # -- the microbatch loop ------------------------------------------------------------

    def run(self, step: bool = True) -> ParallelOutcome:
        # statements timed before the last microbatch (§4.5) reduce each microbatch's
        # contribution; otherwise they run once, on the accumulated gradients
        timed = step and any(s.after != 0 for s in self.p.grad_syncs)
        total = self.out.grads
        if self.p.loss.count is not None:
            self.denominators = self._denominators()
        for m in range(self.p.microbatches):
            if timed:
                self.out.grads = {}
            sends: dict[tuple[str, int], Any] = {}
            for stage in self.p.stages:
                self._stage(stage, m, sends, {}, forward=True)
            cotangents: dict[tuple[str, int], Any] = {}
            for stage in reversed(self.p.stages):
                self._stage(stage, m, sends, cotangents, forward=False)
            if timed:
                self._grad_syncs(m)
                for rank, acc in self.out.grads.items():
                    mine = total.setdefault(rank, {})
                    for param, value in acc.items():
                        mine[param] = mine[param] + value if param in mine else value
        self.out.grads = total
        if not step:
            return self.out
        if not timed:
            self._grad_syncs(None)
        self.clipped = self._clip() if self.p.clip is not None else self.out.grads
        if self.p.optimizer is not None:
            for update in self.p.optimizer.updates:
                self._update(update, self.p.optimizer.shard_axes)
        return self.out

    def _feed(self, stage: Stage, rank: int, m: int, sends: Mapping, cotangents: Mapping
              ) -> dict[str, Any]:
        coords = self.coords(rank, m)
        feed: dict[str, Any] = {}
        for slot in stage.inputs:
            if slot.kind in ("param", "data", "buffer", "coord"):
                feed[slot.name] = self._step_input(slot, coords)
            elif slot.kind == "recv":
                feed[slot.name] = self._received(stage, slot, rank, m, sends)
            elif slot.kind == "denominator":
                feed[slot.name] = self.denominators[rank][slot.name]
            elif slot.kind == "seed":
                feed[slot.name] = self.domain.fill(stage.graph.inputs[len(feed)].type.shape,
                                                   self.p.seed)
            else:  # a cotangent: zero unless a later stage sent one back
                value = cotangents.get((slot.spec, self.peer(rank)))
                shape = stage.graph.inputs[len(feed)].type.shape
                t = self.sent_by.get((stage.index, slot.spec[len("send."):]))
                if value is not None and t is not None and self.boundaries is not None:
                    value = self.boundaries.cotangent(t, rank, coords, value)
                feed[slot.name] = self.domain.fill(shape, 0) if value is None else value
        return feed

    def _step_input(self, slot: Any, coords: Mapping[str, int]) -> Any:
        """A slot fed from the step's inputs: the rank's piece of a parameter, buffer or data
        input, or its coordinate. A piece is taken once per distinct piece (the coordinates
        its layout splits by): every microbatch, both sweeps and the replicas along other
        axes read the same array."""
        if slot.kind == "coord":
            return np.array(coords[slot.spec], dtype=np.int64)
        key = (slot.spec, slot.layout.dims,
               tuple(coords[a] for a in sorted(slot.layout.shard_axes())))
        piece = self.pieces.get(key)
        if piece is None:
            piece = self.pieces[key] = take_local(self.values[slot.spec], slot.layout, coords,
                                                  self.sizes)
        return piece

    def _received(self, stage: Stage, slot: Any, rank: int, m: int, sends: Mapping) -> Any:
        t = self.transfers[(stage.index, slot.spec)]
        if t.source is not None:
            value = sends[(t.sent, self.peer(rank))]
            if self.boundaries is not None:
                value = self.boundaries.forward(t, rank, self.coords(rank, m), value)
            return value
        key = (stage.index, slot.spec, rank, m)
        if key not in self.free_values:
            shape = slot.layout.local_shape(self.sizes)
            free = getattr(self.domain, "free", None)
            self.free_values[key] = free(shape, key) if free is not None else \
                self.free.normal(0.0, 1.0, size=shape)
        return self.free_values[key]

    def _stage(self, stage: Stage, m: int, sends: dict, cotangents: dict,
               forward: bool) -> None:
        ranks = self.stage_ranks[stage.index]
        feeds = [self._feed(stage, r, m, sends, cotangents) for r in ranks]
        if stage.index in self.skip:  # proven through another stage (``skip``)
            zeros = {name: self.domain.fill(stage.graph.value_type(value).shape, 0)
                     for name, value in stage.graph.outputs}
            outs = [zeros for _ in ranks]
        else:
            outs = self.spmd(stage.graph, feeds, self.groups(ranks))
        kinds = {s.name: s for s in stage.outputs}
        for r, out in zip(ranks, outs, strict=True):
            for name, value in out.items():
                slot = kinds[name]
                if forward:
                    self._forward_output(slot, r, m, value, sends)
                else:
                    self._backward_output(stage, slot, r, m, value, cotangents)

    def _forward_output(self, slot: Any, rank: int, m: int, value: Any, sends: dict) -> None:
        if slot.kind == "send":
            sends[(slot.spec, self.peer(rank))] = value
        elif slot.kind == "lineage":
            self.out.observed[(slot.spec, rank, m)] = value

    def _backward_output(self, stage: Stage, slot: Any, rank: int, m: int, value: Any,
                         cotangents: dict) -> None:
        if slot.kind == "grad-recv":
            t = self.transfers[(stage.index, slot.spec)]
            if t.source is not None:
                key = (f"send.{t.sent}", self.peer(rank))
                cotangents[key] = cotangents.get(key, 0) + value
        elif slot.kind == "grad":
            acc = self.out.grads.setdefault(rank, {})
            acc[slot.spec] = acc.get(slot.spec, 0) + value
        elif slot.kind == "loss":
            self.out.losses[(rank, m)] = value

    def _denominators(self) -> dict[int, dict[str, Any]]:
        """``token-mean`` (§4.3): each rank's local token counts, summed over the
        microbatches and over the rank's group along the counted axes (whose ranks hold
        different data blocks), as one known number per rank and normaliser of the loss
        (rank -> the loss stage's denominator input -> its value)."""
        loss = self.p.loss
        assert loss.count is not None
        stage = next(st for st in self.p.stages if st.output("loss"))
        slots = {s.name: s for s in stage.inputs}
        ranks = self.stage_ranks[stage.index]
        outputs = loss.count.output_names
        counts: dict[int, list[int]] = {}
        for rank in ranks:
            totals = [0] * len(outputs)
            for m in range(self.p.microbatches):
                coords = self.coords(rank, m)
                feed: dict[str, Any] = {}
                for g in loss.count.inputs:
                    feed[g.name] = self._step_input(slots[g.name], coords)
                found = evaluate_graph(loss.count, feed, self.domain)
                for k, name in enumerate(outputs):
                    totals[k] += _known_int(self.domain.known(found[name]), found[name])
            counts[rank] = totals
        out: dict[int, dict[str, Any]] = {}
        for group in self.mesh.groups(loss.counted):
            held = [r for r in group if r in counts]
            for k in range(len(outputs)):
                step_count = sum(counts[r][k] for r in held)
                for r in held:
                    out.setdefault(r, {})[denominator_input(k)] = \
                        self.domain.fill((), Fraction(step_count))
        return out

    # -- after the backward -------------------------------------------------------------

    def _grad_syncs(self, m: int | None) -> None:
        """The gradient statements on ``self.out.grads``: the accumulated gradients
        (``m is None``), or microbatch ``m``'s contributions, through the statements that
        reduce them."""
        grads = self.out.grads
        for sync in self.p.grad_syncs:
            if m is not None and not sync.reduces(m, self.p.microbatches):
                continue
            for param in sync.params:
                for group in self.mesh.groups(sync.axes):
                    # a statement acts where the ranks hold the parameter (§4.5); the
                    # verifier guarantees a group holds it on every member or on none,
                    # except over the pipeline axis: the embedding group of a tied
                    # parameter is the members holding a copy (§5.4)
                    group = [r for r in group if param in grads.get(r, {})]
                    if not group:
                        continue
                    attrs = {"axis": ",".join(sync.axes), "op": sync.op,
                             "group_size": len(group)}
                    if sync.kind == "reduce_scatter":
                        attrs["dim"] = sync.dim
                    outs = self.domain.collective(sync.kind, [(grads[r][param],) for r in group],
                                                  attrs)
                    for r, out in zip(group, outs, strict=True):
                        grads[r][param] = out

    def _clip(self) -> dict[int, dict[str, Any]]:
        """``clip-grad-norm`` (§6.3): the gradients every rank holds, scaled by the clip
        coefficient of the squared norm summed over the norm group (``GradClip``)."""
        clip = self.p.clip
        assert clip is not None
        final = self.p.final_grad_layouts()
        squares, scales = dict(clip.squares), dict(clip.scales)
        totals: dict[int, Any] = {}
        first = {p: self.p.holding_ranks(p)[0] for p, _ in self.p.param_layouts
                 if len(self.p.holding_ranks(p)) > 1}
        for rank in range(self.mesh.world_size):
            coords = self.mesh.coords(rank)
            total = self.domain.fill((), 0)
            for param, grad in self.out.grads.get(rank, {}).items():
                if clip.replicas == "once" and not self._counted(final[param], coords, clip.axes,
                                                                 first.get(param)):
                    continue
                square = evaluate_graph(squares[param], {"grad": grad}, self.domain)["square"]
                total = evaluate_graph(clip.add, {"a": total, "b": square}, self.domain)["sum"]
            totals[rank] = total
        attrs = {"axis": ",".join(clip.axes), "op": "sum",
                 "group_size": self.mesh.group_size(clip.axes)}
        for group in self.mesh.groups(clip.axes):
            summed = self.domain.collective("all_reduce", [(totals[r],) for r in group], attrs)
            totals.update(zip(group, summed, strict=True))
        clipped: dict[int, dict[str, Any]] = {}
        for rank, acc in self.out.grads.items():
            coef = evaluate_graph(clip.coefficient, {"total": totals[rank]}, self.domain)["coef"]
            self.out.clip_coefs[rank] = coef
            self.out.clip_totals[rank] = totals[rank]
            clipped[rank] = {p: evaluate_graph(scales[p], {"grad": g, "coef": coef},
                                               self.domain)["clipped"] for p, g in acc.items()}
        return clipped

    def _counted(self, layout: TLayout, coords: Mapping[str, int], axes: tuple[str, ...],
                 first_copy: int | None = None) -> bool:
        """``replicas=once``: a rank's copy counts unless another coordinate of a group axis
        that does not split the gradient holds the same copy (coordinate 0 counts); on the
        pipeline axis only a tied parameter has copies (``first_copy``: the first pp rank
        holding one), counted there (Megatron's ``param_is_not_shared``)."""
        split = {a for dim in layout.dims for f in dim for a in f.axes}
        pipeline = self.p.pipeline_axis
        if first_copy is not None and pipeline in axes and coords[pipeline] != first_copy:
            return False
        return all(coords[a] == 0 for a in axes if a not in split and a != pipeline)

    def _update(self, u: ParamUpdate, shard: tuple[str, ...]) -> None:
        final = self.p.final_grad_layouts()[u.param]
        names = [g.name for g in u.graph.inputs]
        pieces: dict[int, np.ndarray] = {}
        opt = self.p.optimizer
        assert opt is not None
        for rank, acc in sorted(self.clipped.items()):
            if u.param not in acc:
                continue
            coords = self.coords(rank)
            override = opt.override_for(coords)  # §6.4: this rank's own hyper-parameters
            graph = dict(override.graphs)[u.param] if override is not None else u.graph
            grad = acc[u.param]
            if self.gradients is not None:
                grad = self.gradients(u.param, rank, coords, grad)
            if final != u.block:  # complete on the rank: take its block (§6.2)
                grad = _block_of(grad, u.layout, u.block, coords, self.sizes)
            local = [take_local(self.values[u.param], u.block, coords, self.sizes), grad]
            local += [take_local(self.values[f"{s}({u.param})"], u.block, coords, self.sizes)
                      for s in u.states]
            result = evaluate_graph(graph, dict(zip(names, local, strict=True)), self.domain)
            mine = self.out.updates.setdefault(rank, {})
            for s in u.states:
                mine[f"new({s}({u.param}))"] = result[f"new({s})"]
            pieces[rank] = result["new(param)"]
        if shard:
            pieces = self._all_gather(pieces, shard)
        for rank, piece in pieces.items():
            self.out.updates[rank][f"new({u.param})"] = piece

    def _all_gather(self, pieces: dict[int, np.ndarray], axes: tuple[str, ...]
                    ) -> dict[int, np.ndarray]:
        attrs = {"axis": ",".join(axes), "dim": 0, "group_size": self.mesh.group_size(axes)}
        out: dict[int, np.ndarray] = {}
        for group in self.mesh.groups(axes):
            if all(r in pieces for r in group):
                gathered = self.domain.collective("all_gather", [(pieces[r],) for r in group],
                                                  attrs)
                out.update(zip(group, gathered, strict=True))
        return out


def _known_int(item: Any, value: Any) -> int:
    """A token count (``item``: the number the domain knows ``value`` holds, or ``None``) as
    a Python int; it depends on integer data only, so every domain knows it."""
    if isinstance(item, (bool, int, np.integer)) or (
            isinstance(item, (float, np.floating, Fraction)) and item == int(item)):
        return int(item)
    raise ValueError(f"the token count is not a known integer ({value!r})")


def _block_of(grad: np.ndarray, layout: TLayout, block: TLayout, coords: Mapping[str, int],
              sizes: Mapping[str, int]) -> np.ndarray:
    """The rank's ZeRO block of its local piece: block ``k_A`` of the local rows."""
    n = block.local_shape(sizes)[0]
    index = 0
    for a in block.dims[0][0].axes[len(layout.dims[0][0].axes):]:
        index = index * sizes[a] + coords[a]
    return grad[index * n:(index + 1) * n]


def evaluate_parallel(program: ParallelProgram, values: Mapping[str, np.ndarray],
                      step: bool = True, batched: bool = True,
                      domain: Domain = NUMERIC, boundaries: Boundaries | None = None,
                      skip: Collection[int] = (), gradients: Gradients | None = None
                      ) -> ParallelOutcome:
    """The plan's training step on the global input ``values`` (by spec name); with
    ``step=False`` only the microbatch loop (local losses, accumulated gradients before the
    gradient statements). ``batched``: every stage graph runs rank-batched
    (``ir/batched.py``); ``False`` runs it rank by rank (``evaluate_spmd``, the reference).
    ``domain``: the values' domain (a non-numeric one always runs rank by rank); a domain with
    a ``free(shape, key)`` method supplies free values (Rule 5.2) itself. ``boundaries``:
    sees and may replace the values crossing stages (``Boundaries``). ``skip``: stages that
    are not run, their outputs zeros (the checker's symmetry, ``check/symmetry.py``, proves
    them through other stages and reads none of what they would produce). ``gradients``:
    sees and may replace the final gradient each optimizer update reads (``Gradients``); the
    step's reported gradients are not replaced."""
    return _Run(program, values, batched, domain, boundaries, skip, gradients).run(step)
