"""The parallel program: a plan's whole training step as plain data (docs/semantics.md).

Each stage's local forward and backward is an IR graph; the rest of the step is data too:
the transfers between stages, the backward seed (an exact rational), the microbatch count,
the gradient statements, the optimizer with its ZeRO blocks, the loss reduction, the lineages
at marked points and the plan's layout claims. Every element carries the ``Source`` of the
plan statement it came from. ``evaluate_parallel`` (``ir/execute.py``) runs it; the checker
proves it equal to the reference step. Nothing here reads the plan, the binding or torch.

Invariants (``parallel_problems``):

1. Every stage graph verifies; its inputs and outputs are exactly its slots, in order.
2. Every ``recv`` input of a stage has exactly one transfer, from an earlier stage's ``send``
   output of the same local shape, or a free value (``source is None``); every transfer's
   destination exists.
3. Every gradient statement's axes are mesh axes, and every member of each of its groups holds
   the parameters it names — except the embedding group: an ``all_reduce`` over the pipeline
   axis alone, whose group is the pp ranks holding a copy of a tied parameter; each parameter
   it names is held on two or more pp ranks (over one it has no meaning and is rejected before
   this point).
4. The loss is produced by exactly one stage. A ``token-mean`` loss has a count graph that
   reads only data of that stage, and only that stage reads the ``denominator``.
5. The optimizer updates every parameter with a gradient, once; its update graph's inputs are
   ``param, grad, <states>`` at the block's local shape, and the final gradient layout is the
   parameter's layout or its block layout.
6. Group sizes match the mesh: every axis named anywhere is a mesh axis (or ``@mb``).
7. Gradient clipping has a square and a scale graph for every held gradient, at the local
   shape of its final layout, and its norm group names mesh axes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from trainverify_dsl.ir.graph import Graph
from trainverify_dsl.ir.layout import MICROBATCH_AXIS, TLayout, append_axes
from trainverify_dsl.ir.printer import format_graph
from trainverify_dsl.ir.verify import graph_problems
from trainverify_dsl.report.span import Span


@dataclass(frozen=True, slots=True)
class Source:
    """The plan statement an element comes from: ``span`` is where to report (the outermost
    ``apply`` line for a template statement), ``statement`` the statement itself, ``notes``
    the expansion chain (innermost first)."""

    span: Span | None
    statement: Span | None = None
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        return str(self.span) if self.span is not None else "(implied)"


NO_SOURCE = Source(None)

#: Slot kinds. Inputs: values from the step's inputs (``param``, ``buffer``, ``data``), the
#: rank's coordinate (``coord``), a boundary value (``recv``), the loss cotangent (``seed``)
#: and cotangents of outputs (``cotangent``), the step's token count (``denominator``, a
#: ``token-mean`` loss, §4.3). Outputs: ``loss``, ``send``, ``lineage`` (the
#: value at a marked point), ``grad`` (a parameter's local gradient), ``grad-recv``.
INPUT_KINDS = ("param", "buffer", "data", "coord", "recv", "seed", "cotangent",
               "denominator")
OUTPUT_KINDS = ("loss", "send", "lineage", "grad", "grad-recv")


@dataclass(frozen=True, slots=True)
class Slot:
    """One input or output of a stage graph: ``name`` is the graph's, ``spec`` the spec
    tensor, boundary id, axis or output it stands for, ``layout`` its lineage."""

    name: str
    kind: str
    spec: str
    layout: TLayout


@dataclass(frozen=True, slots=True)
class Stage:
    """Stage ``index`` in the pipeline's data order. It runs on the ranks whose pipeline
    coordinate is ``place`` (``None``: ``index``); virtual stages of an interleaved schedule
    share a pp rank (chunk ``c`` of rank ``r`` is stage ``c * pp + r``)."""

    index: int
    graph: Graph
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    place: int | None = None

    @property
    def rank(self) -> int:
        """The pipeline coordinate of the ranks that run this stage."""
        return self.index if self.place is None else self.place

    def output(self, kind: str) -> tuple[Slot, ...]:
        return tuple(s for s in self.outputs if s.kind == kind)


@dataclass(frozen=True, slots=True)
class Transfer:
    """Stage ``dest`` reads its boundary input ``value`` from stage ``source``'s output
    ``sent`` (the same id, unless an explicit ``send`` reroutes it); ``source is None``: a
    free value (whatever the receive buffer held, Rule 5.2). ``point``: the marked point the
    value is (``layers.3.out``), when the lowering marked one there."""

    dest: int
    value: str
    source: int | None
    sent: str | None
    origin: Source = NO_SOURCE
    point: str | None = None


@dataclass(frozen=True, slots=True)
class GradSync:
    """A gradient statement (§4.5): ``kind`` ``all_reduce`` or ``reduce_scatter``. ``after``
    is when it runs: ``0`` after the last microbatch (on the accumulated gradient), ``-1``
    after every microbatch, ``k`` after microbatch ``k`` (1-based) — a microbatch's
    contribution goes through the statement when the statement runs at or after it."""

    kind: str
    axes: tuple[str, ...]
    op: str
    dim: int
    params: tuple[str, ...]
    origin: Source
    after: int = 0

    def reduces(self, m: int, microbatches: int) -> bool:
        """Whether microbatch ``m``'s (0-based) contribution goes through the statement."""
        return self.after <= 0 or m < self.after or self.after >= microbatches


