"""Numeric simulation: run the lowered plan on every rank and compare with the spec.

``simulate(plan_path)`` builds the spec model (at the plan's sizes, or shrunk by
``simulate.shrink``), draws random parameters, optimizer states and inputs, and runs

- the **spec**: the traced single-device training step (IR, numpy, float64) with the
  optimizer step appended;
- the **plan**: every stage's joint IR graph on every rank of the stage (``evaluate_spmd``:
  collectives combine the ranks of their groups), microbatch by microbatch — a forward sweep
  over the stages (sends), then a backward sweep in reverse (cotangents of sends come back as
  gradients of receives) — seeded with the plan's loss scale; then gradient accumulation, the
  plan's gradient statements, and the optimizer step on local pieces (ZeRO-1: on the rank's
  block, then all-gathered).

It compares the logical loss (docs/semantics.md §4.6), every parameter's final gradient on
every rank holding it (every copy, §2.2), and every updated parameter, and reports
``max_rel_error`` and the first tensor that differs with the plan line responsible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainverify_dsl.ir.graph import Graph
from trainverify_dsl.ir.interp import evaluate_graph, evaluate_spmd
from trainverify_dsl.ir.ops import OPS
from trainverify_dsl.ir.types import TensorType
from trainverify_dsl.lower.joint import input_name, stage_joint
from trainverify_dsl.lower.layout import MICROBATCH_AXIS, TLayout, append_axes, take_local
from trainverify_dsl.lower.lowering import Lowered, lower
from trainverify_dsl.lower.mesh import MeshGroups
from trainverify_dsl.plan.model import Plan
from trainverify_dsl.report.span import Span
from trainverify_dsl.spec import optim

#: Relative error below which two float64 results agree (round-off of the same real numbers).
TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class Mismatch:
    tensor: str
    rank: int
    rel_error: float
    span: Span | None
    detail: str = ""


@dataclass
class SimulationResult:
    plan: str
    ranks: int
    max_rel_error: float
    compared: int
    mismatches: list[Mismatch] = field(default_factory=list)
    sizes: dict[str, Any] = field(default_factory=dict)
    #: layout-pass findings of the lowering (Diagnostics)
    findings: list[Any] = field(default_factory=list)
    #: marked points whose values differ from their derived lineage, in program order
    lineage_mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        """The final outputs agree (loss, gradients, updates). A derived lineage that differs
        while they agree is not a disagreement (docs/semantics.md §8)."""
        return not self.mismatches and self.max_rel_error < TOLERANCE

    @property
    def first(self) -> Mismatch | None:
        """The first tensor in program order that differs: an intermediate value at a marked
        point if one does, else the first final output."""
        if not self.mismatches:
            return None
        return (self.lineage_mismatches or self.mismatches)[0]


#: A tensor is compared relative to its own largest entry, but never relative to less than
#: this fraction of the largest entry of all expected values: a gradient that is zero in real
#: arithmetic (GPT-2's key bias: softmax ignores a constant added to every score) is
#: round-off on both sides, and its relative error would be noise.
FLOOR = 1e-6


def rel_error(got: np.ndarray, want: np.ndarray, floor: float = 1e-12) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return math.inf
    if got.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(want))), floor)
    diff = float(np.max(np.abs(got - want)))
    return diff / scale if np.isfinite(diff) else math.inf


# -- random values --------------------------------------------------------------------------


def spec_optimizer(plan: Plan) -> Any:
    opt = plan.optimizer
    if opt is None:
        return None

    def f(name: str, default: float) -> float:
        value = opt.get(name)
        return float(value) if value is not None else default

    if opt.kind == "sgd":
        return optim.SGD(lr=f("lr", 0.0), momentum=f("momentum", 0.0),
                         weight_decay=f("weight-decay", 0.0))
    betas = opt.get("betas")
    pair = (float(betas[0]), float(betas[1])) if betas else (0.9, 0.999)
    if opt.kind == "adam":
        return optim.Adam(lr=f("lr", 1e-3), betas=pair, eps=f("eps", 1e-8),
                          weight_decay=f("weight-decay", 0.0))
    return optim.AdamW(lr=f("lr", 1e-3), betas=pair, eps=f("eps", 1e-8),
                       weight_decay=f("weight-decay", 0.01))


def random_inputs(spec_inputs: Any, model: torch.nn.Module, rng: np.random.Generator
                  ) -> dict[str, np.ndarray]:
    """Parameters ~ N(0, 0.5²), states positive where they must be (Adam's v), token ids in
    range (the vocabulary is the first dimension of the embedding table), real inputs N(0,1),
    buffers as the model built them."""
    buffers = {n: b.detach().cpu().double().numpy() if b.is_floating_point() else
               b.detach().cpu().numpy() for n, b in model.named_buffers()}
    vocab = _vocab(model)
    values: dict[str, np.ndarray] = {}
    for g in spec_inputs:
        shape = g.type.shape
        if g.kind == "buffer":
            values[g.name] = buffers[g.name]
        elif g.type.dtype.startswith("i"):
            values[g.name] = rng.integers(0, vocab or 2, size=shape)
        elif g.kind == "state" and g.name.startswith("v("):
            values[g.name] = rng.uniform(0.1, 1.0, size=shape)
        else:
            values[g.name] = rng.normal(0.0, 0.5, size=shape)
    return values


def _vocab(model: torch.nn.Module) -> int | None:
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            return module.num_embeddings
    return None


# -- the plan side ----------------------------------------------------------------------------


class _PlanRun:
    def __init__(self, lowered: Lowered, graphs: list[Graph],
                 values: Mapping[str, np.ndarray]) -> None:
        self.lw, self.graphs, self.values = lowered, graphs, values
        self.mesh = MeshGroups(lowered.mesh_axes)
        self.sizes = lowered.sizes
        self.has_pp = "pp" in self.mesh.sizes
        self.stage_ranks = [self._ranks_of(s) for s in range(len(graphs))]
        self.scale = float(lowered.plan.loss_scale)
        self.layouts = {s.spec: s.layout for st in lowered.stages for s in st.inputs}
        self.losses: dict[tuple[int, int], float] = {}
        #: (marked point, rank, microbatch) -> the local value there
        self.observed: dict[tuple[str, int, int], np.ndarray] = {}
        self.free = np.random.default_rng(12345)
        self.free_values: dict[tuple[int, str, int, int], np.ndarray] = {}
        self.grads: dict[int, dict[str, np.ndarray]] = {}

    def _ranks_of(self, stage: int) -> list[int]:
        ranks = range(self.mesh.world_size)
        if not self.has_pp:
            return list(ranks)
        return [r for r in ranks if self.mesh.coords(r)["pp"] == stage]

    def coords(self, rank: int, m: int) -> dict[str, int]:
        coords = self.mesh.coords(rank)
        coords[MICROBATCH_AXIS] = m
        return coords

    def _groups(self, ranks: list[int]) -> Any:
        position = {r: i for i, r in enumerate(ranks)}

        def groups(axis: str) -> list[list[int]]:
            axes = tuple(axis.split(","))
            out = []
            for group in self.mesh.groups(axes):
                if group[0] in position:
                    out.append([position[r] for r in group])
            return out
        return groups

    def _inputs(self, stage: int, rank: int, m: int, recv: Mapping[tuple[str, int], Any],
                cotangents: Mapping[tuple[str, int], Any] | None) -> dict[str, Any]:
        coords = self.coords(rank, m)
        feed: dict[str, Any] = {}
        for slot in self.lw.stages[stage].inputs:
            name = input_name(slot)
            if slot.kind in ("param", "data", "buffer"):
                feed[name] = take_local(self.values[slot.spec], slot.layout, coords, self.sizes)
            elif slot.kind == "coord":
                feed[name] = np.array(coords[slot.spec], dtype=np.int64)
            else:
                source = self.lw.routes.get((stage, slot.spec), slot.spec)
                if source is None:  # a free value (Rule 5.2): whatever the buffer held,
                    # the same in the forward and the backward sweep
                    key = (stage, slot.spec, rank, m)
                    if key not in self.free_values:
                        shape = slot.layout.local_shape(self.sizes)
                        self.free_values[key] = self.free.normal(0.0, 1.0, size=shape)
                    feed[name] = self.free_values[key]
                else:
                    feed[name] = recv[(source, self._peer(rank))]
        graph = self.graphs[stage]
        for g in graph.inputs:
            if g.name == "seed":
                feed[g.name] = np.full(g.type.shape, self.scale)
            elif g.name.startswith("cotangent."):
                key = (g.name.removeprefix("cotangent."), self._peer(rank))
                value = (cotangents or {}).get(key)
                feed[g.name] = np.zeros(g.type.shape) if value is None else value
        return feed

    def _peer(self, rank: int) -> int:
        """Boundary values are keyed by the rank's coordinates off the pipeline axis."""
        if not self.has_pp:
            return rank
        coords = self.mesh.coords(rank)
        coords["pp"] = 0
        return self.mesh.rank_of(coords)

    def run(self) -> None:
        for m in range(self.sizes[MICROBATCH_AXIS]):
            sends: dict[tuple[str, int], Any] = {}
            for s in range(len(self.graphs)):
                self._stage(s, m, sends, None, forward=True)
            cotangents: dict[tuple[str, int], Any] = {}
            for s in reversed(range(len(self.graphs))):
                self._stage(s, m, sends, cotangents, forward=False)

    def _stage(self, s: int, m: int, sends: dict, cotangents: dict | None,
               forward: bool) -> None:
        ranks = self.stage_ranks[s]
        feeds = [self._inputs(s, r, m, sends, cotangents) for r in ranks]
        outs = evaluate_spmd(self.graphs[s], feeds, self._groups(ranks))
        for r, out in zip(ranks, outs, strict=True):
            for name, value in out.items():
                if forward and name.startswith("send."):
                    sends[(name.removeprefix("send."), self._peer(r))] = value
                elif forward and name.startswith("lineage."):
                    self.observed[(name.removeprefix("lineage."), r, m)] = value
                elif not forward and name.startswith("grad(recv."):
                    spec = name[len("grad(recv."):-1]
                    source = self.lw.routes.get((s, spec), spec)
                    if source is not None:
                        key = (source, self._peer(r))
                        cotangents[key] = cotangents.get(key, 0) + value
                elif not forward and name.startswith("grad("):
                    acc = self.grads.setdefault(r, {})
                    param = name[5:-1]
                    acc[param] = acc.get(param, 0) + value
                elif not forward and name == "loss":
                    self.losses[(r, m)] = float(value)

    # -- after the backward ---------------------------------------------------------------

    def grad_statements(self) -> dict[str, TLayout]:
        """Apply the plan's gradient statements; returns the final layout of each gradient."""
        final = {p: self.layouts[p] for acc in self.grads.values() for p in acc}
        for st, names in self.lw.binding.grad_statements:
            kind = {"all-reduce": "all_reduce", "reduce-scatter": "reduce_scatter"}.get(st.kind)
            if kind is None:
                continue
            axes = tuple(st.axes)
            n = math.prod(self.sizes[a] for a in axes)
            for param in names:
                holders = [r for r, acc in self.grads.items() if param in acc]
                if not holders:
                    continue
                attrs = {"axis": ",".join(axes), "group_size": n, "op": st.op or "sum"}
                if kind == "reduce_scatter":
                    attrs["dim"] = st.dim or 0
                for group in self.mesh.groups(axes):
                    members = [r for r in group if r in self.grads and param in self.grads[r]]
                    if len(members) != len(group):
                        continue
                    outs = OPS[kind].evaluate([(self.grads[r][param],) for r in members], attrs)
                    for r, out in zip(members, outs, strict=True):
                        self.grads[r][param] = out
                if kind == "reduce_scatter":
                    dims = list(final[param].dims)
                    dims[st.dim or 0] = append_axes(dims[st.dim or 0], axes)
                    final[param] = TLayout(tuple(dims))
        return final


Losses = dict[tuple[int, int], float]
Grads = dict[int, dict[str, np.ndarray]]


def accumulated_gradients(lowered: Lowered, values: Mapping[str, np.ndarray],
                          graphs: list[Graph] | None = None) -> tuple[Losses, Grads]:
    """The plan side before gradient statements: local losses by ``(rank, microbatch)`` and
    every rank's accumulated parameter gradients (IR, numpy). The torch twin is
    ``simulate.eager``."""
    graphs = graphs or [stage_joint(lowered, st) for st in lowered.stages]
    run = _PlanRun(lowered, graphs, values)
    run.run()
    return run.losses, run.grads


def _zero_layout(lay: TLayout, axes: tuple[str, ...]) -> TLayout:
    """Z(P): the parameter's layout with the ZeRO axes innermost on dimension 0 (Rule 6.1)."""
    return TLayout((append_axes(lay.dims[0], axes),) + lay.dims[1:])


def simulate_lowered(lowered: Lowered, spec: Any, model: torch.nn.Module, seed: int = 0,
                     graphs: list[Graph] | None = None) -> SimulationResult:
    """Run ``lowered`` and the ``spec`` program on the same random values and compare."""
    rng = np.random.default_rng(seed)
    opt = spec_optimizer(lowered.plan)
    values = random_inputs(spec.program.inputs, model, rng)
    want = spec.evaluate(values)
    graphs = graphs or [stage_joint(lowered, st) for st in lowered.stages]
    run = _PlanRun(lowered, graphs, values)
    run.run()
    final = run.grad_statements()
    mismatches: list[Mismatch] = []
    compared = 0
    worst = 0.0

    magnitude = max((float(np.max(np.abs(v))) for k, v in want.items()
                     if np.size(v) and np.all(np.isfinite(v))), default=1.0)

    def check(tensor: str, rank: int, got: Any, expected: Any, span: Span | None) -> None:
        nonlocal compared, worst
        compared += 1
        err = rel_error(got, expected, FLOOR * magnitude)
        worst = max(worst, err)
        if not err < TOLERANCE:
            mismatches.append(Mismatch(tensor, rank, err, span))

    _check_loss(run, lowered, want["loss"], check)
    binding = lowered.binding
    for param, _ in model.named_parameters():
        span = _grad_span(binding, param)
        for rank, acc in sorted(run.grads.items()):
            if param not in acc:
                continue
            expected = take_local(want[f"grad({param})"], final[param], run.coords(rank, 0),
                                  run.sizes)
            check(f"grad({param})", rank, acc[param], expected, span)
    if opt is not None:
        _check_update(run, lowered, opt, final, values, want, check)
    holders = {p for acc in run.grads.values() for p in acc}
    for param, _ in model.named_parameters():
        if param not in holders:
            mismatches.append(Mismatch(f"grad({param})", -1, math.inf, None,
                                       "no rank computes this gradient"))
    result = SimulationResult(lowered.plan.name or "", run.mesh.world_size, worst, compared,
                              mismatches)
    result.lineage_mismatches = _check_lineages(run, lowered, model, values,
                                                FLOOR * magnitude)
    return result


def spec_values_at(model: torch.nn.Module, values: Mapping[str, np.ndarray],
                   data: list[str], points: list[str]) -> dict[str, np.ndarray]:
    """The spec's values at module boundaries (``X.in``, ``X.in#k``, ``X.out``): the model run
    eagerly in float64 on ``values`` (a torch forward; its loss and gradients are the IR
    spec's, tested in tests/test_spec_models.py)."""
    import copy

    net = copy.deepcopy(model).double()
    with torch.no_grad():
        for name, tensor in list(net.named_parameters()) + list(net.named_buffers()):
            if name in values and tensor.is_floating_point():
                tensor.copy_(torch.from_numpy(np.asarray(values[name], dtype=np.float64)))
    seen: dict[str, np.ndarray] = {}
    modules = {p.rsplit(".", 1)[0] for p in points}
    handles = []
    for path in modules:
        module = net.get_submodule(path)

        def pre(_m: Any, args: tuple[Any, ...], _p: str = path) -> None:
            for k, a in enumerate(args):
                if isinstance(a, torch.Tensor) and a.is_floating_point():
                    seen[f"{_p}.in" if k == 0 else f"{_p}.in#{k}"] = a.detach().numpy().copy()

        def post(_m: Any, _a: Any, out: Any, _p: str = path) -> None:
            if isinstance(out, torch.Tensor):
                seen[f"{_p}.out"] = out.detach().numpy().copy()

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        with torch.no_grad():
            net(*(torch.from_numpy(np.asarray(values[d])) for d in data))
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _check_lineages(run: _PlanRun, lowered: Lowered, model: torch.nn.Module,
                    values: Mapping[str, np.ndarray], floor: float) -> list[Mismatch]:
    by_point: dict[str, list[tuple[int, int, np.ndarray]]] = {}
    for (point, rank, m), piece in run.observed.items():
        by_point.setdefault(point, []).append((rank, m, piece))
    points = list(by_point)
    if not points:
        return []
    data = list(lowered.binding.data)  # model inputs, in forward-argument order
    want = spec_values_at(model, values, data, points)
    found: list[Mismatch] = []
    for point in points:
        lay = lowered.lineages[point]
        if point not in want:
            continue
        statements = lowered.binding.collectives_at(point)
        span = statements[-1].origin.span if statements else None
        for rank, m, piece in sorted(by_point[point], key=lambda item: item[:2]):
            coords = run.coords(rank, m)
            got = piece
            if lay.partial and MICROBATCH_AXIS in lay.partial[1]:
                continue  # a mean over microbatches is no local piece to compare
            if lay.partial:
                op, axes = lay.partial
                group = run.mesh.group(rank, tuple(a for a in axes if a in run.mesh.sizes))
                pieces = [run.observed.get((point, r, m)) for r in group]
                if any(x is None for x in pieces):
                    continue
                got = OPS["all_reduce"].evaluate([(x,) for x in pieces],
                                                 {"axis": ",".join(axes), "op": op,
                                                  "group_size": len(group)})[0]
            expected = take_local(want[point], lay, coords, run.sizes)
            err = rel_error(got, expected, floor)
            if not err < TOLERANCE:
                found.append(Mismatch(point, rank, err, span,
                                      f"local piece vs lineage {lay.describe()}, microbatch {m}"))
                break
    return found


def _grad_span(binding: Any, param: str) -> Span | None:
    spans = [st.origin.span for st, names in binding.grad_statements if param in names]
    return spans[-1] if spans else binding.param_span(param)


def _check_loss(run: _PlanRun, lowered: Lowered, want: Any, check: Any) -> None:
    data_axes = lowered.binding.data_axes()
    blocks: dict[tuple, list[float]] = {}
    copies: dict[tuple, list[tuple[int, float]]] = {}
    for (rank, m), value in sorted(run.losses.items()):
        coords = run.mesh.coords(rank)
        key = tuple(coords[a] for a in sorted(data_axes)) + (m,)
        copies.setdefault(key, []).append((rank, value))
    span = lowered.binding.loss_span()
    for key, items in copies.items():
        first = items[0][1]
        for rank, value in items[1:]:
            check("loss (copy)", rank, np.array(value), np.array(first), span)
        blocks[key] = [first]
    if not blocks:
        check("loss", -1, np.array(math.nan), np.asarray(want), span)
        return
    plan_loss = float(np.mean([v[0] for v in blocks.values()]))
    check("loss", -1, np.array(plan_loss), np.asarray(want), span)


def _check_update(run: _PlanRun, lowered: Lowered, opt: Any, final: dict[str, TLayout],
                  values: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray],
                  check: Any) -> None:
    shard = lowered.plan.optimizer.shard_axes if lowered.plan.optimizer else ()
    span = lowered.plan.optimizer.origin.span if lowered.plan.optimizer else None
    for param in sorted({p for acc in run.grads.values() for p in acc}):
        lay = run.layouts[param]
        block = _zero_layout(lay, tuple(shard)) if shard else lay
        new_pieces: dict[int, np.ndarray] = {}
        for rank, acc in sorted(run.grads.items()):
            if param not in acc:
                continue
            coords = run.coords(rank, 0)
            grad = acc[param]
            if shard and final[param] == lay:  # all-reduced: take this rank's ZeRO block
                grad = _block(grad, lay, block, coords, run.sizes)
            local_p = take_local(values[param], block, coords, run.sizes)
            states = [take_local(values[f"{s}({param})"], block, coords, run.sizes)
                      for s in opt.states]
            graph = optim.update_graph(opt, TensorType(local_p.shape, "f64"))
            feed = dict(zip([g.name for g in graph.inputs], [local_p, grad, *states],
                            strict=True))
            out = evaluate_graph(graph, feed)
            for s in opt.states:
                expected = take_local(want[f"new({s}({param}))"], block, coords, run.sizes)
                check(f"new({s}({param}))", rank, out[f"new({s})"], expected, span)
            new_pieces[rank] = out["new(param)"]
        if shard:
            new_pieces = _all_gather_blocks(run, new_pieces, tuple(shard))
        for rank, piece in new_pieces.items():
            expected = take_local(want[f"new({param})"], lay, run.coords(rank, 0), run.sizes)
            check(f"new({param})", rank, piece, expected, span)


