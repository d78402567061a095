"""Plan + spec model -> the SPMD local program of every pipeline stage (docs/semantics.md).

``lower(plan, model, input_specs)`` captures the spec's forward (``capture``), binds the plan's
names to it (``bind``), and rewrites the forward node by node into one local forward graph per
pipeline stage:

- every op runs on local pieces; the layout rules (``rules``) give each value its layout and
  turn view/expand sizes into local sizes; a layout that cannot run locally stops the lowering
  with a diagnostic;
- at each marked module boundary the plan's collectives at that point run, in statement
  order, as ``tvp.collective`` calls carrying their forward and stated backward;
- parallel algorithms (``algorithms``) replace the named module's local program;
- a value produced on one stage and read on a later one becomes a send/recv boundary
  (the stage's output and the consumer stage's input);
- rank coordinates (for algorithms' offsets) are inputs ``coord.<axis>``, so the program is
  the same on every rank of a stage (SPMD).

The local forward graphs are plain torch FX graphs on fake tensors: ``joint`` differentiates
them with AOTAutograd (so ordinary ops differentiate exactly as torch does and only the
collectives carry semantics we wrote), and tests run them eagerly under real
``torch.distributed``. The lowering never unrolls the mesh.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainverify_dsl.ir.collectives import COLLECTIVES, kind_of, layout_after
from trainverify_dsl.ir.layout import (
    MICROBATCH_AXIS,
    LayoutError,
    TLayout,
)
from trainverify_dsl.lower import algorithms, collectives  # noqa: F401 - registers tvp.collective
from trainverify_dsl.lower import loss as loss_norm
from trainverify_dsl.lower.bind import Binding, bind_plan, resolve_indices
from trainverify_dsl.lower.capture import (
    CONSTANT_PREFIX,
    MARK,
    Captured,
    capture_forward,
    module_stack,
)
from trainverify_dsl.lower.findings import Finding, LoweringError, latest, merge_repeats
from trainverify_dsl.lower.gradients import GradientTracker
from trainverify_dsl.lower.rules import RULES, Result
from trainverify_dsl.plan.model import PIPELINE_AXIS, ZIGZAG, Collective, Plan
from trainverify_dsl.report import codes_lower, codes_plan
from trainverify_dsl.report.diagnostics import Code
from trainverify_dsl.report.span import Span
from trainverify_dsl.spec.convert import packet_name
from trainverify_dsl.spec.fx_import import user_frame
from trainverify_dsl.spec.marks import module_of


@dataclass(frozen=True, slots=True)
class Slot:
    """One input or output of a stage's local forward."""

    name: str
    #: ``param``, ``buffer``, ``data``, ``coord``, ``recv`` (inputs); ``loss``, ``send``,
    #: ``lineage`` (outputs; a lineage output's ``spec`` is the marked point)
    kind: str
    #: the spec tensor (parameter/input name, or the boundary value's id)
    spec: str
    layout: TLayout


@dataclass
class StageProgram:
    index: int
    gm: torch.fx.GraphModule
    inputs: list[Slot]
    outputs: list[Slot]


@dataclass
class Lowered:
    plan: Plan
    binding: Binding
    #: axis sizes, including the microbatch pseudo-axis ``@mb``
    sizes: dict[str, int]
    stages: list[StageProgram]
    #: marked point -> layout of the value after the point's collectives (a lineage)
    lineages: dict[str, TLayout]
    findings: list[Finding] = field(default_factory=list)
    #: (stage, boundary id of a recv input) -> the boundary id it really receives, or
    #: ``None`` for a free value; absent means the implied transfer (Rule 5.2)
    routes: dict[tuple[int, str], str | None] = field(default_factory=dict)
    #: ``loss-reduction token-mean``: the data axes whose token counts are summed
    loss_count_axes: tuple[str, ...] = ()
    #: the name of each mark node -> its marked point (``layers.0.out``), and of the value a
    #: ``.in`` mark reads -> that point
    points: dict[str, str] = field(default_factory=dict)
    #: ``local-mean`` over a token count of split data: the axes (and ``@mb``) whose blocks
    #: each divide by their own count (equal to the spec's loss only where the counts are)
    local_counts: tuple[str, ...] = ()
    #: ``loss-reduction sum scale=s`` where the spec divides by a token count of the data
    fixed_count: bool = False

    @property
    def mesh_axes(self) -> tuple[tuple[str, int], ...]:
        assert self.plan.mesh is not None
        return tuple((a.name, a.size) for a in self.plan.mesh.axes)


class _New:
    """A node created in the local graph by a rule (not an original node to map)."""

    __slots__ = ("node",)

    def __init__(self, node: torch.fx.Node) -> None:
        self.node = node