@dataclass(frozen=True, slots=True)
class ParamUpdate:
    """The optimizer step of one parameter on every rank holding it: the update graph runs
    on the rank's ``block`` (the parameter's layout, or ``Z(P)`` under ZeRO-1)."""

    param: str
    layout: TLayout
    block: TLayout
    states: tuple[str, ...]
    graph: Graph
    #: the hyper-parameters of its update (the optimizer's, or its parameter group's, §6.5)
    hyper: tuple[tuple[str, object], ...] = ()
    #: a parameter group's statement (``NO_SOURCE``: the plan-wide optimizer's)
    group: Source = NO_SOURCE


@dataclass(frozen=True, slots=True)
class OptimizerOverride:
    """A per-rank override (§6.4): on the ranks whose mesh coordinates are ``coords`` the
    update of parameter ``p`` runs ``dict(graphs)[p]`` (the same inputs and block as the
    plan-wide update, other hyper-parameters). ``hyper``: the ones the override states, in
    place of each update's own."""

    coords: tuple[tuple[str, int], ...]
    hyper: tuple[tuple[str, object], ...]
    graphs: tuple[tuple[str, Graph], ...]
    origin: Source = NO_SOURCE

    def matches(self, coords: Mapping[str, int]) -> bool:
        return all(coords.get(axis) == k for axis, k in self.coords)


@dataclass(frozen=True, slots=True)
class OptimizerStep:
    kind: str
    #: hyper-parameters as written, exact (``betas`` a tuple)
    hyper: tuple[tuple[str, object], ...]
    shard_axes: tuple[str, ...]
    updates: tuple[ParamUpdate, ...]
    origin: Source
    #: ``on AXIS=K: optimizer ...``: at most one holds on any rank
    overrides: tuple[OptimizerOverride, ...] = ()

    def override_for(self, coords: Mapping[str, int]) -> OptimizerOverride | None:
        return next((o for o in self.overrides if o.matches(coords)), None)


@dataclass(frozen=True, slots=True)
class GradClip:
    """``clip-grad-norm`` (§6.3), between the gradient statements and the optimizer: every
    rank adds the squares of the gradients it holds (``squares[p]``, accumulated with
    ``add``), the sums are all-reduced over ``axes`` (the norm group), and every gradient is
    multiplied by ``coefficient(total)``. With ``replicas == "once"`` a rank counts a gradient
    only at coordinate 0 of each group axis that does not split it (the pipeline axis never
    holds copies); with ``"each"`` every copy counts."""

    max_norm: Fraction
    axes: tuple[str, ...]
    replicas: str
    squares: tuple[tuple[str, Graph], ...]
    scales: tuple[tuple[str, Graph], ...]
    add: Graph
    coefficient: Graph
    origin: Source = NO_SOURCE


