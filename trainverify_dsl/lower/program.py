"""Lowered plan -> ``ParallelProgram`` (``ir/parallel.py``): the plan's step as data.

The stage graphs are the joint forward/backward IR of each stage's local program
(``joint.stage_joint``); everything else the plan states becomes a field of the program with
the ``Source`` of its statement: transfers (implied, or rerouted by ``send``), the seed
(``loss-scale``), gradient statements, the optimizer with its update graphs at block shapes,
the loss reduction, lineages and claims. After this point nothing reads ``Plan`` or
``Binding``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from trainverify_dsl.ir.graph import Graph, restrict
from trainverify_dsl.ir.layout import MICROBATCH_AXIS, Factor, TLayout
from trainverify_dsl.ir.parallel import (
    NO_SOURCE,
    Claim,
    GradClip,
    GradSync,
    Lineage,
    LossReduction,
    OptimizerOverride,
    OptimizerStep,
    ParallelProgram,
    ParamUpdate,
    Slot,
    Source,
    Stage,
    Transfer,
    zero_block,
)
from trainverify_dsl.ir.types import TensorType
from trainverify_dsl.lower.findings import Finding, LoweringError
from trainverify_dsl.lower.joint import input_name, output_name, stage_joints
from trainverify_dsl.lower.lowering import Lowered, StageProgram
from trainverify_dsl.plan.checks import sync_time
from trainverify_dsl.plan.model import PIPELINE_AXIS, ZIGZAG, Layout, Partial, group_of
from trainverify_dsl.report import codes_lower
from trainverify_dsl.spec import optim
from trainverify_dsl.spec.marks import module_of

#: Gradient statements with a meaning on accumulated gradients (§4.5).
GRAD_SYNC_KINDS = {"all-reduce": "all_reduce", "reduce-scatter": "reduce_scatter"}


def source_of(origin: Any) -> Source:
    """A plan ``Origin`` as an IR ``Source``."""
    if origin is None:
        return Source(None)
    return Source(origin.report_span, origin.span, origin.notes())


def _span_source(span: Any) -> Source:
    return Source(span, span)


# -- stages ----------------------------------------------------------------------------------


def _stage(lowered: Lowered, program: StageProgram, graph: Graph) -> Stage:
    by_input = {input_name(s): s for s in program.inputs}
    by_output = {output_name(s): s for s in program.outputs}
    params = lowered.binding.params
    layouts = {s.spec: s.layout for st in lowered.stages for s in st.inputs}
    loss = lowered.lineages.get("loss", TLayout(()))
    inputs = []
    for g in graph.inputs:
        slot = by_input.get(g.name)
        if slot is not None:
            inputs.append(Slot(g.name, slot.kind, slot.spec, slot.layout))
        elif g.name == "seed":
            inputs.append(Slot(g.name, "seed", "loss", loss))
        else:
            out = g.name.removeprefix("cotangent.")
            out = out if out.startswith("lineage.") else f"send.{out}"
            inputs.append(Slot(g.name, "cotangent", out, by_output[out].layout))
    outputs = []
    for name, _ in graph.outputs:
        if name == "count":  # the token count: the loss reduction's graph (``_loss``)
            continue
        slot = by_output.get(name)
        if slot is not None:
            outputs.append(Slot(name, slot.kind, slot.spec, slot.layout))
        elif name.startswith("grad(recv."):
            spec = name[len("grad(recv."):-1]
            outputs.append(Slot(name, "grad-recv", spec, by_input[f"recv.{spec}"].layout))
        else:
            param = name[len("grad("):-1]
            if param not in params:
                raise AssertionError(f"stage output {name} is no parameter gradient")
            outputs.append(Slot(name, "grad", param, layouts[param]))
    binding = lowered.binding
    place = binding.stage_place(program.index) if binding.virtual else None
    graph = restrict(graph, tuple(s.name for s in outputs))
    return Stage(program.index, graph, tuple(inputs), tuple(outputs), place)


def _loss(lowered: Lowered, graphs: list[Graph]) -> LossReduction:
    """§4.3, §4.6: the loss reduction, with a ``token-mean``'s count graph (the stage graph's
    ``count`` output, restricted to what it reads)."""
    binding = lowered.binding
    reduction = lowered.plan.loss_reduction
    origin = source_of(reduction.origin) if reduction is not None else \
        _span_source(binding.loss_span())
    data = tuple(sorted(binding.data_axes()))
    if reduction is None or reduction.mode == "local-mean":
        return LossReduction(data, origin, local_counts=lowered.local_counts)
    if reduction.mode == "sum":
        return LossReduction(data, origin, "sum", fixed_count=lowered.fixed_count)
    counted = lowered.loss_count_axes
    graph = next(g for g in graphs if "count" in g.output_names)
    counts = tuple(name for name in graph.output_names
                   if name == "count" or name.startswith("count."))
    return LossReduction(data, origin, "token-mean", counted,
                         restrict(graph, counts, drop_inputs=True))


def _transfers(lowered: Lowered) -> tuple[Transfer, ...]:
    home = {s.spec: st.index for st in lowered.stages for s in st.outputs if s.kind == "send"}
    sends = {dest: span for _, _, dest, span in lowered.binding.sends}
    out = []
    for st in lowered.stages:
        for slot in st.inputs:
            if slot.kind != "recv":
                continue
            explicit = (st.index, slot.spec) in lowered.routes
            sent = lowered.routes.get((st.index, slot.spec), slot.spec)
            origin = _span_source(sends.get(st.index)) if explicit else Source(None)
            source = home.get(sent) if sent is not None else None
            out.append(Transfer(st.index, slot.spec, source, sent, origin,
                                lowered.points.get(slot.spec)))
    return tuple(out)


# -- the step after the backward ---------------------------------------------------------------


def _grad_syncs(lowered: Lowered) -> tuple[GradSync, ...]:
    out = []
    for st, names in lowered.binding.grad_statements:
        kind = GRAD_SYNC_KINDS.get(st.kind)
        if kind is None:
            raise LoweringError(Finding(
                codes_lower.COLLECTIVE_MISMATCH, f"`{st.kind}` on a gradient has no meaning after "
                "accumulation: gradient statements are `all-reduce` and `reduce-scatter` "
                "(docs/semantics.md §4.5)", st.origin.report_span, str(st.target)))
        time = sync_time(st, lowered.plan.microbatches)
        after = 0 if time == "last" else -1 if time == "each" else int(time)
        out.append(GradSync(kind, tuple(st.axes), st.op or "sum",
                            st.dim or 0 if kind == "reduce_scatter" else 0, names,
                            source_of(st.origin), after))
    return tuple(out)


def _clip(lowered: Lowered, stages: tuple[Stage, ...],
          final: dict[str, TLayout]) -> GradClip | None:
    """``clip-grad-norm`` (§6.3) on the gradients each rank holds after the gradient
    statements; the norm group defaults to every mesh axis."""
    clip = lowered.plan.clip_grad_norm
    if clip is None:
        return None
    held = {s.spec: st for st in stages for s in st.output("grad")}
    sizes = lowered.sizes
    types: dict[str, TensorType] = {}
    for param, st in held.items():
        dtype = st.graph.inputs[st.graph.input_index(param)].type.dtype
        types[param] = TensorType(final[param].local_shape(sizes), dtype)
    dtypes = {t.dtype for t in types.values()}
    if len(dtypes) > 1:
        raise LoweringError(Finding(
            codes_lower.COLLECTIVE_MISMATCH, "clip-grad-norm over parameters of several dtypes "
            f"({', '.join(sorted(dtypes))}) is not lowered", clip.origin.report_span,
            "clip-grad-norm"))
    dtype = next(iter(dtypes), "f32")
    squares: dict[TensorType, Graph] = {}
    scales: dict[TensorType, Graph] = {}
    for t in types.values():
        squares.setdefault(t, optim.square_sum_graph(t))
        scales.setdefault(t, optim.clip_scale_graph(t))
    axes = clip.axes or tuple(a for a, _ in lowered.mesh_axes)
    return GradClip(clip.max_norm, tuple(axes), clip.replicas,
                    tuple((p, squares[t]) for p, t in types.items()),
                    tuple((p, scales[t]) for p, t in types.items()),
                    optim.scalar_add_graph(dtype),
                    optim.clip_coefficient_graph(float(clip.max_norm), dtype),
                    source_of(clip.origin))


def _optimizer(lowered: Lowered, stages: tuple[Stage, ...]) -> OptimizerStep | None:
    opt = lowered.plan.optimizer
    if opt is None:
        return None
    config = _config(opt.kind, dict(opt.hyper), opt.origin)
    held = {s.spec: (st, s) for st in stages for s in st.output("grad")}
    sizes = lowered.sizes
    updates = []
    types: dict[str, TensorType] = {}
    #: each parameter's hyper-parameters: its group's (§6.5), or the optimizer's
    hypers: dict[str, dict[str, object]] = {}
    for param in lowered.binding.params:
        if param not in held:
            continue
        st, slot = held[param]
        block = zero_block(slot.layout, tuple(opt.shard_axes))
        dtype = st.graph.inputs[st.graph.input_index(param)].type.dtype
        types[param] = TensorType(block.local_shape(sizes), dtype)
        group = group_of(lowered.plan.param_groups, param)
        hypers[param] = dict((group.optimizer if group is not None else opt).hyper)
        own = config if group is None else _config(opt.kind, hypers[param], group.origin)
        graph = optim.update_graph(own, types[param])
        updates.append(ParamUpdate(param, slot.layout, block, own.states, graph,
                                   tuple(hypers[param].items()),
                                   NO_SOURCE if group is None else source_of(group.origin)))
    overrides = []
    for override in lowered.plan.overrides:  # §6.4: the same updates, other hyper-parameters
        given = dict(override.given)
        graphs = tuple((p, optim.update_graph(
            _config(opt.kind, {**hypers[p], **given}, override.origin), t))
            for p, t in types.items())
        overrides.append(OptimizerOverride(override.coords, tuple(override.given), graphs,
                                           source_of(override.origin)))
    return OptimizerStep(opt.kind, tuple(opt.hyper), tuple(opt.shard_axes), tuple(updates),
                         source_of(opt.origin), tuple(overrides))


def _config(kind: str, hyper: dict[str, object], origin: Any) -> optim.Optimizer:
    """The update recipe of an optimizer statement (or a group, or an override)."""
    try:
        return optim.optimizer_config(kind, hyper)
    except ValueError as error:
        raise LoweringError(Finding(codes_lower.COLLECTIVE_MISMATCH, f"optimizer: {error}",
                                    origin.report_span, "optimizer")) from None


# -- lineages and claims ------------------------------------------------------------------------


def claimed_layout(claim: Layout, derived: TLayout, sizes: Mapping[str, int]) -> TLayout:
    """A layout statement as a ``TLayout`` over the dimensions of the value it is about
    (``derived``): the claimed axes per dimension, the microbatch pseudo-axis where the value
    is per-microbatch, ``partial`` from the claim's ``Partial`` placements."""
    dims = []
    for d, dim in enumerate(derived.dims):
        size = 1
        for f in dim:
            size *= f.size
        axes = tuple(a for a in claim.axes_of_dim(d)
                     if a != PIPELINE_AXIS and sizes.get(a, 1) > 1)
        if any(MICROBATCH_AXIS in f.axes for f in dim):
            axes = (MICROBATCH_AXIS,) + axes  # microbatch-major (Rule 4.1)
        # a zigzag claim compares the piece with the spec's positions of both chunks (§2.6)
        zigzag = claim.order_of_dim(d) == ZIGZAG and bool(axes)
        dims.append((Factor(size, axes, zigzag=zigzag),))
    partial = None
    if claim.partial_axes:
        op = next(p.op for _, p in claim.placements if isinstance(p, Partial))
        partial = (op, tuple(claim.partial_axes))
    return TLayout(tuple(dims), partial)