class _AlgorithmContext:
    """What an algorithm sees of the lowering (``algorithms.Context``): nothing else."""

    def __init__(self, lw: _Lowering) -> None:
        self._lw = lw
        self.fake_mode = lw.mode

    @property
    def loss_region(self) -> set[torch.fx.Node]:
        return self._lw.loss_region

    def sites(self) -> list[algorithms.Site]:
        return [algorithms.Site(alg.name, path, alg.axes, alg.origin, alg.options)
                for alg, paths in self._lw.binding.algorithms for path in paths]

    def mark(self, point: str) -> torch.fx.Node | None:
        return self._lw.marks.get(point)

    def partial_cotangent(self, value: torch.fx.Node, axes: tuple[str, ...],
                          cause: Any) -> None:
        self._lw.algorithm_inputs.append((value, axes, getattr(cause, "report_span", cause)))

    def param(self, name: str) -> torch.fx.Node | None:
        return self._lw.param_nodes.get(name)

    def layout(self, node: torch.fx.Node) -> TLayout:
        return self._lw.layouts[node]

    def local(self, node: Any) -> Any:
        return self._lw.value(self._lw.stage, node)

    def group(self, axes: tuple[str, ...]) -> tuple[torch.fx.Node, int]:
        return self._lw.group_index(axes), math.prod(self._lw.sizes[a] for a in axes)

    def emit(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._lw.emit(target, args, kwargs)

    def submodule(self, path: str) -> nn.Module:
        return self._lw.model.get_submodule(path)

    def collectives_at(self, point: str) -> list[Any]:
        return list(self._lw.binding.collectives_at(point))

    def is_data_input(self, node: torch.fx.Node) -> bool:
        return self._lw.cap.placeholders[node.name][0] == "data"

    def report(self, finding: Finding) -> None:
        self._lw.findings.append(finding)

    def loss_mode(self) -> str:
        return loss_norm.mode_of(self._lw.plan)

    def normalise_loss(self, numerator: torch.fx.Node, count: torch.fx.Node | int,
                       axes: tuple[str, ...], cause: Any,
                       summed: bool = False) -> tuple[torch.fx.Node, TLayout]:
        return loss_norm.normalise(self._lw, numerator, count, axes, cause, summed)


class _Lowering:
    def __init__(self, plan: Plan, model: nn.Module, binding: Binding, captured: Captured,
                 sizes: dict[str, int]) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.plan, self.model, self.binding, self.cap = plan, model, binding, captured
        self.sizes = sizes
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.layouts: dict[torch.fx.Node, Any] = {}
        #: node -> {mesh axis: ((order, kind), plan origin)}: for each axis in the value's
        #: lineage, the statement that last brought it in (a parameter's or input's layout,
        #: kind 0; a collective at a mark, kind 1) and when. A finding blames the most recent
        #: statement behind the axes it is about (a collective before a layout statement that
        #: enters at the same point), not the first data split.
        self.causes: dict[torch.fx.Node, dict[str, tuple[tuple[int, int], Any]]] = {}
        self.order = 0
        #: module path -> the order at which its `.in` mark was visited (where its
        #: parameters enter the computation); parameter placeholder -> its module path
        self.entered: dict[str, int] = {}
        self.param_module: dict[torch.fx.Node, str] = {}
        self.n_stages = max(1, len(binding.stage_members))
        self.graphs = [torch.fx.Graph() for _ in range(self.n_stages)]
        self.values: list[dict[torch.fx.Node, torch.fx.Node]] = [{} for _ in self.graphs]
        self.inputs: list[list[Slot]] = [[] for _ in self.graphs]
        self.outputs: list[list[Slot]] = [[] for _ in self.graphs]
        self.recv: list[dict[torch.fx.Node, torch.fx.Node]] = [{} for _ in self.graphs]
        #: per stage: (kind, spec name) -> its input placeholder
        self.spec_inputs: list[dict[tuple[str, str], torch.fx.Node]] = [{} for _ in self.graphs]
        self.sent: dict[torch.fx.Node, set[int]] = {}
        self.stage_of: dict[torch.fx.Node, int | None] = {}
        self.findings: list[Finding] = []
        self.lineages: dict[str, TLayout] = {}
        #: the statements answering for a partial sum: a collective that let it through
        #: unreduced, or the cause a finding on it already stands at (``_sum_blame``)
        self.settled: set[Any] = set()
        self.stage = 0
        self.current: torch.fx.Node | None = None
        self.current_cause: Any = None
        self.skip: set[torch.fx.Node] = set()
        #: marked point -> its mark node; parameter name -> its placeholder (found once)
        self.marks: dict[str, torch.fx.Node] = {}
        #: the modules the plan itself marks (not the block boundaries the checker adds)
        self.named_modules = binding.marked_modules()
        self.param_nodes: dict[str, torch.fx.Node] = {}
        self.loss_region: set[torch.fx.Node] = set()
        self.coords: list[dict[str, torch.fx.Node]] = [{} for _ in self.graphs]
        self.grads = GradientTracker(sizes)
        #: inputs an algorithm declared a partial cotangent for, until its output is marked
        self.algorithm_inputs: list[tuple[torch.fx.Node, tuple[str, ...], Any]] = []
        #: stage -> marked point -> its local value (observed in simulation)
        self.observed: dict[int, dict[str, torch.fx.Node]] = {}
        #: the spec loss's normalisers that ``lower/loss.py`` lowers (``loss.intercepts``)
        self.loss_roots: tuple[loss_norm.Root, ...] = ()
        #: ``token-mean``: each normaliser's local token count (a node of the loss stage)
        #: and the axes its counts sum over
        self.loss_counts: list[tuple[torch.fx.Node, tuple[str, ...]]] = []
        #: ``local-mean`` over a token count of split data: the axes whose blocks divide
        #: by their own counts (``loss.normalise``)
        self.local_counts: tuple[str, ...] = ()
        #: ``sum scale=s`` over a loss the spec divides by a token count of the data
        self.fixed_count = False
        #: the normaliser the spec's loss ends in, intercepted or not (``loss.find_root``)
        self.found_root: loss_norm.Root | None = None

    # -- RuleCtx ------------------------------------------------------------------------

    def layout(self, value: Any) -> TLayout:
        if value not in self.layouts:  # a constant-only value not materialised yet
            self.value(self.stage, value)
        return self.layouts[value]

    def cause_for(self, axes: Any) -> Any:
        """The plan origin behind ``axes`` in the operands of the op being lowered: the most
        recent statement that brought one of them in (else ``current_cause``)."""
        found = [entry for a in axes for entry in
                 [self.causes.get(self.current, {}).get(a)] if entry is not None]
        return latest(found) or self.current_cause

    def _operand_cause(self, node: torch.fx.Node, error: LayoutError) -> Any:
        """The statement behind the argument a layout error names (``error.operand``), for
        the axes it names: the split the other operands lack."""
        if error.operand is None or error.operand >= len(node.args):
            return None
        arg = node.args[error.operand]
        entries = self.causes.get(arg, {}) if isinstance(arg, torch.fx.Node) else {}
        return latest(e for a, e in entries.items() if a in error.axes or not error.axes)

    def finding(self, code: Code, message: str, layout: TLayout | None = None) -> None:
        span = layout.cause if layout is not None and layout.cause is not None else \
            self.current_cause
        if layout is not None and layout.partial and layout.cause is not None:
            self.settled.add(layout.cause)  # the sum is blamed there from now on
        self.findings.append(Finding(code, message, span, self._where()))

    def adapt(self, value: Any, lay: TLayout, target: TLayout) -> _New:
        node = self.value(self.stage, value)
        local = target.local_shape(self.sizes)
        for d, n in enumerate(local):
            if node.meta["val"].shape[d] != n:
                node = self.emit(torch.ops.aten.slice.Tensor, (node, d, 0, n))
        return _New(node)

    # -- helpers ------------------------------------------------------------------------

    def _where(self) -> str:
        if self.current is None:
            return ""
        stack = module_stack(self.current)
        return stack[-1] if stack else "(root)"

    def emit(self, target: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None,
             stage: int | None = None, meta_from: torch.fx.Node | None = None) -> torch.fx.Node:
        stage = self.stage if stage is None else stage
        graph = self.graphs[stage]
        kwargs = dict(kwargs or {})
        node = graph.call_function(target, args, kwargs)
        source = meta_from if meta_from is not None else self.current
        if source is not None:
            for key in ("nn_module_stack", "stack_trace"):
                if key in source.meta:
                    node.meta[key] = source.meta[key]
        fake_args = torch.fx.node.map_arg(args, lambda n: n.meta["val"])
        fake_kwargs = torch.fx.node.map_arg(kwargs, lambda n: n.meta["val"])
        with self.mode:
            node.meta["val"] = target(*fake_args, **fake_kwargs)
        return node

    def placeholder(self, stage: int, name: str, kind: str, spec: str, layout: TLayout,
                    dtype: torch.dtype) -> torch.fx.Node:
        graph = self.graphs[stage]
        node = graph.placeholder(_safe(name))
        with self.mode:
            node.meta["val"] = torch.empty(layout.local_shape(self.sizes), dtype=dtype)
        self.inputs[stage].append(Slot(node.name, kind, spec, layout))
        return node

    def coord(self, stage: int, axis: str) -> torch.fx.Node:
        if axis not in self.coords[stage]:
            graph = self.graphs[stage]
            node = graph.placeholder(_safe(f"coord.{axis}"))
            with self.mode:
                node.meta["val"] = torch.empty((), dtype=torch.int64)
            self.inputs[stage].append(Slot(node.name, "coord", axis, TLayout(())))
            self.coords[stage][axis] = node
        return self.coords[stage][axis]

    def group_index(self, axes: tuple[str, ...]) -> torch.fx.Node:
        """``k_A`` of the current rank as a 0-d int64 node (row-major over ``axes``)."""
        aten = torch.ops.aten
        k = None
        for axis in axes:
            c = self.coord(self.stage, axis)
            k = c if k is None else self.emit(aten.add.Tensor, (
                self.emit(aten.mul.Tensor, (k, self.sizes[axis])), c))
        assert k is not None
        return k

    # -- values across stages -----------------------------------------------------------

    def value(self, stage: int, old: Any) -> Any:
        if isinstance(old, _New):
            return old.node
        if not isinstance(old, torch.fx.Node):
            return old
        memo = self.values[stage]
        if old in memo:
            return memo[old]
        if old.op == "placeholder":
            memo[old] = self._input(stage, old)
            return memo[old]
        home = self.stage_of.get(old)
        if home is None:  # a constant-only value: recomputed where it is used (Rule 5.1)
            saved = self.stage, self.current, self.current_cause
            self.stage = stage
            self.visit(old)
            self.stage, self.current, self.current_cause = saved
            return memo[old]
        if home < stage:
            if old not in self.recv[stage]:
                lay = self.layouts[old]
                self.recv[stage][old] = self.placeholder(
                    stage, f"recv.{old.name}", "recv", old.name, lay, old.meta["val"].dtype)
                self.sent.setdefault(old, set()).add(stage)
            return self.recv[stage][old]
        if old in self.skip:
            raise LoweringError(Finding(
                codes_lower.ALGORITHM_NOT_APPLICABLE,
                f"{_describe(old)} belongs to a module that a "
                "parallel algorithm replaces, but is also used outside it", None,
                self._where()))
        raise LoweringError(Finding(
            codes_plan.STAGE_ORDER,
            f"{self.binding.stage_label(stage)} reads {_describe(old)} computed on the "
            f"later {self.binding.stage_label(home)}: the stage order breaks a data "
            "dependency",
            self.binding.stage_span(stage), self._where()))

    def _input(self, stage: int, old: torch.fx.Node) -> torch.fx.Node:
        kind, spec = self.cap.placeholders[old.name]
        lay = self.layouts[old]
        dtype = old.meta["val"].dtype
        if kind == "constant":  # a tensor the forward builds (a mask): every rank's whole
            node = self.graphs[stage].get_attr(f"{CONSTANT_PREFIX}{old.name}")
            node.meta["val"] = old.meta["val"]
            return node
        # a tied parameter is several placeholders of the capture under one spec name: one
        # input of the stage, whose gradient sums its uses there (as the spec's does)
        held = self.spec_inputs[stage]
        if (kind, spec) not in held:
            held[(kind, spec)] = self.placeholder(stage, spec, kind, spec, lay, dtype)
        return held[(kind, spec)]

    def param_stages(self) -> dict[str, tuple[int, ...]]:
        """Every parameter used by ops of several pipeline (or virtual) stages, with those
        stages: a tied parameter whose uses the plan put on different stages. Each of them
        holds a copy and computes a share of its gradient (docs/semantics.md §5.4)."""
        stages: dict[str, list[int]] = {}
        for stage, held in enumerate(self.spec_inputs):
            for kind, spec in held:
                if kind == "param":
                    stages.setdefault(spec, []).append(stage)
        return {p: tuple(s) for p, s in stages.items() if len(s) > 1}

    # -- the walk -----------------------------------------------------------------------

    def run(self) -> None:
        graph = self.cap.gm.graph
        for node in graph.nodes:
            if node.op == "placeholder":
                self._layout_input(node)
            elif node.op == "call_function" and packet_name(node.target) == MARK:
                self.marks.setdefault(node.args[1], node)
        self._unreached_points()
        self._assign_stages(graph)
        self.algorithm_context = _AlgorithmContext(self)
        self.loss_region = algorithms.loss_region(self.algorithm_context, graph)
        self.skip = algorithms.skipped_nodes(self.algorithm_context, graph)
        if not self.loss_region:  # a loss algorithm normalises its own loss
            output = next(n for n in graph.nodes if n.op == "output")
            results = output.args[0]
            loss = results[0] if isinstance(results, (tuple, list)) else results
            mode = loss_norm.mode_of(self.plan)
            # several normalisers (a token mean plus a z-loss) under token-mean, each with
            # its own count; `sum scale=` scales one
            kinds = lambda name: self.cap.placeholders.get(name, ("",))[0]  # noqa: E731
            roots = loss_norm.find_roots(
                loss, lambda n: loss_norm.reads_data_input(n, kinds)) if mode != "sum" else None
            if roots is None:
                root = loss_norm.find_root(loss)
                roots = (root,) if root is not None else ()
            if not roots and mode != "local-mean":
                raise loss_norm.no_root(self.plan)
            self.found_root = roots[0] if roots else None
            self.loss_roots = tuple(r for r in roots if loss_norm.intercepts(self.plan, r))
        for node in graph.nodes:
            if node.op == "call_function" and self.stage_of.get(node) is not None \
                    and node not in self.skip:
                self.stage = self.stage_of[node]
                self.visit(node)
            elif node.op == "output":
                self._outputs(node)

    def _unreached_points(self) -> None:
        """A statement at a module boundary no value crosses — a container the model never
        calls (an ``nn.ModuleList`` or ``nn.ModuleDict`` itself, a module whose weight is
        used through ``F.linear``), an input it is not given — would be dropped: an error at
        the statement (docs/semantics.md §10), as a name that selects nothing is."""
        statements = [(point, st.origin, "statement")
                      for point, sts in self.binding.point_collectives.items() for st in sts]
        statements += [(point, claim.layout.origins[-1], "layout claim")
                       for point, claims in self.binding.claims.items() if point != "loss"
                       for claim in claims if claim.layout.origins]
        for point, origin, what in statements:
            if point in self.marks:
                continue
            module, _, side = point.rpartition(".")
            called = any(p.rpartition(".")[0] == module for p in self.marks)
            why = (f"the model calls `{module}` without this input" if called else
                   f"the model never calls `{module}` (a container such as nn.ModuleList "
                   f"or nn.ModuleDict, or a module whose parameters are used directly)")
            self.findings.append(Finding(
                codes_lower.UNBOUND_NAME, f"no value crosses `{point}`: {why}, so this {what} "
                f"would apply to nothing", origin, point,
                help="name the boundary of a module the model calls (`layers.3.out`, not "
                     "`layers.out`), or the parameters of one used directly"))

    def _layout_input(self, node: torch.fx.Node) -> None:
        kind, spec = self.cap.placeholders[node.name]
        shape = tuple(node.meta["val"].shape)
        if kind == "param":
            lay = self.binding.param_layout(spec, shape, self.sizes)
            self._stamp(node, lay, self.binding.param_origin(spec))
            self.param_module[node] = spec.rpartition(".")[0]
            self.grads.parameter(node, spec, lay)
            self.param_nodes.setdefault(spec, node)  # a tied parameter: its first use
        elif kind == "data":
            lay = self.binding.data_layout(spec, shape, self.sizes)
            self._stamp(node, lay, self.binding.data_origin(spec), at_use=False)
        else:
            lay = TLayout.replicated(shape, const=True)
        self.layouts[node] = lay

    def _stamp(self, node: torch.fx.Node, lay: TLayout, origin: Any, at_use: bool = True
               ) -> None:
        """An input's split axes come from its layout statement. A parameter enters the
        computation where its module does (its ``.in`` mark, if the plan names the module;
        else the op that uses it: order ``-1`` until then); a model input enters at the
        start (order 0), before any statement downstream of it."""
        if origin is not None:
            order = -1 if at_use else 0
            self.causes[node] = {a: ((order, 0), origin) for a in lay.shard_axes()
                                 if self.sizes.get(a, 1) > 1}

    def _entry_of(self, module: str) -> int:
        """Where a parameter of ``module`` enters: the `.in` mark of its innermost named
        enclosing module, else the op using it now."""
        while module:
            if module in self.entered:
                return self.entered[module]
            module = module.rpartition(".")[0]
        return self.order

    def _merge_causes(self, node: torch.fx.Node) -> Any:
        """The node's causes from its operands'; returns the most recent origin overall."""
        self.order += 1
        merged: dict[str, tuple[tuple[int, int], Any]] = {}
        for operand in node.all_input_nodes:
            for axis, ((order, kind), origin) in self.causes.get(operand, {}).items():
                if order < 0:
                    order = self._entry_of(self.param_module.get(operand, ""))
                if axis not in merged or (order, kind) > merged[axis][0]:
                    merged[axis] = ((order, kind), origin)
        self.causes[node] = merged
        return latest(merged.values())

    def _assign_stages(self, graph: torch.fx.Graph) -> None:
        const: dict[torch.fx.Node, bool] = {}
        for node in graph.nodes:
            if node.op == "placeholder":
                # values from buffers, constants and the model inputs alone are computed on
                # every stage that uses them (Rule 5.1): every stage reads its own inputs
                const[node] = self.cap.placeholders[node.name][0] in ("buffer", "constant",
                                                                      "data")
                continue
            if node.op != "call_function":
                continue
            const[node] = all(const.get(n, True) for n in node.all_input_nodes)
            if packet_name(node.target) == MARK:
                point = node.args[1]
                self.stage_of[node] = self.binding.stage_of_module(point.rsplit(".", 1)[0])
                continue
            stage = self.binding.stage_of_stack(module_stack(node))
            if stage is None and not const[node]:
                # outside every assigned module (the loss, GPT-2's embedding sum): on the
                # latest stage among its operands' (Rule 5.1)
                stage = max((self.stage_of[n] for n in node.all_input_nodes
                             if self.stage_of.get(n) is not None), default=0)
            self.stage_of[node] = stage
        self._check_loss_stage(graph)

    def _check_loss_stage(self, graph: torch.fx.Graph) -> None:
        if not self.binding.stage_members:
            return
        output = next(n for n in graph.nodes if n.op == "output")
        results = output.args[0]
        loss = results[0] if isinstance(results, (tuple, list)) else results
        declared = self.binding.loss_stage()
        if declared is None:
            raise LoweringError(Finding(
                codes_lower.UNASSIGNED_OP,
                f"the loss ({_describe(loss)}) is computed outside every "
                "module assigned to a pipeline stage, and no stage lists `loss`",
                self.binding.stage_span(len(self.graphs) - 1), "(root)"))
        actual = self.stage_of.get(loss)
        if actual is not None and actual > declared:
            raise LoweringError(Finding(
                codes_plan.STAGE_ORDER,
                f"{self.binding.stage_label(declared)} lists `loss`, but the loss needs "
                f"values of {self.binding.stage_label(actual)}",
                self.binding.stage_span(declared), "loss"))

    def _mean_then_sum(self, root: loss_norm.Root) -> bool:
        """A loss summing a mean over dimensions that hold every split of the averaged
        tensor (``e.pow(2).mean(0).sum()`` with the batch split): the mean is each rank's
        own (``Partial(avg)`` over the data axes, as a mean over every dimension is), the
        sum after it linear and over no rank's share. Under the default ``local-mean`` the
        ordinary rules lower it; a split of another dimension leaves it a sum over shares."""
        if root.averaged is None or loss_norm.mode_of(self.plan) != "local-mean":
            return False
        lay = self.layouts.get(root.averaged)
        return isinstance(lay, TLayout) and not lay.partial and all(
            d in root.mean_dims for d in range(lay.rank) if lay.dim_axes(d))

    def visit(self, node: torch.fx.Node) -> None:
        stage = self.stage
        if node in self.values[stage]:
            return
        self.current = node
        name = packet_name(node.target)
        self.current_cause = self._merge_causes(node)
        if name == MARK:
            new, lay = self._mark(node)
        elif any(node is r.node and not self._mean_then_sum(r) for r in self.loss_roots):
            root = next(r for r in self.loss_roots if node is r.node)
            new, lay = loss_norm.lower_root(self, root)
            operands = [(a, self.layouts.get(a), _floating(a)) for a in node.all_input_nodes]
            self.grads.op(node, name, operands, lay, self.current_cause, self._where())
        elif any(node in r.guards for r in self.loss_roots):
            # a guard of the loss's count (`count.clamp(min=1)`): the division applies it to
            # the count it divides by (``loss.normalise``); here it passes the count through
            inner = node.args[0]
            new, lay = self.value(stage, inner), self.layouts[inner]
            operands = [(a, self.layouts.get(a), _floating(a)) for a in node.all_input_nodes]
            self.grads.op(node, name, operands, lay, self.current_cause, self._where())
        elif name == "getitem":
            parent, index = node.args
            new = self.emit(node.target, (self.value(stage, parent), index))
            lay = self.layouts[parent][index]
            self.grads.op(node, name, [(parent, None, True)], lay, self.current_cause)
        else:
            new, lay = self._ordinary(node, name)
        self.values[stage][node] = new
        self.layouts[node] = lay
        expected = None if isinstance(lay, tuple) else lay.local_shape(self.sizes)
        got = tuple(new.meta["val"].shape) if isinstance(new.meta.get("val"), torch.Tensor) \
            else None
        if expected is not None and got is not None and tuple(expected) != got:
            raise LoweringError(Finding(
                codes_lower.LAYOUT_MISMATCH, f"{name} in {self._where()} cannot be computed "
                f"on the local pieces: it produced local shape {got} where its layout "
                f"{lay.describe()} needs {tuple(expected)}", self.current_cause,
                self._where()))

    def _ordinary(self, node: torch.fx.Node, name: str) -> tuple[torch.fx.Node, Any]:
        rule = RULES.get(name)
        try:
            if rule is None:
                result = self._fallback(node, name)
            else:
                result = rule(self, node.args, dict(node.kwargs), node.meta.get("val"))
            for lay in result.layout if isinstance(result.layout, tuple) else (result.layout,):
                if isinstance(lay, TLayout):
                    _one_factor_per_axis(lay, self.sizes)
        except LayoutError as error:
            blamed = self._operand_cause(node, error) or (
                self.cause_for(error.axes) if error.axes else self.current_cause)
            frame = user_frame(node.meta.get("stack_trace"))
            raise LoweringError(Finding(codes_lower.LAYOUT_MISMATCH,
                                        f"{name.removeprefix('aten.')} in "
                                        f"{self._where()}: {error}", blamed,
                                        self._where(), notes=(f"computed by the model's code "
                                                              f"at {frame}",) if frame else ()
                                        )) from None
        args = torch.fx.node.map_aggregate(result.args, lambda a: self.value(self.stage, a))
        kwargs = torch.fx.node.map_aggregate(result.kwargs,
                                             lambda a: self.value(self.stage, a))
        try:
            new = self.emit(node.target, args, kwargs)
        except Exception as error:  # noqa: BLE001 - torch shape errors of the local op
            raise LoweringError(Finding(codes_lower.LAYOUT_MISMATCH,
                                        f"{name.removeprefix('aten.')} in "
                                        f"{self._where()} cannot run on the local pieces: "
                                        f"{str(error).splitlines()[0]}", self.current_cause,
                                        self._where())) from None
        operands = [(a, self.layouts.get(a), _floating(a)) for a in node.all_input_nodes]
        self.grads.op(node, name, operands, result.layout, self.current_cause, self._where())
        return new, result.layout

    def _fallback(self, node: torch.fx.Node, name: str) -> Result:
        inputs = [self.layouts[n] for n in node.all_input_nodes]
        if any(lay.partial or any(self.sizes[a] > 1 for a in lay.shard_axes())
               for lay in inputs if isinstance(lay, TLayout)):
            raise LayoutError(f"no layout rule for {name}, and an operand is split or partial")
        out = node.meta["val"]
        const = all(lay.const for lay in inputs if isinstance(lay, TLayout))
        if isinstance(out, (tuple, list)):
            lay = tuple(TLayout.replicated(o.shape, const) for o in out)
        else:
            lay = TLayout.replicated(out.shape if isinstance(out, torch.Tensor) else (), const)
        return Result(lay, node.args, dict(node.kwargs))

    # -- module boundaries: collectives and claims ----------------------------------------

    def _inside_an_algorithm(self, module: str, point: str) -> None:
        """A collective or claim the plan states inside a module an ``algorithm`` replaces
        (``copy layers.0.attention.wq.in`` under ``algorithm context-parallel-attention for
        layers.0.attention``): the algorithm computes the module whole, so the statement
        would not run. Rejected at the statement (TVP408), never dropped."""
        statements = list(self.binding.collectives_at(point)) + \
            list(self.binding.claims_at(point))
        site = algorithms.enclosing_site(self.algorithm_context, module) if statements \
            else None
        if site is None:
            return
        first = statements[0]
        raise LoweringError(Finding(
            codes_lower.ALGORITHM_NOT_APPLICABLE,
            f"`{point}` is inside `{site.module}`, which `algorithm {site.name}` replaces "
            "whole: the algorithm computes the module from its input, so what the plan "
            "states inside it would not run",
            first.origin, point, notes=(
                f"`algorithm {site.name} for {site.module}` is at "
                f"{site.origin.report_span.file}:{site.origin.report_span.line}",),
            help=f"state the collectives at the module's boundary (`{site.module}.in`, "
                 f"`{site.module}.out`), where the algorithm's input and output are"))

    def _mark(self, node: torch.fx.Node) -> tuple[torch.fx.Node, TLayout]:
        source, point = node.args
        module, _, side = point.rpartition(".")
        self._inside_an_algorithm(module, point)
        if side.startswith("in"):
            self.entered.setdefault(module, self.order)
        replaced = algorithms.module_output(self.algorithm_context, point)
        if replaced is not None:
            value, lay = replaced
            # the backward through the algorithm, as far as it declared it
            for source, axes, span in self.algorithm_inputs:
                self.grads.algorithm_input(node, source, axes, span, self._where())
            self.algorithm_inputs.clear()
        else:
            value, lay = self.value(self.stage, source), self.layouts[source]
            if not self.binding.collectives_at(point):
                self.grads.op(node, MARK, [(source, lay, True)], lay, None)
        statements = self.binding.collectives_at(point)
        for i, statement in enumerate(statements):
            value, lay = self._collective(value, lay, statement, point)
            if replaced is None:
                # the statements at a point apply one after the other: the backward of each
                # reads the cotangent the next one's backward left (two `copy`s of one value
                # sum it twice), so each gets its own value between them; the backward sums
                # over the axes splitting its result too (``split``: different pieces)
                out = node if i == len(statements) - 1 else (node, i)
                self.grads.collective(out, source if i == 0 else (node, i - 1),
                                      st_sums(statement), statement,
                                      frozenset(lay.shard_axes()))
            if statement.kind in ("copy", "identity"):
                continue  # the value's layout is unchanged: nothing to blame it for
            causes = self.causes.setdefault(node, {})
            for axis in statement.axes:  # it changes the value's layout over these axes
                causes[axis] = ((self.order, 1), statement.origin)
        self.lineages[point] = lay
        # a point only the checker marked (a block boundary) is not observed: the plan says
        # nothing there, and the proof compares the value where it cuts (check/stages.py)
        if value.op != "placeholder" and isinstance(value.meta.get("val"), torch.Tensor) and \
                value.meta["val"].is_floating_point() and \
                module_of(point) in self.named_modules:
            self.observed.setdefault(self.stage, {}).setdefault(point, value)
        for claim in self.binding.claims_at(point):
            problem = claim_problem(claim, lay, self.sizes)
            if problem:
                self.findings.append(Finding(codes_lower.CLAIM_CONTRADICTS_LAYOUT,
                                             f"{point}: {problem}",
                                             claim.span, point))
        return value, lay

    def _collective(self, value: torch.fx.Node, lay: TLayout, st: Collective,
                    point: str) -> tuple[torch.fx.Node, TLayout]:
        axes = st.axes
        n = math.prod(self.sizes[a] for a in axes)
        span = st.origin
        kind = kind_of(st.kind)
        rank = lay.rank
        for option, given in (("dim", st.dim), ("split-dim", st.split_dim),
                              ("concat-dim", st.concat_dim)):
            if given is not None and not -rank <= given < rank:
                raise LoweringError(Finding(
                    codes_lower.COLLECTIVE_MISMATCH,
                    f"{st.kind} {point} over {', '.join(axes)}: {option}={given} is out of "
                    f"range: the value has {rank} dimension{'' if rank == 1 else 's'} "
                    f"(0 to {rank - 1})" if rank else
                    f"{st.kind} {point} over {', '.join(axes)}: {option}={given}, but the "
                    f"value is a scalar (no dimension to {st.kind} along)", span, point))
        dim = _norm(st.dim if st.dim is not None else (st.split_dim or 0), rank)
        dim2 = _norm(st.concat_dim, rank) if st.concat_dim is not None else -1
        op = st.op or "sum"
        backward = kind_of(st.backward)
        try:
            new_lay, problems = layout_after(st.kind, st.op or "sum", axes, dim, dim2, lay,
                                             self.sizes)
        except LayoutError as error:  # no layout describes the result: no local program
            raise LoweringError(Finding(codes_lower.LAYOUT_MISMATCH,
                                        f"{st.kind} {point} over {', '.join(axes)}: {error}",
                                        span, point)) from None
        cause, sum_span = self._sum_blame(st, lay, new_lay)
        # what is wrong with a sum another statement let through stands at that statement
        own = problems if sum_span == span else \
            layout_after(st.kind, op, axes, dim, dim2, lay.with_partial(None), self.sizes)[1]
        for message in problems:
            self.findings.append(Finding(codes_lower.COLLECTIVE_MISMATCH,
                                         f"{st.kind} {point} over {', '.join(axes)}: "
                                         f"{message}", span if message in own else sum_span,
                                         point))
        new_lay = TLayout(new_lay.dims, new_lay.partial, new_lay.const,
                          cause if new_lay.partial else None)
        try:
            out = self.emit(torch.ops.tvp.collective.default,
                            (value, kind, ",".join(axes), n, op, dim, dim2, backward))
        except Exception as error:  # noqa: BLE001 - e.g. a block size that does not divide
            raise LoweringError(Finding(codes_lower.LAYOUT_MISMATCH, f"{st.kind} {point}: "
                                        f"{str(error).splitlines()[0]}", span, point)) from None
        got = tuple(out.meta["val"].shape)
        if got != tuple(new_lay.local_shape(self.sizes)):
            new_lay = _opaque(out.meta["val"].shape)
        return out, new_lay

    def _sum_blame(self, st: Collective, lay: TLayout, new_lay: TLayout) -> tuple[Any, Any]:
        """Who answers for a partial sum at collective ``st``: ``(the cause the sum leaves
        with, where the problems the sum causes here stand)``.

        A sum is blamed, from the first collective that leaves it partial while acting on it,
        on that collective: a reduction (over the wrong axis, or too few), or a scatter, gather
        or copy over an axis of the sum where its reduction belongs. That statement decided
        what to do with the sum, not the split that made it. Once the sum is blamed somewhere
        (on such a collective, or where a finding of an op on it stands), a later collective
        receiving it is not blamed for it, nor for what it finds wrong with it: those findings
        stand where the others on the sum do."""
        if lay.partial is not None and lay.cause in self.settled:
            return (lay.cause if new_lay.partial else None), lay.cause
        passes = new_lay.partial is not None and (
            kind_of(st.kind) in ("all_reduce", "reduce_scatter")
            or bool(set(st.axes) & set(new_lay.partial[1])))
        if not passes:
            return new_lay.cause, st.origin
        self.settled.add(st.origin)
        return st.origin, st.origin

    # -- outputs --------------------------------------------------------------------------

    def _outputs(self, node: torch.fx.Node) -> None:
        results = node.args[0]
        loss = results[0] if isinstance(results, (tuple, list)) else results
        loss_stage = self.stage_of.get(loss, 0)
        loss_stage = 0 if loss_stage is None else loss_stage
        listed = self.binding.loss_stage() if self.binding.stage_members else None
        if listed is not None and listed != loss_stage:  # never moved silently (§5)
            self.findings.append(Finding(
                codes_plan.STAGE_ORDER,
                f"`loss` is listed on {self.binding.stage_label(listed)}, but it is computed "
                f"on {self.binding.stage_label(loss_stage)}, where its operands are "
                "(docs/semantics.md Rule 5.1)",
                self.binding.stage_span(listed), "loss"))
        self.stage = loss_stage
        final = algorithms.loss_replacement(self.algorithm_context)
        if final is None:
            final = self.value(loss_stage, loss)
            lay = self.layouts[loss]
        else:
            final, lay = final
        self.lineages["loss"] = lay
        if isinstance(lay, TLayout) and lay.partial and lay.partial[0] in ("max", "min"):
            # a maximum over split data (`err.amax()`): each rank's loss is the extreme of its
            # own block, and no loss reduction (a mean or sum of the local losses) makes the
            # extreme of the step, nor gives only its argument a gradient
            self.findings.append(Finding(
                codes_lower.LOSS_REDUCTION_MISMATCH,
                f"the loss is a {lay.partial[0]}imum over {', '.join(lay.partial[1])}: each "
                f"rank's loss is the {lay.partial[0]}imum of its own block, which no "
                "loss-reduction combines into the step's (docs/semantics.md Rule 4.5)",
                lay.cause, "loss", f"all-reduce the value over {', '.join(lay.partial[1])} "
                f"with op={lay.partial[0]} before the loss takes it, or do not split its data"))
        for claim in self.binding.claims_at("loss"):  # a claim on `loss` (§4.6)
            problem = claim_problem(claim, lay, self.sizes)
            if problem:
                self.findings.append(Finding(codes_lower.CLAIM_CONTRADICTS_LAYOUT,
                                             f"loss: {problem}",
                                             claim.span, "loss"))
        self.outputs[loss_stage].append(Slot("loss", "loss", "loss", lay))
        for k in range(len(self.loss_counts)):
            self.outputs[loss_stage].append(Slot(loss_norm.COUNT if not k else
                                                 f"{loss_norm.COUNT}.{k}", "count", "loss",
                                                 TLayout(())))
        for old in self.sent:
            home = self.stage_of[old]
            self.outputs[home].append(Slot(f"send.{old.name}", "send", old.name,
                                           self.layouts[old]))
        self._finish(final, loss_stage)

    def _finish(self, loss: torch.fx.Node, loss_stage: int) -> None:
        for stage, graph in enumerate(self.graphs):
            outs = []
            counts = iter(self.loss_counts)  # the count slots are in the normalisers' order
            for slot in self.outputs[stage]:
                if slot.kind == "loss":
                    outs.append(loss)
                elif slot.kind == "count":
                    outs.append(next(counts)[0])
                else:
                    old = next(n for n in self.sent if n.name == slot.spec)
                    outs.append(self.values[stage][old])
            # the value at every marked point, for comparing lineages in simulation (their
            # cotangents are zero: observing a value does not change the step)
            seen = set(outs)
            for point, node in self.observed.get(stage, {}).items():
                if node not in seen:
                    seen.add(node)
                    self.outputs[stage].append(Slot(f"lineage.{point}", "lineage", point,
                                                    self.lineages[point]))
                    outs.append(node)
            graph.output(tuple(outs))


def st_sums(statement: Collective) -> tuple[str, ...]:
    """The axes whose cotangent the statement's backward sums (all-reduce, reduce-scatter)."""
    return tuple(statement.axes) if COLLECTIVES[statement.backward].sums else ()


def _floating(node: Any) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_floating_point()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _one_factor_per_axis(lay: TLayout, sizes: dict[str, int]) -> None:
    """A mesh axis splits at most one dimension of a value: over two (``a @ b.T`` with the
    rows of both split over dp) each rank would hold its diagonal block only, and no rank the
    others."""
    seen: dict[str, int] = {}
    for d, dim in enumerate(lay.dims):
        for f in dim:
            for a in f.axes:
                if sizes.get(a, 1) > 1 and a in seen:
                    where = f"dimensions {seen[a]} and {d}" if seen[a] != d else \
                        f"two factors of dimension {d}"
                    raise LayoutError(f"the result would be split over {a} along {where}: "
                                      "each rank would hold only its diagonal block, and no "
                                      "rank the others (gather one operand first)", (a,))
                seen[a] = d


def _norm(d: int | None, rank: int) -> int:
    if d is None:
        return -1
    return d + rank if d < 0 else d


def _describe(node: torch.fx.Node) -> str:
    stack = module_stack(node)
    where = stack[-1] if stack else "the root module"
    return f"{packet_name(node.target).removeprefix('aten.')} in {where}"


def _opaque(shape: Any) -> TLayout:
    return TLayout.replicated(tuple(shape))


def claim_problem(claim: Any, lay: TLayout, sizes: Mapping[str, int]) -> str | None:
    """Why the derived layout ``lay`` contradicts a layout statement, or ``None``."""
    want = claim.layout
    for axis in sizes:
        if axis == MICROBATCH_AXIS or axis == PIPELINE_AXIS:
            continue
        placement = want.placement(axis)
        kind = type(placement).__name__
        derived_partial = lay.partial is not None and axis in lay.partial[1]
        derived_dims = [d for d in range(lay.rank) if axis in lay.dim_axes(d)]
        if kind == "Partial" and not derived_partial:
            return f"claimed partial over {axis}, but the value is complete over it"
        if kind == "Partial" and lay.partial and placement.op != lay.partial[0]:
            return f"claimed partial({placement.op}) over {axis}, but the value is " \
                   f"partial({lay.partial[0]}) over it"
        if kind != "Partial" and derived_partial:
            assert lay.partial is not None
            said = f"claimed {'split' if kind == 'Shard' else 'replicated'} over {axis}"
            if axis not in want.stated_axes:
                return (f"{said} (no layout statement of `{want.target}` names {axis}, and "
                        f"an axis none names is claimed replicated), but the value is "
                        f"partial({lay.partial[0]}) over it: add `partial {want.target} over "
                        f"{axis} op={lay.partial[0]}` if that is meant, else a reduction is "
                        "missing")
            return (f"{said}, but the value is partial({lay.partial[0]}) over it (a "
                    "reduction is missing)")
        if kind == "Shard" and placement.dim not in derived_dims:
            return f"claimed split over {axis} on dimension {placement.dim}, derived " \
                   f"{lay.describe()}"
        if kind == "Shard" and (want.order_of_dim(placement.dim) == ZIGZAG) != \
                lay.is_zigzag(placement.dim):
            return (f"claimed {want.order_of_dim(placement.dim)} blocks on dimension "
                    f"{placement.dim}, but the value holds {lay.describe()} (§2.6)")
        if kind == "Replicate" and derived_dims:
            return f"claimed replicated over {axis}, but it is split over {axis} " \
                   f"({lay.describe()})"
    return None


def input_sizes(plan: Plan) -> dict[str, int]:
    assert plan.mesh is not None
    sizes = {a.name: a.size for a in plan.mesh.axes}
    sizes[MICROBATCH_AXIS] = plan.microbatches
    return sizes


def lower(plan: Plan, model: nn.Module, inputs: Mapping[str, torch.Tensor],
          marked: frozenset[str] = frozenset(), blocks: str | None = None) -> Lowered:
    """The local forward program of every stage. ``model`` and ``inputs`` are fake (global
    shapes). Raises ``LoweringError`` (with a plan span) when the plan cannot be lowered;
    softer problems are ``Lowered.findings``. ``marked``: modules whose boundaries are
    marked besides those the plan names (identities with no collective; the checker marks
    every block of the spec so that a value crossing stages there is known by its point).
    ``blocks``: the block list whose blocks each become a stage of their own, on the ranks
    of the plan's stage that holds them (``bind.segment_stages``; the checker's cuts)."""
    if plan.mesh is None:
        raise LoweringError(Finding(codes_lower.UNBOUND_NAME, "the plan has no mesh", None, ""))
    plan = resolve_indices(plan, model)  # layers[-1] is the last layer
    sizes = input_sizes(plan)
    binding = bind_plan(plan, model, {k: tuple(v.shape) for k, v in inputs.items()}, sizes,
                        blocks)
    if binding.errors:
        raise LoweringError(*binding.errors)
    try:
        captured = capture_forward(model, inputs, binding.marked_modules() | set(marked))
        lowering = _Lowering(plan, model, binding, captured, sizes)
        lowering.run()
    except LoweringError as error:
        error.binding = binding
        raise
    stages = []
    for index, graph in enumerate(lowering.graphs):
        ordered = _placeholders_first(graph)
        gm = torch.fx.GraphModule(captured.gm, ordered)
        stages.append(StageProgram(index, gm, lowering.inputs[index], lowering.outputs[index]))
    counted = lowering.loss_counts[0][1] if lowering.loss_counts else ()
    copies = _pipeline_copies(lowering)
    lowering.grads.pipeline_copies(copies)
    lowering.grads.finish(binding.grad_statements, binding.data_axes(), plan.loss_scale,
                          plan.microbatches, dict(plan.header_origins),
                          loss_norm.mode_of(plan), counted,
                          loss_norm.root_axes(lowering.layouts, lowering.found_root)
                          if lowering.found_root is not None else None)
    routes = _explicit_sends(lowering, stages)
    backward = _backward_findings(lowering)  # may add a note to a forward finding
    findings = merge_repeats(binding.warnings + lowering.findings + backward)
    counted = lowering.loss_counts[0][1] if lowering.loss_counts else ()
    points = {node.name: point for point, node in sorted(lowering.marks.items())}
    entering = re.compile(re.escape(blocks) + r"\.\d+\.in") if blocks else None
    leaving = re.compile(re.escape(blocks) + r"\.\d+\.out") if blocks else None
    for point, node in sorted(lowering.marks.items()):
        # a value sent to the stage whose module it enters is received before that
        # module's `.in` mark (the mark is the receiver's first op): it carries the point too,
        # and when the stages are split at blocks, a block's boundary is the name a value
        # entering it goes by (the embedding's `embed.out` is `layers.0.in`: the checker cuts
        # its proof at block boundaries; the previous block's `.out` names it already)
        source = node.args[0] if node.args else None
        if point.endswith(".in") and isinstance(source, torch.fx.Node):
            if entering is not None and entering.fullmatch(point) and \
                    not leaving.fullmatch(points.get(source.name, "")):
                points[source.name] = point
            else:
                points.setdefault(source.name, point)
    return Lowered(plan, binding, sizes, stages, lowering.lineages, findings,
                   routes, counted, points, lowering.local_counts, lowering.fixed_count)


def _pipeline_copies(lowering: _Lowering) -> dict[str, tuple[int, Span | None]]:
    """Tied parameters held on several pp ranks (docs/semantics.md §5.4): parameter -> (the
    number of pp ranks holding a copy, the `pipeline-stage` statement of the last of them,
    which put a second use of the parameter on another stage). A gradient statement over
    the pipeline axis sums exactly these copies; naming a parameter held on one pp rank it
    has nothing to sum, and is rejected (TVP246), never run as an identity."""
    binding = lowering.binding
    copies: dict[str, tuple[int, Span | None]] = {}
    for param, stages in lowering.param_stages().items():
        ranks = sorted({binding.stage_place(s) for s in stages})
        if len(ranks) > 1:
            copies[param] = (len(ranks), binding.stage_span(max(stages)))
    for st, names in binding.grad_statements:
        if PIPELINE_AXIS not in st.axes:
            continue
        single = [n for n in names if n not in copies]
        if single:
            shown = ", ".join(f"`{n}`" for n in single[:3])
            more = f" and {len(single) - 3} more" if len(single) > 3 else ""
            raise LoweringError(Finding(
                codes_plan.PIPELINE_AXIS_GROUP,
                f"`{st.kind} {st.target} over {', '.join(st.axes)}` sums the copies of a tied "
                f"parameter over the pipeline stages holding it, but {shown}{more} "
                f"{'is' if len(single) == 1 else 'are'} used on one pp rank only: there is "
                "no other copy to add", st.origin.report_span, str(st.target),
                help="only a parameter used on several stages (an embedding tied to the output "
                     "head) has copies over pp: name it alone (`all-reduce grad(embed.weight) "
                     "over pp`); other gradients go over the data axes"))
    return copies


def _backward_findings(lowering: _Lowering) -> list[Finding]:
    """The gradient checks' findings, when the forward has no error. The backward analysis
    takes the forward layouts as given: after a forward error (a partial sum that reaches a
    nonlinear op) its findings are consequences blamed on correct statements (a `copy`
    whose backward now sums a gradient that the broken forward made complete), so they
    wait until the forward is fixed."""
    from trainverify_dsl.report.diagnostics import Severity

    forward_errors = [f for f in lowering.findings
                      if f.code.severity is Severity.ERROR]
    if not forward_errors:
        return lowering.grads.findings
    if lowering.grads.findings:
        first = forward_errors[0]
        lowering.findings[lowering.findings.index(first)] = Finding(
            first.code, first.message, first.span, first.where, first.help,
            first.notes + ("the gradient checks run once the forward has no errors",))
    return []


def _explicit_sends(lowering: _Lowering, stages: list[StageProgram]
                    ) -> dict[tuple[int, str], str | None]:
    """Rule 5.2: ``send T from i to j`` delivers ``T`` to stage ``j``'s boundary input of
    ``T`` itself when stage ``j`` reads ``T`` (the implied transfer, restated), else to its
    first boundary input with ``T``'s shape; the stage that received ``T`` by implication
    reads a free value instead."""
    routes: dict[tuple[int, str], str | None] = {}
    for point, source, dest, span in lowering.binding.sends:
        mark = lowering.marks.get(point)
        if mark is None:
            raise LoweringError(Finding(codes_lower.UNBOUND_NAME,
                                        f"the spec model never passes through "
                                        f"`{point}`", span, point))
        home = lowering.stage_of.get(mark)
        if home != source:
            raise LoweringError(Finding(codes_plan.STAGE_ORDER, f"`send {point} from {source}`: "
                                        f"`{point}` is computed on stage {home}", span, point))
        if not 0 <= dest < len(stages) or dest <= source:
            raise LoweringError(Finding(codes_plan.STAGE_ORDER, f"`send {point} from {source} to "
                                        f"{dest}`: the destination must be a later stage",
                                        span, point))
        shape = lowering.layouts[mark].local_shape(lowering.sizes)
        received = [slot for slot in stages[dest].inputs if slot.kind == "recv" and
                    slot.layout.local_shape(lowering.sizes) == shape]
        target = next((slot for slot in received if slot.spec == mark.name),
                      received[0] if received else None)
        if target is None:
            raise LoweringError(Finding(codes_plan.STAGE_ORDER,
                                        f"stage {dest} has no boundary input "
                                        f"shaped like `{point}` to receive it", span, point))
        starved = sorted(s for s in lowering.sent.get(mark, ()) if s != dest)
        for stage in starved:
            routes[(stage, mark.name)] = None
        if mark not in lowering.sent:  # stage `source` has no such output to send
            raise LoweringError(Finding(codes_plan.STAGE_ORDER,
                                        f"`{point}` is sent, but it is not a "
                                        "value that crosses stages: no later stage reads it "
                                        "(a later stage reads a value computed from it)",
                                        span, point))
        if target.spec != mark.name:  # the destination reads another tensor there
            notes = tuple(f"stage {s}, which reads `{point}`, gets no value for it (a free "
                          "value, Rule 5.2)" for s in starved)
            lowering.findings.append(Finding(
                codes_plan.STAGE_ORDER,
                f"`send {point} from {source} to {dest}` delivers `{point}` where stage "
                f"{dest} reads {_crossing(lowering, target.spec)}: stage {dest} would compute "
                "on the wrong tensor", span, point, notes=notes,
                help=f"send `{point}` to the stage that reads it, or remove the `send` (values "
                     "cross stages where the model's data flow needs them)"))
        routes[(dest, target.spec)] = mark.name
    return routes


def _crossing(lowering: _Lowering, name: str) -> str:
    """A value that crosses stages, as the plan names it: its marked point, else the op."""
    point = next((p for p, node in lowering.marks.items() if node.name == name), None) or \
        next((p for p, node in lowering.marks.items()
              if isinstance(node.args[0], torch.fx.Node) and node.args[0].name == name), None)
    if point is not None:
        return f"`{point}`"
    node = next((n for n in lowering.cap.gm.graph.nodes if n.name == name), None)
    if node is None:
        return f"`{name}`"
    home = lowering.stage_of.get(node)
    return _describe(node) + (f" (computed on stage {home})" if home is not None else "")


def _placeholders_first(graph: torch.fx.Graph) -> torch.fx.Graph:
    out = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    nodes = list(graph.nodes)
    for node in [n for n in nodes if n.op == "placeholder"] + \
            [n for n in nodes if n.op != "placeholder"]:
        env[node] = out.node_copy(node, lambda n: env[n])
    out.lint()
    return out