@dataclass(frozen=True, slots=True)
class LossReduction:
    """§4.3, §4.6: how the local losses make the logical loss; every axis but the data axes
    holds equal copies. ``local-mean``: the mean over data blocks (the ``data_axes``) and
    microbatches. ``token-mean``: each local loss is divided by the step's token count ``D``
    (the ``count`` graph's value summed over the microbatches and the data blocks along
    ``counted``, fed to the loss stage's ``denominator`` input); the logical loss is the sum
    over those blocks and the microbatches, the mean over the other data axes. ``sum``: the
    sum over every data block and microbatch (the stage graph applies the scale)."""

    data_axes: tuple[str, ...]
    origin: Source = NO_SOURCE
    mode: str = "local-mean"
    counted: tuple[str, ...] = ()
    #: ``token-mean``: the loss stage's local token counts, from inputs of that stage (by
    #: name) to one output per normaliser of the loss, ``count``, ``count.1``, ...
    #: (``count_output``), each summed into the stage input ``denominator_input(k)``
    count: Graph | None = None
    #: ``local-mean`` of a loss divided by a token count of the data: the axes (and ``@mb``)
    #: whose blocks each divide by their own count, equal to the spec's loss only for inputs
    #: where every block counts the same tokens (``tvp check`` never proves it, §4.3)
    local_counts: tuple[str, ...] = ()
    #: ``sum scale=s`` of a loss divided by a token count of the data: a fixed number where
    #: the spec divides by the count (equal only for inputs counting 1/s tokens, §4.3)
    fixed_count: bool = False

    @property
    def summed(self) -> tuple[str, ...]:
        """The data axes over whose blocks the local losses are summed (not averaged)."""
        return {"local-mean": (), "token-mean": self.counted}.get(self.mode, self.data_axes)

    @property
    def sums_microbatches(self) -> bool:
        return self.mode != "local-mean"

    def describe(self) -> str:
        axes = ", ".join(self.data_axes)
        if self.mode == "local-mean":
            return f"loss mean over data axes ({axes}) and microbatches"
        if self.mode == "sum":
            return f"loss sum over data axes ({axes}) and microbatches"
        return (f"loss token-mean: divided by the token count over ({', '.join(self.counted)})"
                f" and microbatches, summed over them, mean over data axes ({axes})")


@dataclass(frozen=True, slots=True)
class Lineage:
    """The derived layout of the value at a marked point (§2.5), after its collectives."""

    point: str
    layout: TLayout
    origin: Source = NO_SOURCE


@dataclass(frozen=True, slots=True)
class Claim:
    """A layout statement on a computed tensor (§2.4): ``target`` is a marked point,
    ``loss`` or ``grad(<param>)``."""

    target: str
    layout: TLayout
    origin: Source