def _lineages(lowered: Lowered) -> tuple[Lineage, ...]:
    """Each marked point's lineage, with the statement that made it: the algorithm computing
    the module's output, else the last collective at the point, else (at an algorithm's
    input) the algorithm reading it, else none. An algorithm comes
    first: the collectives after it at the point are exact on its value (each one's layout
    rule finds every way it could leave the derived lineage, TVP406), so a difference there
    was already in the algorithm's value (Rule 7.2: heads split over tp, the context-parallel
    attention's output is all-reduced at the point)."""
    algorithm_of = {path: alg.origin for alg, paths in lowered.binding.algorithms
                    for path in paths if path != "loss"}
    named = lowered.binding.marked_modules()  # not the boundaries only the checker marked
    out = []
    for point, lay in lowered.lineages.items():
        if point != "loss" and module_of(point) not in named:
            continue
        statements = lowered.binding.collectives_at(point)
        algorithm = algorithm_of.get(module_of(point))
        computed = algorithm is not None and point.endswith(".out")
        # (at an algorithm's input, where no statement stands: the algorithm, which reads it)
        origin = source_of(algorithm) if computed else \
            source_of(statements[-1].origin) if statements else \
            source_of(algorithm) if algorithm is not None else Source(None)
        out.append(Lineage(point, lay, origin))
    return tuple(out)


