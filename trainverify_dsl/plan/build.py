"""Flat leaves -> ``Plan``: headers first (their values name expressions), then every
statement in program order, with the per-statement checks (names, options, numbers)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction

from trainverify_dsl.parse import ast
from trainverify_dsl.parse.format import value_text
from trainverify_dsl.plan import messages, vocab
from trainverify_dsl.plan.evaluate import VALUE_NAMES, Evaluator
from trainverify_dsl.plan.expand import Leaf
from trainverify_dsl.plan.layouts import (
    LayoutStmt,
    LayoutTable,
    claim_of,
    unknown_option,
    unknown_reduce_op,
)
from trainverify_dsl.plan.model import (
    DEFAULT_BACKWARD,
    Algorithm,
    ClipGradNorm,
    Collective,
    LossReduction,
    Mesh,
    MeshAxis,
    Optimizer,
    OptionValue,
    Origin,
    ParamGroup,
    PipelineStage,
    Plan,
    RankOverride,
    Send,
    SpecRef,
    TensorPattern,
)
from trainverify_dsl.plan.patterns import invalid_segment, pattern_of
from trainverify_dsl.report import codes_plan as codes
from trainverify_dsl.report.diagnostics import Collector
from trainverify_dsl.report.span import Span

_HEADER_TYPES = (ast.PlanHeader, ast.SpecDecl, ast.MeshDecl, ast.MicrobatchesDecl,
                 ast.LossScaleDecl, ast.LossReductionDecl, ast.OptimizerDecl,
                 ast.SpecOptimizerDecl, ast.ClipGradNormDecl)
_HEADER_WORDS = {ast.PlanHeader: "plan", ast.SpecDecl: "spec", ast.MeshDecl: "mesh",
                 ast.MicrobatchesDecl: "microbatches", ast.LossScaleDecl: "loss-scale",
                 ast.LossReductionDecl: "loss-reduction",
                 ast.OptimizerDecl: "optimizer", ast.SpecOptimizerDecl: "spec-optimizer",
                 ast.ClipGradNormDecl: "clip-grad-norm"}
#: The most devices a mesh may have (rank numbers are int64 everywhere); also keeps every
#: group size and divisor computed from the mesh small enough to print.
MAX_DEVICES = 2**63 - 1
#: Spec settings that must be whole numbers, with their least value; ``n_layers`` overrides
#: the config's layer count (the pipeline checks use it).
_INT_SETTINGS = {"batch": 1, "seq": 1, "n_layers": 0}
#: The spec settings that expressions may name.
_EXPRESSION_NAMES = ("batch", "seq")


#: The dimension options a stated backward of each kind runs along (Rule 3.3).
REQUIRED_OPTIONS_OF_BACKWARD: dict[str, tuple[str, ...]] = {
    "all-gather": ("dim",), "reduce-scatter": ("dim",), "scatter": ("dim",),
    "all-to-all": ("split-dim", "concat-dim"),
}


@dataclass(slots=True)
class _Parts:
    collectives: list[Collective] = field(default_factory=list)
    sends: list[Send] = field(default_factory=list)
    stages: list[PipelineStage] = field(default_factory=list)
    algorithms: list[Algorithm] = field(default_factory=list)
    collective_keys: dict[object, Origin] = field(default_factory=dict)


class Builder:
    def __init__(self, leaves: list[Leaf], main_file: str, files: list[str],
                 collector: Collector, *, has_header: bool,
                 sizes: Mapping[str, int] | None = None):
        self.leaves, self.main_file, self.files = leaves, main_file, files
        #: counts in place of the statements' (``resolve_plan_file``): ``microbatches`` and
        #: mesh axes by name
        self.forced = dict(sizes or {})
        self.collector = collector
        self.has_header = has_header
        self.evaluator = Evaluator(collector)
        self.headers: dict[type, Leaf] = {}
        self.mesh: Mesh | None = None

    def build(self) -> Plan:
        self._pick_headers()
        self._repeated_options()
        spec = self._spec()
        self.mesh = self._mesh()
        microbatches, schedule = self._microbatches()
        loss_scale = self._loss_scale()
        parts, layouts = self._statements()
        optimizer = self._optimizer()
        spec_optimizer = self._optimizer(ast.SpecOptimizerDecl)
        return Plan(
            name=self._name(), file=self.main_file, spec=spec, mesh=self.mesh,
            microbatches=microbatches, schedule=schedule, loss_scale=loss_scale,
            layouts=layouts, collectives=tuple(parts.collectives), sends=tuple(parts.sends),
            stages=tuple(parts.stages), optimizer=optimizer,
            spec_optimizer=spec_optimizer,
            clip_grad_norm=self._clip(), algorithms=tuple(parts.algorithms),
            files=tuple(self.files), header_origins=self._header_origins(),
            loss_reduction=self._loss_reduction(), overrides=self._overrides(optimizer),
            param_groups=self._param_groups(optimizer, ast.OptimizerDecl),
            spec_param_groups=self._param_groups(spec_optimizer, ast.SpecOptimizerDecl))

    # ------------------------------------------------------------ headers

    def _pick_headers(self) -> None:
        for leaf in self.leaves:
            if not isinstance(leaf.stmt, _HEADER_TYPES):
                continue
            kind = type(leaf.stmt)
            first = self.headers.get(kind)
            if first is None:
                self.headers[kind] = leaf
                continue
            word = _HEADER_WORDS[kind]
            code = codes.MESH_REDECLARED if kind is ast.MeshDecl else codes.REPEATED_HEADER
            self.collector.add(messages.conflict(
                code, f"'{word}' is stated more than once", first.origin, leaf.origin, [],
                f"keep one '{word}' statement"))

    def _repeated_options(self) -> None:
        """An option given twice in one statement (``op=sum op=avg``) is an error: which
        one would count is a guess."""
        for leaf in self.leaves:
            seen: dict[str, ast.Option] = {}
            for option in _options_of(leaf.stmt):
                first = seen.setdefault(option.key.name, option)
                if first is not option:
                    self.collector.add(messages.conflict(
                        codes.DUPLICATE_OPTION, f"option '{option.key.name}' is given twice",
                        Origin(first.span, leaf.origin.trail),
                        Origin(option.span, leaf.origin.trail), [],
                        f"keep one '{option.key.name}'"))

    def _header(self, kind: type) -> tuple[ast.Statement, Origin] | tuple[None, None]:
        leaf = self.headers.get(kind)
        return (leaf.stmt, leaf.origin) if leaf is not None else (None, None)

    def _header_origins(self) -> tuple[tuple[str, Origin], ...]:
        """Where the step-wide headers stand (``microbatches``, ``loss-scale``), so that a
        finding about them is reported at their line."""
        kinds = {ast.MicrobatchesDecl: "microbatches", ast.LossScaleDecl: "loss-scale",
                 ast.LossReductionDecl: "loss-reduction"}
        return tuple((name, self.headers[kind].origin) for kind, name in kinds.items()
                     if kind in self.headers)

    def _name(self) -> str | None:
        stmt, _ = self._header(ast.PlanHeader)
        return stmt.name.name if stmt is not None else None

    def _spec(self) -> SpecRef | None:
        stmt, origin = self._header(ast.SpecDecl)
        if stmt is None:
            return None
        settings: list[tuple[str, OptionValue]] = []
        ints: dict[str, int] = {}
        for option in stmt.settings:
            key, sub = option.key.name, Origin(option.span, origin.trail)
            if key in _INT_SETTINGS and not isinstance(option.value, ast.Path | ast.TupleValue):
                value = self.evaluator.integer(option.value, sub, f"spec {key}",
                                               minimum=_INT_SETTINGS[key])
                if value is not None:
                    ints[key] = value
                    settings.append((key, Fraction(value)))
                continue
            value = self.evaluator.option(option.value, sub)
            if value is not None:
                settings.append((key, value))
        self.evaluator.names.update({k: Fraction(v) for k, v in ints.items()
                                     if k in _EXPRESSION_NAMES})
        config = dict(settings).get("config")
        return SpecRef(stmt.model, config if isinstance(config, str) else None,
                       ints.get("batch"), ints.get("seq"), tuple(settings), origin)

    def _mesh(self) -> Mesh | None:
        stmt, origin = self._header(ast.MeshDecl)
        if stmt is None:
            if self.has_header:
                self.collector.add(messages.at(
                    codes.MISSING_MESH, "the plan declares no mesh",
                    Origin(self._first_span()), help="add e.g. 'mesh dp=2, tp=2'"))
            return None
        axes: list[MeshAxis] = []
        devices = 1
        for axis in stmt.axes:
            sub = Origin(axis.span, origin.trail)
            if any(a.name == axis.name.name for a in axes):
                self.collector.add(messages.at(
                    codes.DUPLICATE_MESH_AXIS, f"mesh axis '{axis.name.name}' is declared twice",
                    sub, help="give every mesh axis a distinct name"))
                continue
            if axis.name.name in VALUE_NAMES:
                # both would be read by expressions (`loss-scale 1/(batch*microbatches)`)
                meaning = {"batch": "the global batch size", "seq": "the sequence length",
                           "microbatches": "the microbatch count"}[axis.name.name]
                self.collector.add(messages.at(
                    codes.DUPLICATE_MESH_AXIS, f"mesh axis '{axis.name.name}' has the name "
                    f"expressions read as {meaning} (`loss-scale 1/microbatches`): the name "
                    f"would mean either", sub,
                    help="give the axis another name (`dp`, `mb`, `sq`)"))
            size = self._mesh_size(axis, sub, devices)
            if size is not None and axis.name.name in self.forced:
                size = self.forced[axis.name.name]
            if size is not None:
                devices *= size
                axes.append(MeshAxis(axis.name.name, size, axis.span))
                self.evaluator.names[axis.name.name] = Fraction(size)
        return Mesh(tuple(axes), stmt.span)

    def _mesh_size(self, axis: ast.MeshAxis, origin: Origin, devices: int) -> int | None:
        """The axis size; ``devices`` is the product of the sizes of the axes before it."""
        value = self.evaluator.number(axis.size, origin)
        if value is None:
            return None
        if value.denominator != 1 or value < 1:
            self.collector.add(messages.at(
                codes.INVALID_MESH_SIZE,
                f"mesh axis '{axis.name.name}' has size {value}, not a positive integer",
                origin, help="mesh axis sizes count devices: use a whole number >= 1"))
            return None
        if devices * value > MAX_DEVICES:
            self.collector.add(messages.at(
                codes.INVALID_MESH_SIZE,
                f"mesh axis '{axis.name.name}' of size {value} makes the mesh larger than "
                f"{MAX_DEVICES} devices", origin,
                help="mesh axis sizes count devices: use realistic sizes"))
            return None
        return int(value)

    def _first_span(self) -> Span:
        return self.leaves[0].origin.span if self.leaves else Span.point(self.main_file, 1, 1)

    def _microbatches(self) -> tuple[int, str | None]:
        stmt, origin = self._header(ast.MicrobatchesDecl)
        count, schedule = 1, None
        if stmt is not None:
            value = self.evaluator.number(stmt.count, origin)
            if value is not None and (value.denominator != 1 or value < 1):
                self.collector.add(messages.at(
                    codes.INVALID_MICROBATCHES,
                    f"microbatches must be a positive integer, got {value}", origin,
                    help="state how many microbatches each dp rank runs per step (>= 1)"))
            elif value is not None:
                count = int(value)
            count = self.forced.get("microbatches", count)
            schedule = self._schedule(stmt, origin)
        self.evaluator.names["microbatches"] = Fraction(count)
        return count, schedule

    def _schedule(self, stmt: ast.MicrobatchesDecl, origin: Origin) -> str | None:
        if stmt.schedule is None:
            return None
        if stmt.schedule.name not in vocab.SCHEDULES:
            self.collector.add(messages.unknown_name(
                codes.UNKNOWN_SCHEDULE, "schedule", stmt.schedule.name, vocab.SCHEDULES,
                Origin(stmt.schedule.span, origin.trail)))
            return None
        return stmt.schedule.name

    def _loss_scale(self) -> Fraction:
        stmt, origin = self._header(ast.LossScaleDecl)
        if stmt is None:
            return Fraction(1)
        value = self.evaluator.number(stmt.value, origin)
        if value is not None and value <= 0:
            self.collector.add(messages.at(
                codes.INVALID_LOSS_SCALE, f"loss-scale must be positive, got {value}", origin,
                help="with a mean loss over microbatches use 'loss-scale 1/microbatches'"))
            return Fraction(1)
        return Fraction(1) if value is None else value

    # ------------------------------------------------------------ statements

    def _statements(self) -> tuple[_Parts, tuple]:
        parts = _Parts()
        table = LayoutTable(self.mesh, self.collector) if self.mesh is not None else None
        for leaf in self.leaves:
            stmt, origin = leaf.stmt, leaf.origin
            match stmt:
                case ast.SplitStmt() | ast.ReplicateStmt() | ast.PartialStmt() | ast.PlaceStmt():
                    self._layout(stmt, origin, table)
                case ast.CollectiveStmt():
                    self._collective(stmt, origin, parts)
                case ast.SendStmt():
                    self._send(stmt, origin, parts)
                case ast.PipelineStageStmt():
                    self._stage(stmt, origin, parts)
                case ast.AlgorithmStmt():
                    self._algorithm(stmt, origin, parts)
        return parts, table.layouts() if table is not None else ()

    def _target(self, node: ast.Target, origin: Origin) -> TensorPattern | None:
        bad = invalid_segment(node)
        if bad is not None:
            self.collector.add(messages.at(codes.INVALID_NUMBER, bad.message,
                                           Origin(bad.span, origin.trail), help=bad.help))
            return None
        return pattern_of(node)

    def _layout(self, stmt: LayoutStmt, origin: Origin, table: LayoutTable | None) -> None:
        target = self._target(stmt.target, origin)
        if target is None or table is None:
            return
        claim = claim_of(stmt, target, origin, self.mesh, self.collector)
        key = (type(stmt).__name__, claim.text, tuple(claim.placements),
               tuple(sorted(claim.dims.items())))
        table.add(claim, key)

    def _axes(self, idents: tuple[ast.Ident, ...], origin: Origin, construct: str):
        """The known axes of an ``over``/``shard over`` group, each once."""
        names: list[str] = []
        for ident in idents:
            if self.mesh is not None and not self.mesh.has(ident.name):
                self.collector.add(messages.unknown_axis(
                    ident.name, self.mesh, Origin(ident.span, origin.trail), construct))
            elif ident.name in names:
                self.collector.add(messages.at(
                    codes.AXIS_USED_TWICE, f"mesh axis '{ident.name}' is named twice in the "
                    f"group of {construct}", Origin(ident.span, origin.trail),
                    help="name each mesh axis of a group once"))
            else:
                names.append(ident.name)
        return tuple(names)

    def _collective(self, stmt: ast.CollectiveStmt, origin: Origin, parts: _Parts) -> None:
        target = self._target(stmt.target, origin)
        if target is None:
            return
        text = f"{stmt.kind} {target}"
        axes = self._axes(stmt.axes, origin, text)
        options = self._collective_options(stmt, origin, text)
        backward = self._backward(stmt, origin)
        key = (stmt.kind, str(target), axes, tuple(sorted(options.items())), backward)
        if key in parts.collective_keys:
            self.collector.add(messages.conflict(
                codes.DUPLICATE_STATEMENT, f"duplicate statement: {text}",
                parts.collective_keys[key], origin,
                ["a repeated collective runs twice (e.g. a doubled all-reduce)"],
                "remove the repeated statement"))
        parts.collective_keys[key] = origin
        op = options.get("op")
        if op is None and stmt.kind in ("all-reduce", "reduce-scatter"):
            op = "sum"
        parts.collectives.append(Collective(
            stmt.kind, target, axes, op if isinstance(op, str) else None,
            _int(options.get("dim")), _int(options.get("split-dim")),
            _int(options.get("concat-dim")),
            backward or DEFAULT_BACKWARD.get(stmt.kind, "identity"), backward is not None,
            tuple(options.items()), origin))

    def _collective_options(self, stmt: ast.CollectiveStmt, origin: Origin,
                            text: str) -> dict[str, OptionValue]:
        allowed = vocab.COLLECTIVE_OPTIONS.get(stmt.kind, ())
        values: dict[str, OptionValue] = {}
        for option in stmt.options:
            key, sub = option.key.name, Origin(option.span, origin.trail)
            if key not in allowed:
                self.collector.add(unknown_option(stmt.kind, key, allowed, sub))
            elif key == "op":
                op = self._reduce_op(option, stmt.kind, sub)
                if op is not None:
                    values[key] = op
            elif key == "after":
                after = self._sync_time(option, stmt, sub)
                if after is not None:
                    values[key] = after
            else:
                value = self._dim(option, sub)
                if value is not None:
                    values[key] = Fraction(value)
        self._required(stmt, origin, text)
        return values

    def _sync_time(self, option: ast.Option, stmt: ast.CollectiveStmt,
                   origin: Origin) -> OptionValue | None:
        """``after=last|each|K`` of a gradient statement (§4.5): a word or a microbatch
        number of at least 1 (at most ``microbatches`` is checked with the plan)."""
        if not isinstance(stmt.target, ast.GradRef):
            self.collector.add(messages.at(
                codes.UNKNOWN_OPTION, "'after=' times a gradient statement; this collective "
                "runs on an activation, where its tensor is computed", origin,
                help="remove 'after=...', or put the statement on grad(...)"))
            return None
        word = self.evaluator.word(option.value)
        if word in vocab.SYNC_TIMES:
            return word
        if word is not None and word not in self.evaluator.names:
            self._invalid_value("after", "last, each or a microbatch number", origin)
            return None
        value = self._dim(option, origin)
        if value is None:
            return None
        if value < 1:
            self._invalid_value("after", "last, each or a microbatch number of at least 1",
                                origin)
            return None
        return Fraction(value)

    def _required(self, stmt: ast.CollectiveStmt, origin: Origin, text: str) -> None:
        self._backward_dims(stmt, origin, text)
        given = {o.key.name for o in stmt.options}
        for key in vocab.REQUIRED_OPTIONS.get(stmt.kind, ()):
            if key in given:
                continue
            allowed = vocab.COLLECTIVE_OPTIONS.get(stmt.kind, ())
            misspelt = any(g not in allowed and messages.did_you_mean(g, [key]) for g in given)
            if not misspelt:
                self.collector.add(messages.at(
                    codes.MISSING_OPTION, f"{stmt.kind} needs the option '{key}='", origin,
                    notes=[f"in: {text}"],
                    help=f"state the tensor dimension, e.g. '{key}=0'"))

    def _backward_dims(self, stmt: ast.CollectiveStmt, origin: Origin, text: str) -> None:
        """A stated backward runs along the statement's own dimension options (Rule 3.3): a
        backward that gathers, scatters or reduce-scatters needs the forward to state a
        dimension, an all-to-all backward both of an all-to-all's; else it would run along a
        dimension nobody wrote."""
        backward = stmt.backward.name if stmt.backward is not None else None
        if backward is None or stmt.kind == backward:
            return
        needs = REQUIRED_OPTIONS_OF_BACKWARD.get(backward, ())
        states = vocab.REQUIRED_OPTIONS.get(stmt.kind, ())
        if needs and not (set(needs) <= set(states) or
                          (needs == ("dim",) and states)):
            shown = " and ".join(f"'{k}='" for k in needs)
            self.collector.add(messages.at(
                codes.MISSING_OPTION, f"`backward {backward}` runs along {shown}, which "
                f"`{stmt.kind}` does not state", origin, notes=[f"in: {text}"],
                help=f"a `{stmt.kind}` has no dimension for its backward to {backward} along: "
                     "state the collective whose backward this is instead (`all-gather ... "
                     "dim=N backward reduce-scatter`)"))

    def _reduce_op(self, option: ast.Option, construct: str, origin: Origin) -> str | None:
        known = vocab.COLLECTIVE_REDUCE_OPS.get(construct, vocab.REDUCE_OPS)
        word = self.evaluator.word(option.value)
        if word is None or word not in known:
            self.collector.add(unknown_reduce_op(word or value_text(option.value), construct,
                                                 known, origin))
            return None
        return word

    def _dim(self, option: ast.Option, origin: Origin) -> int | None:
        if isinstance(option.value, ast.Path | ast.TupleValue):
            self._invalid_value(option.key.name, "a dimension number", origin)
            return None
        return self.evaluator.integer(option.value, origin, f"option '{option.key.name}'")

    def _invalid_value(self, key: str, expected: str, origin: Origin) -> None:
        self.collector.add(messages.at(
            codes.INVALID_OPTION_VALUE, f"option '{key}' needs {expected}", origin,
            help=f"write {key}=<{expected}>"))

    def _out_of_range(self, key: str, expected: str, got: str, origin: Origin) -> None:
        self.collector.add(messages.at(
            codes.INVALID_OPTION_VALUE, f"option '{key}' needs {expected}, got {got}", origin,
            help="use a value torch.optim accepts"))

    def _backward(self, stmt: ast.CollectiveStmt, origin: Origin) -> str | None:
        if stmt.backward is None:
            return None
        name = stmt.backward.name
        if name not in vocab.BACKWARD_KINDS:
            self.collector.add(messages.unknown_name(
                codes.INVALID_BACKWARD, "backward kind", name, vocab.BACKWARD_KINDS,
                Origin(stmt.backward.span, origin.trail)))
            return None
        return name

    def _send(self, stmt: ast.SendStmt, origin: Origin, parts: _Parts) -> None:
        target = self._target(stmt.target, origin)
        source = self.evaluator.integer(stmt.source, origin, "send source stage")
        dest = self.evaluator.integer(stmt.dest, origin, "send destination stage")
        if target is not None and source is not None and dest is not None:
            parts.sends.append(Send(target, source, dest, origin))

    def _stage(self, stmt: ast.PipelineStageStmt, origin: Origin, parts: _Parts) -> None:
        index = self.evaluator.integer(stmt.index, origin, "pipeline stage index")
        members = [self._target(m, origin) for m in stmt.members]
        if index is not None:
            parts.stages.append(PipelineStage(index, tuple(m for m in members if m), origin))

    def _algorithm(self, stmt: ast.AlgorithmStmt, origin: Origin, parts: _Parts) -> None:
        name = stmt.name.name
        if name not in vocab.ALGORITHMS:
            self.collector.add(messages.unknown_name(
                codes.UNKNOWN_ALGORITHM, "algorithm", name, vocab.ALGORITHMS,
                Origin(stmt.name.span, origin.trail)))
            return
        targets = [self._target(t, origin) for t in stmt.targets]
        axes = self._axes(stmt.axes, origin, f"algorithm {name}")
        known = vocab.ALGORITHM_OPTIONS[name]
        for option in stmt.options:
            where = Origin(option.span, origin.trail)
            if option.key.name in known:
                continue
            if known:
                self.collector.add(unknown_option(f"algorithm {name}", option.key.name, known,
                                                  where))
            else:
                self.collector.add(messages.at(
                    codes.UNKNOWN_OPTION,
                    f"unknown option '{option.key.name}': algorithm {name} takes no options",
                    where, help=f"remove '{option.key.name}=...'; the algorithm's local "
                    "program is fixed (docs/semantics.md §7)"))
        options = self._free_options(tuple(o for o in stmt.options if o.key.name in known),
                                     origin)
        kept = []
        for key, value in options:
            allowed = vocab.ALGORITHM_OPTION_VALUES.get((name, key))
            if allowed is not None and value not in allowed:
                where = next(Origin(o.span, origin.trail) for o in stmt.options
                             if o.key.name == key)
                self._invalid_value(key, " or ".join(allowed), where)
                continue
            kept.append((key, value))
        parts.algorithms.append(Algorithm(name, tuple(t for t in targets if t), axes,
                                          tuple(kept), origin))

    def _free_options(self, options: tuple[ast.Option, ...], origin: Origin):
        result = []
        for option in options:
            value = self.evaluator.option(option.value, Origin(option.span, origin.trail))
            if value is not None:
                result.append((option.key.name, value))
        return tuple(result)

    # ------------------------------------------------------------ optimizer

    def _optimizer(self, statement: type = ast.OptimizerDecl) -> Optimizer | None:
        """The plan's ``optimizer`` or (``statement=SpecOptimizerDecl``) the spec's recipe."""
        stmt, origin = self._header(statement)
        if stmt is None:
            return None
        kind = stmt.kind.name
        if kind not in vocab.OPTIMIZER_HYPER:
            self.collector.add(messages.unknown_name(
                codes.UNKNOWN_OPTIMIZER, "optimizer", kind, tuple(vocab.OPTIMIZER_HYPER),
                Origin(stmt.kind.span, origin.trail)))
            return None
        clip = None
        if statement is ast.SpecOptimizerDecl:
            clip = self._spec_clip(stmt, origin)
            stmt = replace(stmt, options=tuple(o for o in stmt.options
                                               if o.key.name != vocab.SPEC_CLIP))
        hyper = self._hyper(stmt, kind, origin)
        shard_axes = getattr(stmt, "shard_axes", ())
        shard = self._axes(shard_axes, origin, f"optimizer {kind} shard") if shard_axes else ()
        return Optimizer(kind, hyper, shard, origin, clip)

    def _overrides(self, optimizer: Optimizer | None) -> tuple[RankOverride, ...]:
        """``on AXIS=K, ...: optimizer ...`` (docs/semantics.md §6.4): coordinates of mesh axes
        in range, the plan-wide optimizer's kind, no ``shard``, no rank matched twice."""
        out: list[RankOverride] = []
        for leaf in self.leaves:
            stmt, origin = leaf.stmt, leaf.origin
            if not isinstance(stmt, ast.OnStmt) or stmt.targets:
                continue  # parameter groups: ``_param_groups``
            body = stmt.body
            if isinstance(body, ast.SpecOptimizerDecl):
                self._override_error(
                    "the reference step runs on one device: `spec-optimizer` has no per-rank "
                    "override", origin, "name parameters, not mesh coordinates, for a group "
                    "of the reference recipe: `on norm.weight: spec-optimizer ...`")
                continue
            coords = self._override_coords(stmt, origin)
            refined = self._refine(body, optimizer, origin, _OVERRIDE)
            if coords is None or refined is None or optimizer is None:
                continue
            hyper, stated = refined
            new = RankOverride(coords, Optimizer(body.kind.name, hyper, optimizer.shard_axes,
                                                 origin), origin, stated)
            clash = next((o for o in out if _overlap(o.coords, coords)), None)
            if clash is not None:
                self.collector.add(messages.conflict(
                    codes.RANK_OVERRIDE, "two overrides hold on the same ranks", clash.origin,
                    origin, [], "give each rank at most one override"))
                continue
            out.append(new)
        return tuple(out)

    def _param_groups(self, optimizer: Optimizer | None, statement: type
                      ) -> tuple[ParamGroup, ...]:
        """``on TARGET, ...: optimizer ...`` (``statement``: ``OptimizerDecl``) or ``...:
        spec-optimizer ...`` (docs/semantics.md §6.5): parameter groups refining the
        plan-wide statement ``optimizer`` of that kind. The binding checks that every target
        selects a parameter and no parameter is in two groups."""
        out: list[ParamGroup] = []
        for leaf in self.leaves:
            stmt, origin = leaf.stmt, leaf.origin
            if not isinstance(stmt, ast.OnStmt) or not stmt.targets or \
                    not isinstance(stmt.body, statement):
                continue
            body = stmt.body
            if stmt.coords:
                self._group_error("an `on` names mesh coordinates (a per-rank override) or "
                                  "parameters (a parameter group), not both", origin,
                                  "write the two statements apart")
                continue
            if any(o.key.name == vocab.SPEC_CLIP for o in body.options):
                self._group_error("clipping is one global norm over every gradient: a group "
                                  "cannot clip on its own", origin,
                                  "state `clip-grad-norm=` on the plan-wide `spec-optimizer`")
                continue
            refined = self._refine(body, optimizer, origin,
                                   _GROUP if statement is ast.OptimizerDecl else _SPEC_GROUP)
            targets = [self._target(t, origin) for t in stmt.targets]
            if refined is None or optimizer is None or None in targets:
                continue
            hyper, given = refined
            out.append(ParamGroup(tuple(t for t in targets if t is not None),
                                  Optimizer(body.kind.name, hyper, optimizer.shard_axes, origin),
                                  given, origin))
        return tuple(out)

    def _group_error(self, message: str, origin: Origin, help: str) -> None:
        self.collector.add(messages.at(codes.PARAM_GROUP, message, origin, help=help))

    def _refine(self, body: ast.OptimizerDecl | ast.SpecOptimizerDecl, base: Optimizer | None,
                origin: Origin, how: _Refinement
                ) -> tuple[tuple[tuple[str, OptionValue], ...],
                           tuple[tuple[str, OptionValue], ...]] | None:
        """An ``on`` statement's optimizer refining the plan-wide ``base`` (a per-rank override
        or a parameter group, ``how``): the same kind, hence the same states (SGD momentum
        neither turned on nor off), no ``shard``. Returns its hyper-parameters (the unstated
        ones ``base``'s) and the stated ones, or ``None`` after reporting what is wrong."""
        kind = body.kind.name
        if base is None:
            how.error(self, f"there is no plan-wide `{how.head}` {how.missing}", origin,
                      f"state the `{how.head}` every other {how.other} gets")
            return None
        if kind != base.kind:
            how.error(self, f"the {how.what}'s optimizer is {kind}, the plan-wide `{how.head}`'s "
                            f"is {base.kind}: {how.a_what} changes hyper-parameters, not the "
                            "optimizer and its states", Origin(body.kind.span, origin.trail),
                      f"write `{how.head} {base.kind} ...`")
            return None
        if getattr(body, "shard_axes", ()):
            how.error(self, f"{how.a_what} cannot shard the optimizer: the ZeRO blocks are the "
                            "plan-wide optimizer's", origin,
                      f"remove `shard over ...` from the {how.what}")
            return None
        if kind not in vocab.OPTIMIZER_HYPER:
            return None
        stated = self._hyper(body, kind, origin, required=())
        given = dict(stated)
        hyper = tuple((k, given.pop(k, v)) for k, v in base.hyper) + tuple(given.items())
        if kind == "sgd" and _momentum_on(hyper) != _momentum_on(base.hyper):
            how.error(self, f"the {how.what} turns SGD momentum " +
                      ("on" if _momentum_on(hyper) else "off") + ": that adds or removes the "
                      f"momentum buffer, a state of the optimizer; {how.a_what} changes "
                      "hyper-parameters, not the optimizer's states", origin,
                      f"keep momentum nonzero {how.every} or zero {how.every}")
            return None
        return hyper, stated

    def _override_coords(self, stmt: ast.OnStmt, origin: Origin
                         ) -> tuple[tuple[str, int], ...] | None:
        coords: list[tuple[str, int]] = []
        ok = True
        for c in stmt.coords:
            name, where = c.axis.name, Origin(c.span, origin.trail)
            if self.mesh is None:
                return None
            if not self.mesh.has(name):
                self.collector.add(messages.unknown_axis(
                    name, self.mesh, Origin(c.axis.span, origin.trail), "on"))
                ok = False
                continue
            if name in dict(coords):
                self.collector.add(messages.at(
                    codes.AXIS_USED_TWICE, f"mesh axis '{name}' is named twice in `on`", where,
                    help="name each mesh axis once"))
                ok = False
                continue
            value = self.evaluator.number(c.value, where)
            if value is None:
                ok = False
                continue
            size = self.mesh.size(name)
            if value.denominator != 1 or not 0 <= value < size:
                self._override_error(f"coordinate {name}={_shown(value)} is not one of the "
                                     f"axis's 0 .. {size - 1}", where,
                                     f"mesh axis {name} has {size} ranks")
                ok = False
                continue
            coords.append((name, int(value)))
        return tuple(coords) if ok else None

    def _override_error(self, message: str, origin: Origin, help: str) -> None:
        self.collector.add(messages.at(codes.RANK_OVERRIDE, message, origin, help=help))

    def _spec_clip(self, stmt: ast.SpecOptimizerDecl, origin: Origin) -> Fraction | None:
        """The reference recipe's ``clip-grad-norm=C`` (a positive number), if given."""
        option = next((o for o in stmt.options if o.key.name == vocab.SPEC_CLIP), None)
        if option is None:
            return None
        where = Origin(option.span, origin.trail)
        if isinstance(option.value, ast.Path | ast.TupleValue):
            self._invalid_value(vocab.SPEC_CLIP, "a positive number", where)
            return None
        value = self.evaluator.number(option.value, where)
        if value is not None and (value <= 0 or value > FLOAT64_MAX):
            self._invalid_value(vocab.SPEC_CLIP, "a positive number a float64 holds", where)
            return None
        return value

    def _hyper(self, stmt: ast.OptimizerDecl | ast.SpecOptimizerDecl, kind: str,
               origin: Origin, required: tuple[str, ...] = vocab.REQUIRED_HYPER):
        allowed = vocab.OPTIMIZER_HYPER[kind]
        hyper: list[tuple[str, OptionValue]] = []
        for option in stmt.options:
            key, sub = option.key.name, Origin(option.span, origin.trail)
            if key not in allowed:
                self.collector.add(messages.unknown_name(
                    codes.UNKNOWN_HYPERPARAMETER, f"hyper-parameter of {kind}", key, allowed,
                    sub))
                continue
            value = self._hyper_value(option, sub)
            if value is not None:
                hyper.append((key, value))
        given = {o.key.name for o in stmt.options}
        for key in required:
            if key not in given:
                self.collector.add(messages.at(
                    codes.MISSING_HYPERPARAMETER, f"optimizer {kind} needs '{key}='", origin,
                    help=f"state the learning rate, e.g. '{key}=3e-4'"))
        return tuple(hyper)

    def _hyper_value(self, option: ast.Option, origin: Origin) -> OptionValue | None:
        key, node = option.key.name, option.value
        if key == "betas":
            items = node.items if isinstance(node, ast.TupleValue) else ()
            if len(items) != 2 or any(isinstance(i, ast.Path | ast.TupleValue) for i in items):
                self._invalid_value(key, "a pair of numbers like (0.9, 0.95)", origin)
                return None
            values = tuple(self.evaluator.number(i, origin) for i in items)
            if None in values:
                return None
            if not all(0 <= v < 1 for v in values if v is not None):
                shown = f"({', '.join(str(v) for v in values)})"
                self._out_of_range(key, "two numbers in [0, 1) like (0.9, 0.95)", shown, origin)
                return None
            return values
        if isinstance(node, ast.Path | ast.TupleValue):
            self._invalid_value(key, "a number", origin)
            return None
        value = self.evaluator.number(node, origin)
        if value is not None and value < 0:
            self._out_of_range(key, "a number of at least 0", _shown(value), origin)
            return None
        if value is not None and value > FLOAT64_MAX:  # the step computes in float64
            self._out_of_range(key, "a number a float64 holds (at most 1.8e308)",
                               _shown(value), origin)
            return None
        return value

    def _loss_reduction(self) -> LossReduction | None:
        """``loss-reduction MODE [over AXES] [scale=X]``: ``over`` only with ``token-mean``,
        ``scale`` (a positive number) required with ``sum`` and only there."""
        stmt, origin = self._header(ast.LossReductionDecl)
        if stmt is None:
            return None
        assert isinstance(stmt, ast.LossReductionDecl) and origin is not None
        mode = stmt.mode.name
        if mode not in vocab.LOSS_REDUCTIONS:
            self.collector.add(messages.at(
                codes.INVALID_OPTION_VALUE, f"unknown loss reduction '{mode}'",
                Origin(stmt.mode.span, origin.trail),
                help=f"write one of {', '.join(vocab.LOSS_REDUCTIONS)}"))
            return None
        for option in stmt.options:
            if option.key.name not in vocab.LOSS_REDUCTION_OPTIONS or mode != "sum":
                self.collector.add(unknown_option(f"loss-reduction {mode}", option.key.name,
                                                  vocab.LOSS_REDUCTION_OPTIONS if mode == "sum"
                                                  else (), Origin(option.span, origin.trail)))
        if stmt.axes and mode != "token-mean":
            self._invalid_value("over", "no axes: only token-mean sums token counts over "
                                "axes", origin)
            return None
        scale = None
        if mode == "sum":
            given = next((o for o in stmt.options if o.key.name == "scale"), None)
            if given is None:
                self._invalid_value("scale", "a positive number (the factor of the summed "
                                    "loss, e.g. 1/tokens)", origin)
                return None
            scale = self.evaluator.number(given.value, origin)
            if scale is None:
                return None
            if scale <= 0 or scale > FLOAT64_MAX:
                self._invalid_value("scale", "a positive number a float64 holds", origin)
                return None
        axes = self._axes(stmt.axes, origin, "loss-reduction") if stmt.axes else ()
        return LossReduction(mode, origin, tuple(axes), scale)

    def _clip(self) -> ClipGradNorm | None:
        stmt, origin = self._header(ast.ClipGradNormDecl)
        if stmt is None:
            return None
        value = self.evaluator.number(stmt.max_norm, origin)
        for option in stmt.options:
            if option.key.name not in vocab.CLIP_OPTIONS:
                self.collector.add(unknown_option("clip-grad-norm", option.key.name,
                                                  vocab.CLIP_OPTIONS,
                                                  Origin(option.span, origin.trail)))
        if value is None:
            return None
        if value <= 0 or value > FLOAT64_MAX:
            self._invalid_value("clip-grad-norm", "a positive number a float64 holds", origin)
            return None
        options = self._free_options(
            tuple(o for o in stmt.options if o.key.name in vocab.CLIP_OPTIONS), origin)
        for key, given in options:  # a bad value is reported; the statement still clips
            where = next(Origin(o.span, origin.trail) for o in stmt.options
                         if o.key.name == key)
            if key == "norm-type" and given != 2:
                self._invalid_value("norm-type", "2 (the L2 norm, the only one lowered)", where)
            if key == "replicas" and given not in vocab.CLIP_REPLICAS:
                self._invalid_value("replicas", " or ".join(vocab.CLIP_REPLICAS), where)
        options = tuple((k, v) for k, v in options
                        if k != "replicas" or v in vocab.CLIP_REPLICAS)
        axes = self._axes(stmt.axes, origin, "clip-grad-norm") if stmt.axes else ()
        return ClipGradNorm(value, options, origin, axes)