@dataclass(frozen=True, slots=True)
class ParallelProgram:
    name: str
    #: ``(axis, size)``, outermost first
    mesh: tuple[tuple[str, int], ...]
    #: the axis whose coordinate is the pipeline stage (``None``: one stage on every rank)
    pipeline_axis: str | None
    microbatches: int
    schedule: str
    #: the cotangent every local backward starts from (the plan's ``loss-scale``)
    seed: Fraction
    stages: tuple[Stage, ...]
    transfers: tuple[Transfer, ...]
    grad_syncs: tuple[GradSync, ...]
    optimizer: OptimizerStep | None
    loss: LossReduction
    lineages: tuple[Lineage, ...]
    claims: tuple[Claim, ...]
    #: every parameter's layout (the distribution the plan defines)
    param_layouts: tuple[tuple[str, TLayout], ...]
    #: the layout statement that distributes each parameter (absent: replicated by default)
    param_sources: tuple[tuple[str, Source], ...] = ()
    #: ``clip-grad-norm`` (``None``: no clipping)
    clip: GradClip | None = None
    #: where the seed is stated: the ``loss-scale`` statement, else ``microbatches``
    seed_origin: Source = NO_SOURCE

    @property
    def sizes(self) -> dict[str, int]:
        """Axis sizes, with the microbatch pseudo-axis ``@mb``."""
        return {**dict(self.mesh), MICROBATCH_AXIS: self.microbatches}

    @property
    def world_size(self) -> int:
        return math.prod(size for _, size in self.mesh)

    def param_layout(self, param: str) -> TLayout:
        return dict(self.param_layouts)[param]

    def holders(self, param: str) -> tuple[int, ...]:
        """The stages that compute a gradient of ``param``."""
        return tuple(st.index for st in self.stages
                     if any(s.spec == param for s in st.output("grad")))

    def holding_ranks(self, param: str) -> tuple[int, ...]:
        """The pipeline coordinates whose ranks hold ``param``: one, or several for a tied
        parameter used on several stages (each holds a copy, docs/semantics.md §5.4)."""
        return tuple(sorted({self.stages[i].rank for i in self.holders(param)}))

    def final_grad_layouts(self) -> dict[str, TLayout]:
        """Every parameter's gradient layout after the gradient statements (§4.5)."""
        final = {p: lay for p, lay in self.param_layouts}
        for sync in self.grad_syncs:
            if sync.kind != "reduce_scatter":
                continue
            for param in sync.params:
                dims = list(final[param].dims)
                dims[sync.dim] = append_axes(dims[sync.dim], sync.axes)
                final[param] = TLayout(tuple(dims))
        return final


def zero_block(layout: TLayout, axes: tuple[str, ...]) -> TLayout:
    """``Z(P)``: the parameter's layout with the ZeRO axes innermost on dimension 0 (§6.2)."""
    if not axes:
        return layout
    return TLayout((append_axes(layout.dims[0], axes),) + layout.dims[1:])


# -- verifier ------------------------------------------------------------------------------


def parallel_problems(program: ParallelProgram) -> list[str]:
    """Every invariant violation (module docstring) as a message; empty when well formed."""
    problems: list[str] = []
    sizes = program.sizes
    for stage in program.stages:
        problems += _stage_problems(stage, sizes)
    problems += _transfer_problems(program)
    problems += _sync_problems(program)
    losses = [st.index for st in program.stages if st.output("loss")]
    if len(losses) != 1:
        problems.append(f"the loss is produced by stages {losses}, expected exactly one")
    problems += _loss_problems(program)
    problems += _clip_problems(program)
    problems += _optimizer_problems(program)
    return problems


def count_output(k: int) -> str:
    """The count graph's output of the loss's ``k``-th normaliser (``token-mean``)."""
    return "count" if k == 0 else f"count.{k}"


def denominator_input(k: int) -> str:
    """The loss stage's input of the ``k``-th normaliser's step count."""
    return "loss" if k == 0 else f"loss.{k}"


