"""Binding: the plan's names resolved against the traced spec model.

Parameters are named by their torch path (``layers.3.attention.wq.weight``), activations by a
module boundary (``layers.3.attention.wo.out`` / ``.in``), model inputs by name, ``loss``, and
gradients as ``grad(parameter)``. A pattern that selects nothing is an error at its plan span
with the closest existing names; a split that does not divide a parameter's or input's
dimension is an error too (Rule 2.1) — both are things ``tvp lint`` cannot see without torch.

Every statement is seen here, so statements the lowering could only drop are rejected here
(docs/semantics.md §9): a collective on a parameter, input or ``loss``; a gradient
``reduce-scatter`` that does not divide or whose blocks the optimizer cannot consume (Rule 4.3);
a ZeRO shard over an axis that already splits a parameter; a false layout claim on
``grad(...)``; ``clip-grad-norm``, which is not lowered yet.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

from torch import nn

from trainverify_dsl.ir.layout import MICROBATCH_AXIS, Factor, TLayout, append_axes, ways
from trainverify_dsl.lower.findings import Finding
from trainverify_dsl.plan.checks import (
    INTERLEAVED,
    find_layers_out_of_range,
    indexed_lists,
    is_layer_selection,
    layer_chunks,
    pipeline_list_problems,
)
from trainverify_dsl.plan.model import (
    PIPELINE_AXIS,
    ZIGZAG,
    Algorithm,
    Collective,
    IndexSeg,
    Layout,
    NameSeg,
    Origin,
    Plan,
    TensorPattern,
    _segment_text,
)
from trainverify_dsl.report import codes_lower, codes_plan
from trainverify_dsl.report.diagnostics import Code
from trainverify_dsl.report.span import Span

#: Axes a layout never shards (the pipeline axis places, it does not split).
PLACEMENT_AXES = (PIPELINE_AXIS,)


@dataclass(frozen=True, slots=True)
class Claim:
    layout: Layout

    @property
    def span(self) -> Span | None:
        return self.layout.origins[-1].span if self.layout.origins else None


@dataclass
class Binding:
    plan: Plan
    params: dict[str, tuple[int, ...]]
    data: dict[str, tuple[int, ...]]
    modules: set[str]
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    #: per stage index: member patterns (with virtual stages, per virtual stage)
    stage_members: list[tuple[TensorPattern, ...]] = field(default_factory=list)
    #: per stage index: ``(pp rank, chunk)``; ``chunk`` is 0 unless the stages are virtual
    stage_places: list[tuple[int, int]] = field(default_factory=list)
    #: the stages were split at every block for the checker (``segment_stages``)
    segmented: bool = False
    #: the model's modules in ``named_modules`` order
    module_order: tuple[str, ...] = ()
    #: model inputs whose dimension 0 is not the batch (``spec.load.unbatched_inputs``):
    #: every microbatch reads them whole (Rule 4.1)
    unbatched: frozenset[str] = frozenset()
    param_layouts: dict[str, Layout] = field(default_factory=dict)
    data_layouts: dict[str, Layout] = field(default_factory=dict)
    point_collectives: dict[str, list[Collective]] = field(default_factory=dict)
    #: gradient statements in order, with the parameters each names
    grad_statements: list[tuple[Collective, tuple[str, ...]]] = field(default_factory=list)
    claims: dict[str, list[Claim]] = field(default_factory=dict)
    #: parameter -> the layout statements on its gradient (claims, checked in binding)
    grad_claims: dict[str, list[Layout]] = field(default_factory=dict)
    #: parameter -> its final gradient's layout after the gradient statements (§4.5)
    grad_layouts: dict[str, TLayout] = field(default_factory=dict)
    #: algorithm -> concrete module paths (and ``loss``)
    algorithms: list[tuple[Algorithm, tuple[str, ...]]] = field(default_factory=list)
    #: explicit sends: (point, source stage, destination stage, span)
    sends: list[tuple[str, int, int, Span | None]] = field(default_factory=list)

    # -- layouts of inputs ----------------------------------------------------------------

    def _tlayout(self, layout: Layout | None, shape: tuple[int, ...], name: str,
                 sizes: Mapping[str, int], batch: bool) -> TLayout:
        dims = []
        for d, n in enumerate(shape):
            # axes of size 1 split nothing: leaving them out keeps equal layouts equal
            axes = tuple(a for a in (layout.axes_of_dim(d) if layout else ())
                         if a not in PLACEMENT_AXES and sizes.get(a, 1) > 1)
            if batch and d == 0 and sizes.get(MICROBATCH_AXIS, 1) > 1:
                axes = (MICROBATCH_AXIS,) + axes  # microbatch-major (Rule 4.1)
            zigzag = layout is not None and layout.order_of_dim(d) == ZIGZAG and bool(axes)
            dims.append((Factor(int(n), axes, zigzag=zigzag),))
        return TLayout(tuple(dims))

    def param_layout(self, name: str, shape: tuple[int, ...],
                     sizes: Mapping[str, int]) -> TLayout:
        return self._tlayout(self.param_layouts.get(name), shape, name, sizes, batch=False)

    def param_origin(self, name: str) -> Any:
        """The plan ``Origin`` of the parameter's layout statement (None: replicated)."""
        layout = self.param_layouts.get(name)
        return layout.origins[-1] if layout and layout.origins else None

    def data_origin(self, name: str) -> Any:
        layout = self.data_layouts.get(name)
        return layout.origins[-1] if layout and layout.origins else None

    def data_layout(self, name: str, shape: tuple[int, ...],
                    sizes: Mapping[str, int]) -> TLayout:
        return self._tlayout(self.data_layouts.get(name), shape, name, sizes,
                             batch=name not in self.unbatched)

    def data_axes(self) -> set[str]:
        """Axes that split any model input (docs/semantics.md §4.1)."""
        return {a for layout in self.data_layouts.values() for _, axes in layout.dim_axes
                for a in axes if a not in PLACEMENT_AXES}

    # -- stages -------------------------------------------------------------------------

    def stage_of_module(self, path: str) -> int | None:
        if not self.stage_members:
            return 0
        parts = path.split(".") if path else []
        for end in range(len(parts), 0, -1):
            prefix = ".".join(parts[:end])
            for index, members in enumerate(self.stage_members):
                if any(m.head != "loss" and m.matches(prefix) for m in members):
                    return index
        return None

    def stage_of_stack(self, stack: Sequence[str]) -> int | None:
        if not self.stage_members:
            return 0
        for path in reversed(stack):
            stage = self.stage_of_module(path)
            if stage is not None:
                return stage
        return None

    def loss_stage(self) -> int | None:
        if not self.stage_members:
            return 0
        for index, members in enumerate(self.stage_members):
            if any(str(m) == "loss" for m in members):
                return index
        return None

    def stage_place(self, index: int) -> int:
        """The pp rank that runs (virtual) stage ``index``."""
        return self.stage_places[index][0] if index < len(self.stage_places) else index

    @property
    def virtual(self) -> bool:
        return any(chunk for _, chunk in self.stage_places)

    def stage_label(self, index: int) -> str:
        """``stage 2``, or ``virtual stage 2 (pp rank 0, chunk 1)``."""
        if not self.virtual:
            return f"stage {index}"
        rank, chunk = self.stage_places[index]
        return f"virtual stage {index} (pp rank {rank}, chunk {chunk})"

    def stage_span(self, index: int) -> Span | None:
        place = self.stage_place(index)
        for stage in self.plan.stages:
            if stage.index == place:
                return stage.origin.span
        return self.plan.mesh.span if self.plan.mesh else None

    def loss_span(self) -> Span | None:
        claims = self.claims.get("loss")
        if claims:
            return claims[-1].span
        for algorithm, paths in self.algorithms:  # the statement that computes the loss
            if "loss" in paths:
                return algorithm.origin.report_span
        stage = self.loss_stage()
        if self.stage_members and stage is not None:
            return self.stage_span(stage)
        return self.plan.spec.origin.span if self.plan.spec else None

    # -- statements at points -----------------------------------------------------------

    def collectives_at(self, point: str) -> list[Collective]:
        return self.point_collectives.get(point, [])

    def claims_at(self, point: str) -> list[Claim]:
        return self.claims.get(point, [])

    def marked_modules(self) -> set[str]:
        points = set(self.point_collectives) | {p for p in self.claims if p != "loss"}
        points |= {point for point, _, _, _ in self.sends}
        modules = {p.rsplit(".", 1)[0] for p in points}
        for _, paths in self.algorithms:
            modules.update(p for p in paths if p != "loss")
        return modules

    def algorithm_for(self, module: str) -> Algorithm | None:
        for algorithm, paths in self.algorithms:
            if module in paths:
                return algorithm
        return None