def _claims(lowered: Lowered, final: Mapping[str, TLayout]) -> tuple[Claim, ...]:
    binding, sizes = lowered.binding, lowered.sizes
    out = []
    for point, claims in binding.claims.items():
        derived = lowered.lineages.get(point)
        if derived is None:
            continue
        for c in claims:
            out.append(Claim(point, claimed_layout(c.layout, derived, sizes),
                             source_of(c.layout.origins[-1])))
    for param, layouts in binding.grad_claims.items():
        derived = final.get(param)
        for layout in layouts if derived is not None else ():
            out.append(Claim(f"grad({param})", claimed_layout(layout, derived, sizes),
                             source_of(layout.origins[-1])))
    return tuple(out)


# -- the program -----------------------------------------------------------------------------------


def parallel_program(lowered: Lowered, graphs: list[Graph] | None = None) -> ParallelProgram:
    """The whole training step of a lowered plan. Raises ``LoweringError`` for statements
    that have no meaning in it (never drops one)."""
    plan = lowered.plan
    graphs = graphs or stage_joints(lowered)
    stages = tuple(_stage(lowered, st, g) for st, g in zip(lowered.stages, graphs, strict=True))
    mesh = lowered.mesh_axes
    pipeline = PIPELINE_AXIS if PIPELINE_AXIS in dict(mesh) else None
    params = {s.spec: s.layout for st in stages for s in st.inputs if s.kind == "param"}
    param_layouts = tuple((p, params[p]) for p in lowered.binding.params if p in params)
    loss = _loss(lowered, graphs)
    program = ParallelProgram(
        plan.name or "", mesh, pipeline, plan.microbatches, plan.schedule or "1f1b",
        plan.loss_scale, stages, _transfers(lowered), _grad_syncs(lowered),
        _optimizer(lowered, stages), loss, _lineages(lowered), (), param_layouts)
    sources = tuple((p, source_of(lowered.binding.param_layouts[p].origins[-1]))
                    for p, _ in param_layouts if p in lowered.binding.param_layouts
                    and lowered.binding.param_layouts[p].origins)
    final = program.final_grad_layouts()
    seed = plan.header_origin("loss-scale") or plan.header_origin("microbatches")
    return replace(program, claims=_claims(lowered, final), param_sources=sources,
                   clip=_clip(lowered, stages, final),
                   seed_origin=source_of(seed) if seed is not None else NO_SOURCE)