def _loss_problems(program: ParallelProgram) -> list[str]:
    """A ``token-mean`` has a count graph reading only data of the loss stage, and only the
    loss stage reads the denominator."""
    loss = program.loss
    problems: list[str] = []
    readers = [st.index for st in program.stages
               if any(s.kind == "denominator" for s in st.inputs)]
    if (loss.mode == "token-mean") != (loss.count is not None):
        problems.append(f"a {loss.mode} loss {'without' if loss.count is None else 'with'} "
                        "a count graph")
    if loss.count is None:
        if readers:
            problems.append(f"stages {readers} read a denominator without a token-mean")
        return problems
    stage = next((st for st in program.stages if st.output("loss")), None)
    if stage is None or readers != [stage.index]:
        problems.append(f"the denominator is read by stages {readers}, not the loss stage")
        return problems
    slots = {s.name: s for s in stage.inputs}
    for g in loss.count.inputs:
        slot = slots.get(g.name)
        if slot is None or slot.kind not in ("param", "buffer", "data", "coord"):
            problems.append(f"the token count reads {g.name}, not data of the loss stage")
    outputs = loss.count.output_names
    if not outputs or outputs != tuple(count_output(k) for k in range(len(outputs))):
        problems.append("the count graph's outputs are not `count`, `count.1`, ... in order")
    denominators = sorted(s.name for s in stage.inputs if s.kind == "denominator")
    if denominators != sorted(denominator_input(k) for k in range(len(outputs))):
        problems.append(f"the loss stage reads the denominators {denominators}, not one per "
                        "count")
    problems += [f"count: %{v}: {m}" for v, m in graph_problems(loss.count)]
    unknown = [a for a in loss.counted if a not in loss.data_axes]
    if unknown:
        problems.append(f"the token count sums over {unknown}, which are no data axes")
    return problems


def _stage_problems(stage: Stage, sizes: Mapping[str, int]) -> list[str]:
    where = f"stage {stage.index}"
    problems = [f"{where}: %{v}: {m}"
                for v, m in graph_problems(stage.graph, allow_collectives=True)]
    names = tuple(g.name for g in stage.graph.inputs)
    if names != tuple(s.name for s in stage.inputs):
        problems.append(f"{where}: graph inputs {names[:4]}... differ from its input slots")
    if stage.graph.output_names != tuple(s.name for s in stage.outputs):
        problems.append(f"{where}: graph outputs differ from its output slots")
    for slot in stage.inputs + stage.outputs:
        unknown = [a for d in slot.layout.dims for f in d for a in f.axes if a not in sizes]
        if unknown:
            problems.append(f"{where}: {slot.name} is laid out over unknown axes {unknown}")
    return problems


def _transfer_problems(program: ParallelProgram) -> list[str]:
    problems: list[str] = []
    by_dest = {}
    for t in program.transfers:
        if (t.dest, t.value) in by_dest:
            problems.append(f"stage {t.dest}: two transfers deliver recv.{t.value}")
        by_dest[(t.dest, t.value)] = t
    sizes = program.sizes
    for stage in program.stages:
        for slot in stage.inputs:
            if slot.kind != "recv":
                continue
            t = by_dest.get((stage.index, slot.spec))
            if t is None:
                problems.append(f"stage {stage.index}: recv.{slot.spec} has no transfer")
            elif t.source is not None:
                problems += _transfer_source_problems(program, t, slot, sizes)
    return problems


def _transfer_source_problems(program: ParallelProgram, t: Transfer, slot: Slot,
                              sizes: Mapping[str, int]) -> list[str]:
    if not 0 <= t.source < t.dest:  # type: ignore[operator]
        return [f"stage {t.dest}: recv.{t.value} comes from stage {t.source}, not an earlier one"]
    sent = {s.spec: s for s in program.stages[t.source].output("send")}  # type: ignore[index]
    if t.sent not in sent:
        return [f"stage {t.dest}: recv.{t.value}: stage {t.source} sends no {t.sent}"]
    if sent[t.sent].layout.local_shape(sizes) != slot.layout.local_shape(sizes):
        return [f"stage {t.dest}: recv.{t.value} and send.{t.sent} differ in local shape"]
    return []