_NOT_A_POINT_HELP = {
    "a parameter": "a parameter's distribution is its layout (`split`, `replicate`); to "
                 "synchronise its gradient write the collective on `grad(...)`",
    "a model input": "an input's distribution is its layout (`split`, `replicate`); to "
                   "redistribute it, write the collective at the boundary of the module that "
                   "reads it (`X.in`)",
    "the loss": "the reported loss is the mean over data blocks (docs/semantics.md §4.6); state it "
            "as a claim (`partial loss over dp op=avg`) or scale the backward with "
            "`loss-scale`",
}


def _shown(names: Sequence[str]) -> str:
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(f"`{n}`" for n in names[:3]) + more


def _points(modules: set[str]) -> list[str]:
    points = []
    for path in sorted(modules):
        if path:
            points += [f"{path}.in", f"{path}.out"]
    return points


def _span(origin: Any) -> Span | None:
    return getattr(origin, "span", None)


class _Binder:
    def __init__(self, plan: Plan, model: nn.Module, data: Mapping[str, tuple[int, ...]],
                 sizes: Mapping[str, int]) -> None:
        self.plan, self.sizes = plan, sizes
        params = {name: tuple(p.shape) for name, p in model.named_parameters()}
        #: second names of tied parameters (``output.weight``) -> the name they go by
        first = {id(p): name for name, p in model.named_parameters()}
        self.aliases = {name: first[id(p)] for name, p in
                        model.named_parameters(remove_duplicate=False) if name not in params}
        order = tuple(name for name, _ in model.named_modules())
        modules = set(order)
        from trainverify_dsl.spec.load import unbatched_inputs

        self.b = Binding(plan, params, dict(data), modules, module_order=order,
                         unbatched=unbatched_inputs(model) & set(data))
        self.points = _points(modules)

    def error(self, message: str, span: Any, help: str | None = None,
              code: Code = codes_lower.UNBOUND_NAME) -> None:
        self.b.errors.append(Finding(code, message, span, "", help))

    def unknown(self, pattern: TensorPattern, span: Any, candidates: list[str],
                what: str) -> None:
        close = difflib.get_close_matches(str(pattern), candidates, n=3, cutoff=0.6)
        help = "did you mean " + " or ".join(f"`{c}`" for c in close) + "?" if close else None
        tied = [(alias, name) for alias, name in self.aliases.items()
                if pattern.matches(alias) or pattern.matches(f"grad({alias})")]
        if tied:
            alias, name = tied[0]
            help = (f"`{alias}` is tied to `{name}`: one parameter, named `{name}` (its first "
                    f"name); write `{str(pattern).replace(alias, name)}` "
                    "(docs/semantics.md §5.4)")
        self.error(f"`{pattern}` names no {what} of the spec model", span, help)

    def run(self) -> Binding:
        self._layouts()
        self._zero_blocks()
        self._collectives()
        self._gradient_layouts()
        self._stages()
        self._algorithms()
        self._sends()
        self._param_groups()
        self._lists_in_range()
        return self.b

    def _lists_in_range(self) -> None:
        """TVP268 at the model's real list lengths: ``tvp lint`` knows a length only from a
        stdlib model's layer count (a user model's ``n_layers`` may mean anything)."""
        spec = self.plan.spec
        if spec is None or spec.model.startswith("stdlib/"):
            return  # checked by the plan checks with its config's count
        for path, n in self._stage_lists().items():
            for d in find_layers_out_of_range(self.plan, path, n):
                self.b.errors.append(Finding(d.code, d.message, d.span, "", d.help, d.notes))

    def _param_groups(self) -> None:
        """Parameter groups (§6.5): every target selects a parameter, and no parameter is in
        two groups of one side (torch refuses a parameter in two groups)."""
        params = sorted(self.b.params)
        for groups in (self.plan.param_groups, self.plan.spec_param_groups):
            owner: dict[str, Any] = {}
            for group in groups:
                for target in group.targets:
                    if not any(target.matches(p, prefix=True) for p in params):
                        self.unknown(target, group.origin, params, "parameter")
                for p in params:
                    if not group.matches(p):
                        continue
                    first = owner.setdefault(p, group)
                    if first is not group:
                        self.error(f"`{p}` is in two parameter groups: this one and the one at "
                                   f"line {first.origin.report_span.line}",
                                   group.origin, "give each parameter at most one group",
                                   codes_plan.PARAM_GROUP)
                        break

    def _sends(self) -> None:
        for send in self.plan.sends:
            span = send.origin.span
            points = [p for p in self.points if send.target.matches(p)]
            if len(points) != 1:
                self.unknown(send.target, send.origin, self.points, "single module boundary "
                             "(`.out`)") if not points else self.error(
                    f"`send {send.target}` names {len(points)} tensors; a send moves one",
                    send.origin)
                continue
            self.b.sends.append((points[0], send.source, send.dest, span))

    def _layouts(self) -> None:
        b = self.b
        for layout in self.plan.layouts:
            target, span = layout.target, layout.origins[-1] if layout.origins else None
            if target.grad:
                names = [n for n in b.params if target.matches(f"grad({n})")]
                if not names:
                    self.unknown(target, span, [f"grad({n})" for n in b.params], "gradient")
                for n in names:
                    b.grad_claims.setdefault(n, []).append(layout)
                continue
            params = [n for n in b.params if target.matches(n)]
            data = [] if target.is_params else [n for n in b.data if target.matches(n)]
            points = [] if target.is_params else \
                [p for p in self.points + ["loss"] if target.matches(p)]
            if not (params or data or points):
                self.unknown(target, span, list(b.params) + list(b.data) + self.points +
                             ["loss"], "parameter, input or module boundary")
                continue
            for name in params + data:
                if self._misordered(name, layout, span):
                    continue
                if layout.partial_axes:
                    self.error(f"`{name}` is a {'parameter' if name in b.params else 'model input'}"
                               ": a layout on it defines how it is distributed and cannot be "
                               "partial (Rule 2.3)", span, code=codes_lower.PARTIAL_INPUT)
                    continue
                shape = b.params.get(name) or b.data[name]
                self._divides(name, shape, layout, span,
                              batch=name in b.data and name not in b.unbatched)
                (b.param_layouts if name in b.params else b.data_layouts)[name] = layout
            for point in points:
                b.claims.setdefault(point, []).append(Claim(layout))

    def _misordered(self, name: str, layout: Layout, span: Any) -> bool:
        """A zigzag order where it has no meaning (semantics §2.6): on a parameter, or on the
        batch dimension of a model input (reported, and the layout dropped)."""
        zigzag = [d for d, order in layout.orders if order == ZIGZAG]
        if not zigzag:
            return False
        if name in self.b.params:
            self.error(f"`{name}` is a parameter: zigzag orders the positions of a sequence "
                       "the data loader feeds, and a parameter has none", span,
                       "split parameters in plain blocks", code=codes_plan.BLOCK_ORDER)
            return True
        if 0 in zigzag:
            self.error(f"`{name}` splits its batch dimension (dimension 0) in zigzag order: "
                       "the batch is cut into microbatches and blocks of rows in plain order "
                       "(Rule 4.1)", span, "split the sequence dimension in zigzag order",
                       code=codes_plan.BLOCK_ORDER)
            return True
        return False

    def _divides(self, name: str, shape: tuple[int, ...], layout: Layout, span: Any,
                 batch: bool) -> None:
        if layout.ndim is not None and layout.ndim != len(shape):
            self.error(f"`{name}` has {len(shape)} dimensions, the layout lists {layout.ndim}",
                       span, code=codes_plan.SPLIT_NOT_DIVISIBLE)
            return
        for d, axes in layout.dim_axes:
            axes = tuple(a for a in axes if a not in PLACEMENT_AXES)
            if d >= len(shape):
                self.error(f"`{name}` has {len(shape)} dimensions; the layout splits "
                           f"dimension {d}", span, code=codes_plan.SPLIT_NOT_DIVISIBLE)
                continue
            n = ways(axes, self.sizes) * (self.sizes[MICROBATCH_AXIS] if batch and d == 0
                                          else 1)
            zigzag = layout.order_of_dim(d) == ZIGZAG
            n *= 2 if zigzag else 1
            if shape[d] % n:
                extra = " x microbatches" if batch and d == 0 else \
                    " x 2 (two zigzag chunks per rank)" if zigzag else ""
                self.error(f"`{name}` dimension {d} has size {shape[d]}, not divisible by "
                           f"{', '.join(axes) or 'the'}{extra} ({n}) (Rule 2.1: no padding)",
                           span, code=codes_plan.SPLIT_NOT_DIVISIBLE)

    def _zero_blocks(self) -> None:
        """Rule 6.1: under ``optimizer ... shard over A`` every parameter's local dimension 0
        must be divisible by the ZeRO group (no flattening, no padding)."""
        opt = self.plan.optimizer
        if opt is None or not opt.shard_axes:
            return
        group = ways(tuple(a for a in opt.shard_axes if a in self.sizes), self.sizes)
        twice: dict[str, list[str]] = {}
        for name, shape in self.b.params.items():
            layout = self.b.param_layouts.get(name)
            for axis in opt.shard_axes:
                if layout and any(axis in axes for _, axes in layout.dim_axes):
                    twice.setdefault(axis, []).append(name)
            own = tuple(a for a in (layout.axes_of_dim(0) if layout else ())
                        if a not in PLACEMENT_AXES)
            if shape and shape[0] % ways(own, self.sizes):
                continue  # its own split does not divide it: that error says it (TVP234)
            local = shape[0] // ways(own, self.sizes) if shape else 1
            if not shape or local % group:
                self.error(f"`{name}` has {local} local rows on dimension 0, not divisible by "
                           f"the optimizer's shard group {', '.join(opt.shard_axes)} ({group}) "
                           "(Rule 6.1: no flattening, no padding)", opt.origin,
                           code=codes_plan.SPLIT_NOT_DIVISIBLE)
        for axis, names in twice.items():
            self.error(f"`{axis}` already splits {_shown(names)}: `shard over {axis}` would "
                       f"split them over {axis} a second time (Rule 6.1: no axis of the shard "
                       "group may already shard the parameter)", opt.origin,
                       help=f"shard the optimizer over the axes that replicate the parameters "
                            f"(the data axes), not over {axis}", code=codes_plan.AXIS_USED_TWICE)

    def _collectives(self) -> None:
        b = self.b
        for st in self.plan.collectives:
            target, span = st.target, st.origin
            if target.grad:
                names = tuple(n for n in b.params if target.matches(f"grad({n})"))
                if not names:
                    self.unknown(target, span, [f"grad({n})" for n in b.params], "gradient")
                b.grad_statements.append((st, names))
                continue
            points = [] if target.is_params else [p for p in self.points if target.matches(p)]
            if not points and self._not_a_point(st):
                continue
            if not points:
                self.unknown(target, span, self.points, "module boundary (`.in` / `.out`)")
            for point in points:
                b.point_collectives.setdefault(point, []).append(st)

    def _gradient_layouts(self) -> None:
        """The final layout of every gradient (docs/semantics.md §4.5): the parameter's
        layout, with each ``reduce-scatter grad(P) over A dim=D`` appending ``A`` innermost on
        ``D``. A reduce-scatter whose dimension does not exist or does not divide is an error
        at its line; so is a final layout the optimizer step cannot consume (§6.2): without
        ``shard over`` every rank updates its whole piece and needs the whole gradient, with
        it the gradient must be complete or exactly in the ZeRO layout ``Z(P)``."""
        b = self.b
        final = {n: self.b.param_layout(n, shape, self.sizes) for n, shape in b.params.items()}
        scattered_by: dict[str, Collective] = {}
        for st, names in b.grad_statements:
            if st.kind != "reduce-scatter":
                continue
            bad: dict[str, list[str]] = {}
            for name in names:
                problem = self._scatter(final, name, st)
                if problem:
                    bad.setdefault(problem, []).append(name)
                else:
                    scattered_by[name] = st
            for problem, params in bad.items():
                verb = "has" if len(params) == 1 else "each have"
                self.error(problem.format(params=_shown(params), verb=verb), st.origin,
                           code=codes_plan.SPLIT_NOT_DIVISIBLE)
        self._optimizer_consumes(final, scattered_by)
        b.grad_layouts = final
        self._gradient_claims(final)

    def _gradient_claims(self, final: Mapping[str, TLayout]) -> None:
        """A layout statement on ``grad(P)`` claims the final gradient's layout: the one in
        which the simulation compares every copy with the spec's gradient (§8 item 2). A claim
        that differs from it is false; a ``partial`` claim always is (final gradients are
        compared complete)."""
        from trainverify_dsl.lower.lowering import claim_problem  # lowering imports bind

        found: dict[tuple[Span | None, str], list[str]] = {}
        for name, layouts in self.b.grad_claims.items():
            for layout in layouts:
                claim = Claim(layout)
                problem = claim_problem(claim, final[name], self.sizes)
                if problem:
                    found.setdefault((claim.span, problem), []).append(name)
        for (span, problem), names in found.items():
            self.b.warnings.append(Finding(
                codes_lower.CLAIM_CONTRADICTS_LAYOUT,
                f"the final gradient of {_shown(names)}: {problem}",
                span, f"grad({names[0]})"))

    def _scatter(self, final: dict[str, TLayout], name: str, st: Collective) -> str | None:
        lay = final[name]
        dim = st.dim if st.dim is not None else 0
        if not -lay.rank <= dim < lay.rank:
            return (f"`{st.kind} {st.target}` scatters dimension {dim}, but {{params}} "
                    f"{{verb}} {lay.rank} dimension{'' if lay.rank == 1 else 's'}")
        dim %= lay.rank
        group = ways(st.axes, self.sizes)
        local = lay.local_shape(self.sizes)[dim]
        if local % group:
            return (f"`{st.kind} {st.target}` over {', '.join(st.axes)} ({group} ranks) "
                    f"scatters dimension {dim} of {{params}}, whose local size {local} it does "
                    "not divide (Rule 2.1: no padding)")
        dims = list(lay.dims)
        dims[dim] = append_axes(dims[dim], st.axes)
        final[name] = TLayout(tuple(dims))
        return None

    def _optimizer_consumes(self, final: dict[str, TLayout],
                            scattered_by: Mapping[str, Collective]) -> None:
        opt = self.plan.optimizer
        if opt is None:
            return  # the final gradients are the step's outputs, compared in their layout
        bad: dict[Collective, list[str]] = {}
        for name, st in scattered_by.items():
            lay = self.b.param_layout(name, self.b.params[name], self.sizes)
            if opt.shard_axes and lay.rank:
                zero = TLayout((append_axes(lay.dims[0], opt.shard_axes),) + lay.dims[1:])
                if final[name] == zero:
                    continue
            bad.setdefault(st, []).append(name)
        for st, params in bad.items():
            axes = ", ".join(st.axes)
            if opt.shard_axes:
                why = (f"the optimizer shards its states over {', '.join(opt.shard_axes)} on "
                       "dimension 0 (Rule 6.1): its block of the gradient is not this one")
                help = (f"scatter exactly as the optimizer shards: `reduce-scatter "
                        f"{st.target} over {', '.join(opt.shard_axes)} dim=0`, or all-reduce")
            else:
                why = ("the optimizer is not sharded: every rank updates its whole piece of "
                       "the parameter and needs the whole gradient")
                op = f" op={st.op}" if st.op else ""
                help = (f"`all-reduce {st.target} over {axes}{op}`, or shard the optimizer "
                        f"(ZeRO): `optimizer ... shard over {axes}`")
            self.error(f"`{st.kind} {st.target} over {axes}` leaves each rank a block of the "
                       f"gradients of {_shown(params)}, but {why}", st.origin, help,
                       code=codes_lower.GRADIENT_LAYOUT_MISMATCH)

    def _not_a_point(self, st: Collective) -> bool:
        """A collective on a parameter, a model input or ``loss``: named, but not a place where
        a collective runs. Reported with what the name is (TVP401); ``True`` if it was."""
        target = st.target
        kinds = [("a parameter", [n for n in self.b.params if target.matches(n)]),
                 ("a model input", [] if target.is_params else
                  [n for n in self.b.data if target.matches(n)]),
                 ("the loss", ["loss"] if str(target) == "loss" else [])]
        for what, names in kinds:
            if names:
                self.error(f"`{st.kind} {target}`: `{names[0]}` is {what}, and collectives "
                           "run at module boundaries (`X.in`, `X.out`) or on gradients",
                           st.origin, _NOT_A_POINT_HELP[what])
                return True
        return False

    def _stages(self) -> None:
        b = self.b
        if not self.plan.stages:
            return
        count = max(s.index for s in self.plan.stages) + 1
        members: list[tuple[TensorPattern, ...]] = [() for _ in range(count)]
        errors = len(b.errors)
        for stage in self.plan.stages:
            members[stage.index] = members[stage.index] + stage.members
            for member in stage.members:
                if str(member) == "loss":
                    continue
                if not any(member.matches(m, prefix=True) for m in b.modules if m):
                    self.unknown(member, stage.origin, sorted(m for m in b.modules if m),
                                 "module")
        b.stage_members = members
        b.stage_places = [(index, 0) for index in range(count)]
        if len(b.errors) > errors:
            return
        lengths = self._stage_lists()
        for d in pipeline_list_problems(self.plan, lengths):
            b.errors.append(Finding(d.code, d.message, d.span, "", d.help, d.notes))
        if self.plan.schedule == INTERLEAVED and len(b.errors) == errors:
            self._virtual_stages(count, lengths)

    def _stage_lists(self) -> dict[str, int]:
        """The module lists the plan indexes (``plan.checks.indexed_lists``: whatever their
        names) that are lists of the model, with their real lengths, in the model's order:
        what the stages' selections, their overlaps, coverage and chunks are counted in."""
        lengths: dict[str, int] = {}
        for name in self.b.module_order:
            parent, _, last = name.rpartition(".")
            if parent and last.isdigit():
                lengths[parent] = max(lengths.get(parent, 0), int(last) + 1)
        named = set(indexed_lists(self.plan))
        return {path: n for path, n in lengths.items() if path in named}

    def _virtual_stages(self, pp: int, lengths: Mapping[str, int]) -> None:
        """Interleaved 1F1B (docs/semantics.md §5.3): each pp rank's chunks of the module
        lists ``lengths`` become stages of their own, chunk ``c`` of rank ``r`` at position
        ``c * pp + r``. A member that is not a list selection goes with the rank's first
        chunk when the model defines it before the lists' first element (``embed``), else
        with the last (``norm``, ``output``, ``loss``); a wrong guess is a data dependency
        the lowering reports, never a silent move."""
        b = self.b
        chunks = layer_chunks(self.plan.stages, lengths)
        v = max((len(runs) for runs in chunks.values()), default=1)
        order = {m: i for i, m in enumerate(b.module_order)}
        first_layer = min((order[f"{path}.0"] for path in lengths if f"{path}.0" in order),
                          default=0)
        members: list[tuple[TensorPattern, ...]] = [() for _ in range(v * pp)]
        for stage in self.plan.stages:
            runs = chunks.get(stage.index, [])
            for c, (path, run) in enumerate(runs):
                members[c * pp + stage.index] += tuple(_pattern(f"{path}.{i}") for i in run)
            last = max(len(runs) - 1, 0)
            for member in stage.members:
                if is_layer_selection(member, lengths):
                    continue
                where = [order[m] for m in b.module_order
                         if m and str(member) != "loss" and member.matches(m, prefix=True)]
                c = 0 if where and min(where) < first_layer else last
                members[c * pp + stage.index] += (member,)
        b.stage_members = members
        b.stage_places = [(i % pp, i // pp) for i in range(v * pp)]

    def _algorithms(self) -> None:
        b = self.b
        for algorithm in self.plan.algorithms:
            paths: list[str] = []
            for target in algorithm.targets:
                if str(target) == "loss":
                    paths.append("loss")
                    continue
                found = sorted(m for m in b.modules if m and target.matches(m))
                if not found:
                    self.unknown(target, algorithm.origin,
                                 sorted(m for m in b.modules if m), "module")
                paths += found
            b.algorithms.append((algorithm, tuple(paths)))


def list_lengths(model: nn.Module) -> dict[str, int]:
    """Every module list of ``model`` (a path whose children are numbered) and its length."""
    lengths: dict[str, int] = {}
    for name, _ in model.named_modules():
        parent, _, last = name.rpartition(".")
        if last.isdigit():
            lengths[parent] = max(lengths.get(parent, 0), int(last) + 1)
    return lengths


def resolve_indices(plan: Plan, model: nn.Module) -> Plan:
    """``plan`` with every negative index of a pattern counted from the end of its module list
    (docs/language.md: ``layers[-1]`` is the last layer); an index before the first stays
    negative and names nothing (the plan checks report it, TVP268)."""
    lengths = list_lengths(model)

    def pattern(p: TensorPattern) -> TensorPattern:
        if not any(isinstance(seg, IndexSeg) and seg.index < 0 for seg in p.segments):
            return p
        segments, path = [], []
        for seg in p.segments:
            n = lengths.get(".".join(path)) if isinstance(seg, IndexSeg) and seg.index < 0 \
                else None
            if n is not None and seg.index + n >= 0:
                seg = IndexSeg(seg.index + n)
            segments.append(seg)
            path.append(_segment_text(seg))
        return replace(p, segments=tuple(segments))

    def walk(value: Any) -> Any:
        if isinstance(value, TensorPattern):
            return pattern(value)
        if isinstance(value, tuple):
            items = tuple(walk(v) for v in value)
            return items if any(a is not b for a, b in zip(items, value, strict=True)) \
                else value
        if is_dataclass(value) and not isinstance(value, type | Span | Origin):
            changed = {f.name: new for f in fields(value) if f.init
                       for new in [walk(getattr(value, f.name))]
                       if new is not getattr(value, f.name)}
            return replace(value, **changed) if changed else value
        return value

    return walk(plan)


def bind_plan(plan: Plan, model: nn.Module, data: Mapping[str, tuple[int, ...]],
              sizes: Mapping[str, int], blocks: str | None = None) -> Binding:
    """Resolve every name of ``plan`` against ``model`` and its input shapes. ``blocks``:
    the checker's block list (``layers``); each stage is split into one stage per block
    (``segment_stages``)."""
    binding = _Binder(plan, model, data, sizes).run()
    if blocks is not None and not binding.errors:
        segment_stages(binding, blocks)
    return binding


def _pattern(path: str) -> TensorPattern:
    return TensorPattern(tuple(IndexSeg(int(part)) if part.isdigit() else NameSeg(part)
                               for part in path.split(".")))


def segment_stages(b: Binding, blocks: str) -> bool:
    """Split every stage into one stage per block of the list ``blocks``, all on the stage's
    ranks (virtual stages of its pp rank): what the checker cuts its proof at
    (``check/stages.py``); the values and the ranks that compute them are the plan's. The
    modules before the stage's first block are a stage of their own before it, those after
    its last one after it.
    Left as it is (``False``) when the plan routes values with explicit ``send``s (they
    name the plan's stages), already has virtual stages, or a stage's blocks are not one
    run of consecutive blocks."""
    if b.plan.sends or b.virtual:
        return False
    n = sum(1 for m in b.modules if m.startswith(f"{blocks}.") and m[len(blocks) + 1:].isdigit())
    if n < 2:
        return False
    order = {m: i for i, m in enumerate(b.module_order)}
    first = order.get(f"{blocks}.0")
    if first is None:
        return False
    members = list(b.stage_members)
    places = [place for place, _ in b.stage_places]
    if not members:  # one stage: every module beside the block list, and the loss
        ancestors = {blocks.rsplit(".", k)[0] for k in range(1, blocks.count(".") + 1)}
        beside = [m for m in b.module_order if m and m not in ancestors and m != blocks
                  and not m.startswith(f"{blocks}.") and m.rpartition(".")[0] in
                  ancestors | {""}]
        members = [tuple(_pattern(m) for m in beside) + (_pattern(blocks), _pattern("loss"))]
        places = [0]
    new_members: list[tuple[TensorPattern, ...]] = []
    new_places: list[tuple[int, int]] = []
    chunks: dict[int, int] = {}
    for stage, place in zip(members, places, strict=True):
        owned = sorted(k for k in range(n)
                       if any(p.matches(f"{blocks}.{k}", prefix=True) for p in stage))
        if not owned or owned != list(range(owned[0], owned[-1] + 1)):
            if owned:
                return False
            parts = [stage]
        else:
            before: tuple[TensorPattern, ...] = ()
            after: tuple[TensorPattern, ...] = ()
            for p in stage:
                if any(p.matches(f"{blocks}.{k}", prefix=True) for k in owned):
                    continue
                where = [order[m] for m in b.module_order
                         if m and str(p) != "loss" and p.matches(m, prefix=True)]
                if any(b.module_order[i].startswith(f"{blocks}.") for i in where):
                    return False  # a part of a block on this stage: the plan's own cut
                if where and min(where) < first:
                    before += (p,)
                else:
                    after += (p,)
            # the modules before the blocks (the embedding) and after them (the head, the
            # loss) are stages of their own, so that every block stage is one block's alone
            parts = [before] if before else []
            parts += [(_pattern(f"{blocks}.{k}"),) for k in owned]
            parts += [after] if after else []
        for part in parts:
            new_members.append(part)
            new_places.append((place, chunks.get(place, 0)))
            chunks[place] = chunks.get(place, 0) + 1
    if len(new_members) == len(members):
        return False
    b.stage_members, b.stage_places = new_members, new_places
    b.segmented = True
    return True


__all__ = ["Binding", "Claim", "bind_plan", "list_lengths", "resolve_indices"]