def _block(grad: np.ndarray, lay: TLayout, block: TLayout, coords: Mapping[str, int],
           sizes: Mapping[str, int]) -> np.ndarray:
    """This rank's ZeRO block of its local piece: block ``k_A`` of the local rows."""
    n = block.local_shape(sizes)[0]
    index = 0
    for a in block.dims[0][0].axes[len(lay.dims[0][0].axes):]:
        index = index * sizes[a] + coords[a]
    return grad[index * n:(index + 1) * n]


def _all_gather_blocks(run: _PlanRun, pieces: dict[int, np.ndarray],
                       axes: tuple[str, ...]) -> dict[int, np.ndarray]:
    n = math.prod(run.sizes[a] for a in axes)
    out: dict[int, np.ndarray] = {}
    for group in run.mesh.groups(axes):
        members = [r for r in group if r in pieces]
        if len(members) != len(group):
            continue
        gathered = OPS["all_gather"].evaluate([(pieces[r],) for r in members],
                                              {"axis": ",".join(axes), "dim": 0,
                                               "group_size": n})
        out.update(zip(members, gathered, strict=True))
    return out


def simulate(plan: Plan, model: torch.nn.Module, real_model: torch.nn.Module,
             inputs: Mapping[str, torch.Tensor], spec: Any, seed: int = 0) -> SimulationResult:
    lowered = lower(plan, model, inputs)
    return simulate_lowered(lowered, spec, real_model, seed)