def _sync_problems(program: ParallelProgram) -> list[str]:
    problems: list[str] = []
    mesh = dict(program.mesh)
    for sync in program.grad_syncs:
        unknown = [a for a in sync.axes if a not in mesh]
        if unknown:
            problems.append(f"{sync.origin.describe()}: unknown axes {unknown}")
            continue
        if program.pipeline_axis not in sync.axes:
            continue
        if sync.axes != (program.pipeline_axis,) or sync.kind != "all_reduce":
            problems.append(f"{sync.origin.describe()}: a {sync.kind} over "
                            f"{', '.join(sync.axes)}: over the pipeline axis only the "
                            "all-reduce of a tied parameter's copies has a meaning")
            continue
        for param in sync.params:
            if len(program.holding_ranks(param)) < 2:
                problems.append(f"{sync.origin.describe()}: grad({param}) is reduced over "
                                f"{program.pipeline_axis}, but only stages "
                                f"{list(program.holders(param))} hold it")
    return problems


def _clip_problems(program: ParallelProgram) -> list[str]:
    clip = program.clip
    if clip is None:
        return []
    mesh, final, sizes = dict(program.mesh), program.final_grad_layouts(), program.sizes
    problems = [f"clip-grad-norm: unknown axis {a}" for a in clip.axes if a not in mesh]
    squares, scales = dict(clip.squares), dict(clip.scales)
    for param, _ in program.param_layouts:
        if not program.holders(param):
            continue
        shape = final[param].local_shape(sizes)
        for what, graphs in (("square", squares), ("scale", scales)):
            graph = graphs.get(param)
            if graph is None:
                problems.append(f"clip-grad-norm has no {what} graph for grad({param})")
            elif graph.inputs[0].type.shape != shape:
                problems.append(f"clip-grad-norm {what} of grad({param}): shape "
                                f"{graph.inputs[0].type.shape}, the gradient's is {shape}")
    return problems


def _optimizer_problems(program: ParallelProgram) -> list[str]:
    opt = program.optimizer
    if opt is None:
        return []
    problems: list[str] = []
    final = program.final_grad_layouts()
    updated = [u.param for u in opt.updates]
    if len(set(updated)) != len(updated):
        problems.append("the optimizer updates a parameter twice")
    sizes = program.sizes
    for u in opt.updates:
        if final[u.param] not in (u.layout, u.block):
            problems.append(f"grad({u.param}) ends in layout {final[u.param].describe()}, "
                            f"neither the parameter's nor its block {u.block.describe()}")
        want = ("param", "grad") + u.states
        got = tuple(g.name for g in u.graph.inputs)
        if got != want:
            problems.append(f"update of {u.param}: inputs {got}, expected {want}")
        elif u.graph.inputs[0].type.shape != u.block.local_shape(sizes):
            problems.append(f"update of {u.param}: shape {u.graph.inputs[0].type.shape} is not "
                            f"the block's {u.block.local_shape(sizes)}")
    missing = {p for p, _ in program.param_layouts if program.holders(p)} - set(updated)
    problems += [f"the optimizer does not update {p}" for p in sorted(missing)]
    for o in opt.overrides:
        where = f"override on {_coords_text(o.coords)}"
        if any(a not in sizes or not 0 <= k < sizes[a] for a, k in o.coords):
            problems.append(f"{where}: a coordinate outside the mesh")
        graphs = dict(o.graphs)
        if set(graphs) != set(updated):
            problems.append(f"{where}: updates {sorted(graphs)}, not the optimizer's parameters")
        for u in opt.updates:
            g = graphs.get(u.param)
            if g is not None and g.inputs != u.graph.inputs:
                problems.append(f"{where}: the update of {u.param} has other inputs")
    for i, a in enumerate(opt.overrides):
        for b in opt.overrides[i + 1:]:
            if all(dict(a.coords).get(axis, k) == k for axis, k in b.coords):
                problems.append(f"overrides on {_coords_text(a.coords)} and "
                                f"{_coords_text(b.coords)} hold on the same ranks")
    return problems