#: the largest finite float64: hyper-parameters are float64 numbers in the training step
FLOAT64_MAX = Fraction(sys.float_info.max)


def _shown(value: Fraction) -> str:
    """A number for a message, never thousands of digits (``1e1000`` is exact here)."""
    text = str(value)
    if len(text) <= 24:
        return text
    if abs(value) <= FLOAT64_MAX:
        return f"{float(value):.6g}"
    digits = len(str(abs(value.numerator))) - len(str(value.denominator))
    return f"about 1e{digits}"


def _options_of(stmt: ast.Statement) -> tuple[ast.Option, ...]:
    """The ``key=value`` options of a statement (the settings of ``spec``)."""
    match stmt:
        case ast.SpecDecl():
            return stmt.settings
        case (ast.PartialStmt() | ast.CollectiveStmt() | ast.OptimizerDecl()
              | ast.SpecOptimizerDecl() | ast.LossReductionDecl()
              | ast.ClipGradNormDecl() | ast.AlgorithmStmt()):
            return stmt.options
        case ast.OnStmt():
            return stmt.body.options
    return ()


@dataclass(frozen=True)
class _Refinement:
    """How an ``on`` statement refines the plan-wide optimizer, for its messages."""

    what: str
    a_what: str
    head: str
    missing: str
    other: str
    every: str
    error: Callable[[Builder, str, Origin, str], None]


_OVERRIDE = _Refinement("override", "an override", "optimizer", "to override", "rank",
                        "on every rank", Builder._override_error)
_GROUP = _Refinement("group", "a group", "optimizer", "for the group to refine", "parameter",
                     "in every group", Builder._group_error)
_SPEC_GROUP = replace(_GROUP, head="spec-optimizer")


def _momentum_on(hyper: tuple[tuple[str, OptionValue], ...]) -> bool:
    """Whether SGD with ``hyper`` keeps a momentum buffer (torch: ``momentum != 0``)."""
    value = dict(hyper).get("momentum", 0)
    return value is not None and value != 0


def _overlap(a: tuple[tuple[str, int], ...], b: tuple[tuple[str, int], ...]) -> bool:
    """Some rank matches both coordinate sets (they agree on every axis both name)."""
    first = dict(a)
    return all(first.get(axis, k) == k for axis, k in b)


def _int(value: OptionValue | None) -> int | None:
    return int(value) if isinstance(value, Fraction) else None