def _coords_text(coords: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{a}={k}" for a, k in coords)


# -- printer ---------------------------------------------------------------------------------


def _fraction(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def _where(origin: Source) -> str:
    if origin.span is None:
        return ""
    return f"  @ {origin.span.line}:{origin.span.col}"


def format_parallel(program: ParallelProgram, graphs: bool = True) -> str:
    """The canonical text of a parallel program (stage graphs included unless ``graphs`` is
    false). Spans print as ``@ line:col`` so the text does not depend on where the file is."""
    mesh = ", ".join(f"{a}={n}" for a, n in program.mesh)
    lines = [f"parallel {program.name}",
             f"  mesh {mesh}; pipeline axis {program.pipeline_axis or '-'}",
             f"  microbatches {program.microbatches} schedule {program.schedule}; "
             f"seed {_fraction(program.seed)}",
             f"  {program.loss.describe()}{_where(program.loss.origin)}"]
    for param, lay in program.param_layouts:
        lines.append(f"  param {param}: {lay.describe()}")
    for stage in program.stages:
        lines.append(f"stage {stage.index}" + ("" if stage.place is None else
                                                f" on pipeline rank {stage.place}"))
        for kind, slots in (("in", stage.inputs), ("out", stage.outputs)):
            for s in slots:
                lines.append(f"  {kind} {s.kind} {s.name} = {s.spec}: {s.layout.describe()}")
        if graphs:
            lines.append(format_graph(stage.graph, f"stage{stage.index}").rstrip("\n"))
    for t in program.transfers:
        source = "free value" if t.source is None else f"stage {t.source} send.{t.sent}"
        point = f" ({t.point})" if t.point is not None else ""
        lines.append(f"transfer stage {t.dest} recv.{t.value}{point} <- {source}"
                     f"{_where(t.origin)}")
    for s in program.grad_syncs:
        after = "" if s.after == 0 else " after=each" if s.after < 0 else f" after={s.after}"
        lines.append(f"sync {s.kind} over {','.join(s.axes)} op={s.op} dim={s.dim}{after}: "
                     f"{', '.join(s.params)}{_where(s.origin)}")
    lines += _format_clip(program.clip, graphs)
    lines += _format_optimizer(program.optimizer, graphs)
    for lin in program.lineages:
        lines.append(f"lineage {lin.point}: {lin.layout.describe()}")
    for c in program.claims:
        lines.append(f"claim {c.target}: {c.layout.describe()}{_where(c.origin)}")
    return "\n".join(lines) + "\n"


def _format_clip(clip: GradClip | None, graphs: bool) -> list[str]:
    if clip is None:
        return []
    lines = [f"clip-grad-norm {_fraction(clip.max_norm)} over {','.join(clip.axes)} "
             f"replicas={clip.replicas}{_where(clip.origin)}"]
    if graphs:
        lines.append(format_graph(clip.coefficient, "coefficient").rstrip("\n"))
    return lines


def _format_optimizer(opt: OptimizerStep | None, graphs: bool) -> list[str]:
    if opt is None:
        return ["optimizer none"]
    hyper = " ".join(f"{k}={v}" for k, v in opt.hyper)
    shard = f" shard over {','.join(opt.shard_axes)}" if opt.shard_axes else ""
    lines = [f"optimizer {opt.kind} {hyper}{shard}{_where(opt.origin)}"]
    printed: set[Graph] = set()
    for u in opt.updates:
        group = ""
        if u.group.span is not None:
            shown = " ".join(f"{k}={v}" for k, v in u.hyper)
            group = f" group {shown}{_where(u.group)}"
        lines.append(f"  update {u.param}: block {u.block.describe()} states "
                     f"({', '.join(u.states)}){group}")
        if graphs and u.graph not in printed:
            printed.add(u.graph)
            lines.append(format_graph(u.graph, "update").rstrip("\n"))
    for o in opt.overrides:
        hyper = " ".join(f"{k}={v}" for k, v in o.hyper)
        lines.append(f"  on {_coords_text(o.coords)}: {opt.kind} {hyper}{_where(o.origin)}")
        for _, g in o.graphs if graphs else ():
            if g not in printed:
                printed.add(g)
                lines.append(format_graph(g, "update").rstrip("\n"))
    return lines
