"""Whole-plan semantic checks (no torch, no spec): input divisibility and pipeline stages.

Each check first *detects* (a small finding value), then a builder turns findings into
diagnostics. A module list is any path the plan indexes (``blocks[0:2]``, ``blocks.3.lin``):
no name is special. Its length is known here only from the layer count of the spec line or
of ``stdlib/models/configs.json`` (read as JSON, the model is never imported), and only when
the plan indexes one list; the binding (``lower/bind.py``) runs the same pipeline checks
again with every list's real length (``pipeline_list_problems``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from trainverify_dsl.plan import messages, vocab
from trainverify_dsl.plan.model import (
    PIPELINE_AXIS,
    ZIGZAG,
    Collective,
    GlobSeg,
    IndexSeg,
    Layout,
    Mesh,
    NameSeg,
    Origin,
    PatternSegment,
    PipelineStage,
    Plan,
    Replicate,
    Shard,
    SliceSeg,
    TensorPattern,
)
from trainverify_dsl.plan.overlap import find_overlap_conflicts
from trainverify_dsl.plan.recipe import recipe_problems
from trainverify_dsl.report import codes_plan as codes
from trainverify_dsl.report.diagnostics import Collector, Diagnostic, Severity

CONFIGS_JSON = Path("stdlib") / "models" / "configs.json"
#: Without a known layer count, layer checks enumerate up to the largest bound written;
#: beyond this many layers they are skipped (a typo like ``layers[0:10**9]`` must not hang).
MAX_ASSUMED_LAYERS = 100_000


def check_plan(plan: Plan, collector: Collector, project_root: Path,
               parse_errors: bool = False) -> None:
    """``parse_errors``: the main file has statements the parser could not read."""
    if plan.mesh is None:
        return
    for finding in find_input_problems(plan):
        collector.add(finding.diagnostic(plan.mesh))
    for overlap in find_overlap_conflicts(plan.layouts):
        collector.add(overlap.diagnostic(plan.mesh))
    n_layers = layer_count(plan, project_root, collector)
    lists = indexed_lists(plan)
    # the layer count is one list's length: the list, when the plan indexes only one
    counted = lists[0] if n_layers is not None and len(lists) == 1 else None
    lengths = {path: n_layers if path == counted else None for path in lists}
    for diagnostic in check_pipeline(plan, plan.mesh, lengths):
        collector.add(diagnostic)
    if counted is not None and n_layers is not None:
        collector.extend(find_layers_out_of_range(plan, counted, n_layers))
    # a statement the parser could not read may be the optimizer: "no optimizer" would be
    # a second, wrong report of the syntax error
    unread = parse_errors or any(d.code.id.startswith("TVP1") and d.severity is Severity.ERROR
                                 for d in collector.items)
    collector.extend(recipe_problems(plan, unread_statements=unread))
    collector.extend(find_pipeline_axis_misuse(plan))
    collector.extend(find_gradient_statement_kinds(plan))
    collector.extend(find_sync_timing_problems(plan))


# ---------------------------------------------------------------- statements with no meaning

#: Gradient statements the lowering runs (docs/semantics.md §4.5).
GRADIENT_KINDS = ("all-reduce", "reduce-scatter")


def find_pipeline_axis_misuse(plan: Plan) -> list[Diagnostic]:
    """A ``Shard``/``Partial`` placement on ``pp`` (TVP236) or a group over ``pp`` (TVP246):
    statements the lowering could only drop, so they are rejected here."""
    found = []
    for layout in plan.layouts:
        placement = layout.placement(PIPELINE_AXIS)
        if isinstance(placement, Replicate) or not layout.origins:
            continue
        what = "splits" if isinstance(placement, Shard) else "declares partial"
        found.append(messages.at(
            codes.PIPELINE_AXIS_LAYOUT,
            f"'{layout.target}' {what} over the pipeline axis 'pp'", layout.origins[-1],
            notes=["a tensor of a pipeline stage exists only on that stage's ranks: 'pp' "
                   "places modules, it does not cut tensors (docs/semantics.md §5)"],
            help="split over a data or tensor axis, and assign modules to stages with "
                 "`pipeline-stage`"))
    groups = [(f"{c.kind} {c.target}", c.axes, c.origin) for c in plan.collectives
              if not is_embedding_group_sum(c)]
    groups += [(f"algorithm {a.name}", a.axes, a.origin) for a in plan.algorithms]
    if plan.optimizer is not None:
        groups.append(("optimizer ... shard", plan.optimizer.shard_axes, plan.optimizer.origin))
    for what, axes, origin in groups:
        if PIPELINE_AXIS in axes:
            found.append(messages.at(
                codes.PIPELINE_AXIS_GROUP,
                f"`{what}` groups ranks over the pipeline axis 'pp'", origin,
                notes=["a tensor, a parameter and its gradient exist on one pipeline stage "
                       "only; the other members of a 'pp' group hold nothing to combine "
                       "(docs/semantics.md §5)"],
                help="leave 'pp' out of the group: stages exchange values by the implied "
                     "transfers or `send`, gradients and ZeRO shards go over the data axes"))
    return found


def is_embedding_group_sum(collective: Collective) -> bool:
    """``all-reduce grad(P) over pp``: the one group over the pipeline axis with a meaning,
    the sum of a tied parameter's gradient over the stages holding a copy of it (Megatron's
    embedding group, docs/semantics.md §5.4). Which parameters are tied only the spec knows:
    the lowering rejects the statement for a parameter held on one stage (TVP246)."""
    return (collective.kind == "all-reduce" and collective.target.grad
            and tuple(collective.axes) == (PIPELINE_AXIS,))


def sync_time(collective: Collective, microbatches: int) -> str | int:
    """When a gradient statement runs (§4.5): ``"last"``, ``"each"``, or the number ``k`` of
    the microbatch after which it runs (``k == microbatches`` is ``"last"``)."""
    after = dict(collective.options).get("after", "last")
    if isinstance(after, Fraction):
        return "last" if after >= microbatches else int(after)
    return str(after)


def find_sync_timing_problems(plan: Plan) -> list[Diagnostic]:
    """``after=`` on gradient statements (§4.5): a microbatch that exists; a linear reduction
    where contributions are reduced separately (``max`` of a sum is not the sum of maxes); a
    reduce-scatter that leaves no contribution behind (a later one would have no block to
    join)."""
    found = []
    grads = [c for c in plan.collectives if c.target.grad and c.kind in GRADIENT_KINDS]
    timed = [c for c in grads if sync_time(c, plan.microbatches) != "last"]
    for c in grads:
        after = dict(c.options).get("after")
        if isinstance(after, Fraction) and after > plan.microbatches:
            found.append(messages.at(
                codes.INVALID_OPTION_VALUE,
                f"'after={after}' names microbatch {after} of {plan.microbatches}", c.origin,
                help="name a microbatch from 1 to the microbatch count, or 'last'"))
        elif isinstance(sync_time(c, plan.microbatches), int) and c.kind == "reduce-scatter":
            found.append(messages.at(
                codes.INVALID_OPTION_VALUE,
                f"a reduce-scatter after microbatch {after} leaves later microbatches' "
                "gradients with no block to join", c.origin,
                notes=["after a reduce-scatter each rank holds its block of the gradient; "
                       "the contributions of later microbatches are whole local gradients"],
                help="use 'after=each' (every contribution reduce-scattered) or 'after=last'"))
    if timed:
        for c in grads:
            if c.op in ("max", "min"):
                found.append(messages.at(
                    codes.INVALID_OPTION_VALUE,
                    f"op={c.op} on gradients reduced microbatch by microbatch", c.origin,
                    notes=[f"`{timed[0].kind} {timed[0].target}` runs before the last "
                           "microbatch, so contributions are reduced separately; the "
                           f"{c.op} of sums is not the sum of {c.op}es"],
                    help="use op=sum or op=avg"))
    return found


def find_gradient_statement_kinds(plan: Plan) -> list[Diagnostic]:
    """Gradient statements other than all-reduce / reduce-scatter, or with a ``backward``
    (TVP256): they have no meaning after the backward, so they are rejected, never dropped."""
    found = []
    for c in plan.collectives:
        if not c.target.grad:
            continue
        if c.kind not in GRADIENT_KINDS:
            found.append(messages.at(
                codes.GRADIENT_STATEMENT_KIND,
                f"`{c.kind}` is not a gradient synchronisation: a statement on "
                f"'{c.target}' must be `all-reduce` or `reduce-scatter`", c.origin,
                notes=[_GRADIENT_KIND_NOTES.get(c.kind, "")],
                help=f"write `all-reduce {c.target} over {', '.join(c.axes)}` (or "
                     "`reduce-scatter ... dim=0` with `optimizer ... shard over`)"))
        elif c.backward_stated:
            found.append(messages.at(
                codes.GRADIENT_STATEMENT_KIND,
                f"a gradient statement has no backward: `backward {c.backward}` on "
                f"'{c.target}' would be ignored", c.origin,
                notes=["gradient statements run after the backward (docs/semantics.md §4.5)"],
                help="remove the `backward` option"))
    return found


_GRADIENT_KIND_NOTES = {
    "copy": "`copy` is the identity forward; a gradient has no backward, so it would do "
            "nothing",
    "all-gather": "gradients are reduced, not gathered; under `optimizer ... shard over` the "
                  "updated parameters are gathered by the optimizer step itself",
    "scatter": "under `optimizer ... shard over` each rank already takes its block of an "
               "all-reduced gradient",
    "all-to-all": "an all-to-all hands each rank the gradient blocks of other ranks' slices",
}


# ---------------------------------------------------------------- layer indices


def _targets(plan: Plan) -> list[tuple[TensorPattern, Origin]]:
    """Every tensor pattern a statement names, with the statement's origin."""
    found = [(layout.target, origin) for layout in plan.layouts for origin in layout.origins]
    found += [(m, stage.origin) for stage in plan.stages for m in stage.members]
    found += [(c.target, c.origin) for c in plan.collectives]
    found += [(s.target, s.origin) for s in plan.sends]
    found += [(t, a.origin) for a in plan.algorithms for t in a.targets]
    return found


def _beyond(segment: PatternSegment, n_layers: int) -> bool:
    """An index past the end, or a slice whose explicit bound reaches past it."""
    if isinstance(segment, IndexSeg):
        return not -n_layers <= segment.index < n_layers
    if isinstance(segment, SliceSeg):
        bounds = [b for b in (segment.start, segment.stop) if b is not None]
        # bool(range), not len(range): the layer count may exceed a C ssize_t.
        return any(not -n_layers <= b <= n_layers for b in bounds) or not segment.indices(
            n_layers)
    return False


def find_layers_out_of_range(plan: Plan, layer_list: str, n_layers: int) -> list[Diagnostic]:
    """TVP268: targets indexing the list ``layer_list`` (of ``n_layers``) past its end."""
    found, seen = [], set()
    for target, origin in _targets(plan):
        segments = target.segments
        n = _list_prefix(target)
        if n is None or _path_text(segments[:n]) != layer_list:
            continue
        if not _beyond(segments[n], n_layers) or (str(target), origin.span) in seen:
            continue
        seen.add((str(target), origin.span))
        first = segments[n]
        where = ("before the first one (a negative index counts from the end)"
                 if isinstance(first, IndexSeg) and first.index < 0 else "beyond the last one")
        found.append(messages.at(
            codes.LAYER_OUT_OF_RANGE, f"'{target}' names layers {where}", origin,
            notes=[f"the model has {n_layers} layers ({layer_list}[0:{n_layers}])"],
            help="check the spec's config, or use layer indices below the layer count"))
    return found


def _path_text(segments: Sequence[PatternSegment]) -> str:
    return ".".join(seg.name if isinstance(seg, NameSeg) else str(seg.index)
                    for seg in segments if isinstance(seg, NameSeg | IndexSeg))


def _list_prefix(target: TensorPattern) -> int | None:
    """How many leading names a target has before its first index or slice (``blocks`` of
    ``blocks[0:2]``, ``blocks.3.lin``): the module list it names by position, or ``None``."""
    for position, seg in enumerate(target.segments):
        if isinstance(seg, IndexSeg | SliceSeg):
            return position or None
        if not isinstance(seg, NameSeg):
            return None
    return None


def indexed_lists(plan: Plan) -> tuple[str, ...]:
    """The module lists the plan names by position, the ones its pipeline stages name first:
    a path followed by an index or a slice is a list, whatever its name (the model is not
    read here; ``lower/bind.py`` knows every list of the model)."""
    targets = [m for stage in plan.stages for m in stage.members]
    targets += [target for target, _ in _targets(plan)]
    found: dict[str, None] = {}
    for target in targets:
        n = _list_prefix(target)
        if n is not None:
            found.setdefault(_path_text(target.segments[:n]))
    return tuple(found)


# ---------------------------------------------------------------- inputs (tokens, labels)


@dataclass(frozen=True, slots=True)
class NotDivisible:
    layout: Layout
    dim: int
    size: int
    axes: tuple[tuple[str, int], ...]
    microbatches: int | None
    #: the dimension is split in zigzag order: two chunks per block (semantics §2.6)
    zigzag: bool = False

    def diagnostic(self, mesh: Mesh) -> Diagnostic:
        divisor = 2 if self.zigzag else 1
        for _, n in self.axes:
            divisor *= n
        divisor *= self.microbatches or 1
        origin = self.layout.origins[-1]
        return messages.at(
            codes.SPLIT_NOT_DIVISIBLE,
            f"layout of '{self.layout.target}' does not divide evenly over {mesh.describe()}",
            origin,
            notes=[messages.not_divisible_note(self.dim, self.size, self.axes,
                                               self.microbatches, self.zigzag)],
            help=f"make dimension {self.dim} a multiple of {divisor}, or split it over "
                 f"fewer devices" + self._microbatch_help(divisor))

    def _microbatch_help(self, divisor: int) -> str:
        """When the rest divides: the ``microbatches`` count is what does not."""
        if not self.microbatches or self.microbatches == 1:
            return ""
        rest = divisor // self.microbatches
        if self.size % rest:
            return ""
        return f"; each of the {rest} blocks has {self.size // rest} rows, which " \
            f"`microbatches {self.microbatches}` does not divide: state a microbatch count " \
            f"that divides {self.size // rest}"


@dataclass(frozen=True, slots=True)
class RankMismatch:
    layout: Layout
    dim: int
    names: tuple[str, ...]

    def diagnostic(self, mesh: Mesh) -> Diagnostic:
        return messages.at(
            codes.LAYOUT_RANK_MISMATCH,
            f"layout of '{self.layout.target}' names dimension {self.dim}, but it has "
            f"{len(self.names)} dimensions",
            self.layout.origins[-1],
            notes=[f"'{self.layout.target}' has dimensions [{', '.join(self.names)}]"],
            help="give one entry per tensor dimension")


@dataclass(frozen=True, slots=True)
class BatchOrder:
    """A model input's batch dimension split in zigzag order (semantics §2.6)."""
    layout: Layout

    def diagnostic(self, mesh: Mesh) -> Diagnostic:
        return messages.at(
            codes.BLOCK_ORDER,
            f"'{self.layout.target}' splits its batch dimension (dimension 0) in zigzag order",
            self.layout.origins[-1],
            notes=["zigzag balances positions of a sequence; the batch is cut into "
                   "microbatches and blocks of rows in plain order (Rule 4.1)"],
            help="split the sequence dimension in zigzag order: "
                 f"'split {self.layout.target} [dp, zigzag(cp)]'")


def find_input_problems(plan: Plan) -> list[NotDivisible | RankMismatch | BatchOrder]:
    assert plan.mesh is not None
    findings: list[NotDivisible | RankMismatch | BatchOrder] = []
    sizes = {"batch": plan.spec.batch, "seq": plan.spec.seq} if plan.spec else {}
    for layout in plan.layouts:
        name = layout.target.head
        if layout.target.grad or len(layout.target.segments) != 1 or name not in vocab.INPUT_DIMS:
            continue
        dim_names = vocab.INPUT_DIMS[name]
        stated = max([layout.ndim or 0] + [dim + 1 for dim, _ in layout.dim_axes])
        if stated > len(dim_names):
            findings.append(RankMismatch(layout, stated - 1, dim_names))
        for dim, axes in layout.dim_axes:
            if dim >= len(dim_names):
                continue
            size = sizes.get(dim_names[dim])
            microbatches = plan.microbatches if dim == 0 and plan.microbatches > 1 else None
            sized = tuple((a, plan.mesh.size(a)) for a in axes)
            zigzag = layout.order_of_dim(dim) == ZIGZAG
            if zigzag and dim == 0:
                findings.append(BatchOrder(layout))
                continue
            divisor = plan.mesh.group_size(axes) * (microbatches or 1) * (2 if zigzag else 1)
            if size is not None and size % divisor != 0:
                findings.append(NotDivisible(layout, dim, size, sized, microbatches, zigzag))
    return findings


# ---------------------------------------------------------------- layer count


def layer_count(plan: Plan, project_root: Path, collector: Collector) -> int | None:
    """The layer count of a stdlib model: an ``n_layers`` setting on the spec line (it
    overrides the config, as for every model keyword), else ``n_layers`` of its config; else
    ``None`` (a user model, whose ``n_layers`` argument may mean anything: its lists are
    checked at their real lengths once it is built; an unknown config)."""
    spec = plan.spec
    if spec is None or not spec.model.startswith("stdlib/"):
        return None
    stated = dict(spec.settings).get("n_layers")
    if isinstance(stated, Fraction) and stated.denominator == 1 and stated >= 0:
        return int(stated)
    if isinstance(stated, int) and not isinstance(stated, bool) and stated >= 0:
        return stated
    if spec.config is None:
        return None
    configs = _read_configs(project_root / CONFIGS_JSON)
    if configs is None:
        return None
    entry = configs.get(spec.config)
    if not isinstance(entry, dict):
        model_file = Path(spec.model.split(":")[0]).name
        same_file = [k for k, v in configs.items()
                     if isinstance(v, dict) and Path(str(v.get("file", ""))).name == model_file]
        collector.add(messages.unknown_name(
            codes.UNKNOWN_MODEL_CONFIG, f"config of {spec.model}", spec.config,
            sorted(same_file or configs), spec.origin))
        return None
    n_layers = entry.get("n_layers")
    return n_layers if isinstance(n_layers, int) and n_layers >= 0 else None


def _read_configs(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ---------------------------------------------------------------- pipeline


def check_pipeline(plan: Plan, mesh: Mesh, lengths: Mapping[str, int | None]
                   ) -> list[Diagnostic]:
    """``lengths``: the module lists stages may select from, each with its length or
    ``None`` (unknown here: the selections' largest bound stands in for it)."""
    interleaved = plan.schedule == INTERLEAVED
    if not plan.stages and not plan.sends:
        return [_no_virtual_stages(plan, "the plan has no pipeline stages")] if interleaved \
            else []
    if not mesh.has("pp"):
        first = plan.stages[0].origin if plan.stages else plan.sends[0].origin
        return [messages.at(
            codes.PIPELINE_WITHOUT_PP, "pipeline stages need a 'pp' mesh axis", first,
            notes=[f"the mesh is {mesh.describe()}"],
            help="add a pp axis to the mesh, e.g. 'mesh pp=2, ...'")]
    pp = mesh.size("pp")
    found = _range_problems(plan, pp)
    stages = [s for s in plan.stages if 0 <= s.index < pp]
    found += _duplicate_indices(stages) + _gaps(stages, pp) + _member_overlaps(stages, lengths)
    found += _layer_problems(stages, lengths, interleaved)
    if interleaved and not found:
        found += _virtual_problems(plan, stages, lengths, pp)
    return found


def pipeline_list_problems(plan: Plan, lengths: Mapping[str, int]) -> list[Diagnostic]:
    """The stages' module-list checks (TVP242 overlaps, stage order, TVP245 coverage,
    TVP247 virtual stages) again, with every list's real length: for the binding, which
    knows the model, where the plan-level checks knew a length only from a layer count."""
    if plan.mesh is None or not plan.mesh.has(PIPELINE_AXIS) or not plan.stages:
        return []
    pp = plan.mesh.size(PIPELINE_AXIS)
    stages = [s for s in plan.stages if 0 <= s.index < pp]
    interleaved = plan.schedule == INTERLEAVED
    found = _layer_problems(stages, lengths, interleaved)
    if interleaved and not found:
        found += _virtual_problems(plan, stages, lengths, pp)
    return found


# ---------------------------------------------------------------- virtual stages

#: The schedule whose pipeline stages hold several layer chunks (virtual stages).
INTERLEAVED = "interleaved-1f1b"


def layer_chunks(stages: Sequence[PipelineStage], lengths: Mapping[str, int]
                 ) -> dict[int, list[tuple[str, range]]]:
    """Each stage's elements of the module lists ``lengths`` as maximal runs of consecutive
    elements of one list, in list order (the order of ``lengths``) then element order: its
    chunks (one per stage for a plain pipeline, several for virtual stages)."""
    paths = list(lengths)
    owned: dict[int, set[tuple[int, int]]] = {}
    for sel in _selections(list(stages), lengths):
        position = paths.index(sel.list)
        owned.setdefault(sel.stage.index, set()).update(
            (position, layer) for layer in sel.layers(lengths[sel.list]))
    chunks: dict[int, list[tuple[str, range]]] = {}
    for index, layers in owned.items():
        runs: list[list[int]] = []
        for position, layer in sorted(layers):
            if runs and (position, layer) == (runs[-1][0], runs[-1][2]):
                runs[-1][2] = layer + 1
            else:
                runs.append([position, layer, layer + 1])
        chunks[index] = [(paths[position], range(a, b)) for position, a, b in runs]
    return chunks


def _no_virtual_stages(plan: Plan, why: str) -> Diagnostic:
    assert plan.mesh is not None
    origin = plan.header_origin("microbatches") or Origin(plan.mesh.span)
    return messages.at(
        codes.VIRTUAL_STAGES, "schedule interleaved-1f1b without virtual stages", origin,
        notes=[why, "interleaved 1F1B runs several layer chunks per pp rank (virtual "
               "pipeline stages); with one chunk per rank it is plain 1F1B"],
        help="list two or more layer ranges per pipeline-stage, round-robin "
             "(pp=2: stage 0 layers[0:1], layers[2:3]; stage 1 layers[1:2], layers[3:4]), "
             "or use 'schedule 1f1b'")


def _virtual_problems(plan: Plan, stages: list[PipelineStage],
                      lengths: Mapping[str, int | None], pp: int) -> list[Diagnostic]:
    """Megatron's conditions on interleaved 1F1B (docs/semantics.md §5.3)."""
    known = _known_lengths(stages, lengths)
    if known is None:
        return []
    chunks = layer_chunks(stages, known)
    counts = {s.index: len(chunks.get(s.index, [])) for s in stages}
    if max(counts.values(), default=0) < 2:
        return [_no_virtual_stages(plan, "every pipeline stage holds one run of consecutive "
                                   "layers")]
    found = []
    v = max(counts.values())
    by_index = {s.index: s for s in stages}
    for stage in stages:
        if counts[stage.index] != v:
            found.append(messages.at(
                codes.VIRTUAL_STAGES,
                f"pipeline stage {stage.index} holds {counts[stage.index]} layer chunk(s), "
                f"another holds {v}", stage.origin,
                notes=["with interleaved-1f1b every pp rank holds the same number of "
                       "chunks (virtual pipeline stages)"],
                help="give every pipeline-stage the same number of layer ranges"))
    if found:
        return found
    paths = list(known)
    ordered = sorted((paths.index(path), run.start, index, c) for index, runs in chunks.items()
                     for c, (path, run) in enumerate(runs))
    for position, (_, start, index, c) in enumerate(ordered):
        if (index, c) != (position % pp, position // pp):
            want = position % pp
            found.append(messages.at(
                codes.VIRTUAL_STAGES,
                f"layer {start} starts virtual stage {position}, which belongs to pp rank "
                f"{want}, but pipeline stage {index} holds it", by_index[index].origin,
                notes=["chunk c of pp rank r is virtual stage c*pp + r: the layer chunks "
                       "go round-robin over the pp ranks in layer order"],
                help=f"move the chunk starting at layer {start} to pipeline-stage {want}"))
            break
    if plan.microbatches % pp:
        origin = plan.header_origin("microbatches") or stages[0].origin
        found.append(messages.at(
            codes.VIRTUAL_STAGES,
            f"interleaved-1f1b needs microbatches divisible by pp ({plan.microbatches} "
            f"microbatches, pp={pp})", origin,
            notes=["Megatron's interleaved schedule runs microbatches in groups of pp"],
            help=f"use a multiple of {pp} microbatches"))
    for send in plan.sends:
        found.append(messages.at(
            codes.VIRTUAL_STAGES, "explicit 'send' with virtual stages", send.origin,
            notes=["with interleaved-1f1b the transfers between virtual stages are implied; "
                   "a send's stage numbers would be ambiguous (pp rank or virtual stage)"],
            help="remove the send; values move from each virtual stage to the next"))
    return found


def _range_problems(plan: Plan, pp: int) -> list[Diagnostic]:
    found = []
    checks = [(s.index, "pipeline-stage", s.origin) for s in plan.stages]
    checks += [(i, f"send {s.target}", s.origin) for s in plan.sends for i in (s.source, s.dest)]
    for index, construct, origin in checks:
        if not 0 <= index < pp:
            found.append(messages.at(
                codes.STAGE_OUT_OF_RANGE, f"{construct} names stage {index}, but pp has size {pp}",
                origin, notes=[f"valid stages: 0 .. {pp - 1}"],
                help="number pipeline stages 0 .. pp-1"))
    return found


def _duplicate_indices(stages: list[PipelineStage]) -> list[Diagnostic]:
    first: dict[int, PipelineStage] = {}
    found = []
    for stage in stages:
        if stage.index in first:
            found.append(messages.conflict(
                codes.STAGE_OVERLAP, f"pipeline stage {stage.index} is declared twice",
                first[stage.index].origin, stage.origin, [],
                "list all members of a stage in one statement"))
        first.setdefault(stage.index, stage)
    return found


#: Runs of missing pp ranks named in a message before the rest is summarised.
MAX_LISTED_RUNS = 8


def _gaps(stages: list[PipelineStage], pp: int) -> list[Diagnostic]:
    declared = sorted({s.index for s in stages})
    missing = _missing_runs(declared, pp)
    if not declared or not missing:
        return []
    last = max(stages, key=lambda s: s.index)
    return [messages.at(
        codes.STAGE_GAP, f"pp rank(s) {_describe_runs(missing)} have no pipeline stage",
        last.origin,
        notes=[f"mesh axis 'pp' has size {pp}; stages declared: "
               f"{', '.join(map(str, declared))}"],
        help="declare one pipeline-stage per pp rank, numbered 0 .. pp-1")]


def _missing_runs(declared: list[int], size: int) -> list[tuple[int, int]]:
    """The runs ``(first, last)`` of ``0 .. size-1`` not in ``declared`` (sorted, in range),
    computed from the gaps: ``size`` may be far too large to enumerate."""
    runs, expected = [], 0
    for index in [*declared, size]:
        if index > expected:
            runs.append((expected, index - 1))
        expected = index + 1
    return runs


def _describe_runs(runs: list[tuple[int, int]]) -> str:
    """``1, 3 .. 7`` (at most ``MAX_LISTED_RUNS`` runs, then how many ranks are left)."""
    parts = [str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a} .. {b}"
             for a, b in runs[:MAX_LISTED_RUNS]]
    rest = sum(b - a + 1 for a, b in runs[MAX_LISTED_RUNS:])
    return ", ".join(parts) + (f" and {rest} more" if rest else "")


def _member_overlaps(stages: list[PipelineStage], lists: Mapping[str, object]
                     ) -> list[Diagnostic]:
    """Members other than list selections (``embed``, ``norm``, ``layers.3.attention``)
    claimed twice."""
    owners: list[tuple[TensorPattern, PipelineStage]] = []
    found = []
    for stage in stages:
        for member in stage.members:
            if _layer_selection(member, lists) is not None:
                continue
            for other, owner in owners:
                if owner.index != stage.index and _nested(member, other):
                    found.append(messages.conflict(
                        codes.STAGE_OVERLAP,
                        f"'{member}' is in pipeline stage {stage.index} and '{other}' in "
                        f"stage {owner.index}", owner.origin, stage.origin, [],
                        "assign every module to exactly one stage"))
            owners.append((member, stage))
    return found


def _nested(a: TensorPattern, b: TensorPattern) -> bool:
    """Whether one concrete module path contains (or equals) the other."""
    if not (a.is_concrete and b.is_concrete):
        return str(a) == str(b)
    short, long = sorted((a.segments, b.segments), key=len)
    return long[: len(short)] == short


# ---------------------------------------------------------------- layer ranges


@dataclass(frozen=True, slots=True)
class _Selection:
    """A stage's selection of a module list: all its elements, an index, or a slice."""

    stage: PipelineStage
    member: TensorPattern
    list: str
    kind: str  # "all" | "index" | "slice"
    index: int = 0
    slice: SliceSeg | None = None

    def layers(self, length: int) -> range:
        if self.kind == "all":
            return range(length)
        if self.kind == "index":
            return range(self.index, self.index + 1)
        assert self.slice is not None
        return self.slice.indices(length)


def _layer_selection(member: TensorPattern, lists: Mapping[str, object]
                     ) -> tuple[str, str, int, SliceSeg | None] | None:
    """``(list, kind, index, slice)`` when ``member`` selects whole elements of one of the
    module lists ``lists`` (``blocks``, ``blocks.*``, ``blocks[3]``, ``blocks[0:8]``)."""
    segs = member.segments
    if member.grad or not segs:
        return None
    for cut in (len(segs) - 1, len(segs)):
        prefix = segs[:cut]
        if not prefix or not all(isinstance(seg, NameSeg | IndexSeg) for seg in prefix) or \
                _path_text(prefix) not in lists:
            continue
        path = _path_text(prefix)
        seg = segs[cut] if cut < len(segs) else None
        if seg is None or isinstance(seg, GlobSeg) and seg.pattern == "*":
            return (path, "all", 0, None)
        if isinstance(seg, IndexSeg):
            return (path, "index", seg.index, None)
        if isinstance(seg, SliceSeg):
            return (path, "slice", 0, seg)
    return None


def is_layer_selection(member: TensorPattern, lists: Mapping[str, object]) -> bool:
    """``blocks``, ``blocks.*``, ``blocks[3]``, ``blocks[0:8]`` for a module list ``blocks``
    of ``lists``: a selection of whole elements."""
    return _layer_selection(member, lists) is not None


def _selections(stages: list[PipelineStage], lists: Mapping[str, object]) -> list[_Selection]:
    result = []
    for stage in stages:
        for member in stage.members:
            found = _layer_selection(member, lists)
            if found is not None:
                result.append(_Selection(stage, member, *found))
    return result


def _assumed_length(selections: list[_Selection]) -> int | None:
    """Without a layer count: one past the largest explicit bound; ``None`` when a negative
    bound makes the selection unknowable."""
    bounds = [0]
    for sel in selections:
        if sel.kind == "index":
            bounds.append(sel.index + 1)
        elif sel.slice is not None:
            parts = (sel.slice.start, sel.slice.stop)
            if any(p is not None and p < 0 for p in parts) or (sel.slice.step or 1) < 0:
                return None
            bounds += [p + 1 for p in parts if p is not None]
    return max(bounds) if max(bounds) <= MAX_ASSUMED_LAYERS else None


def _known_lengths(stages: list[PipelineStage], lengths: Mapping[str, int | None]
                   ) -> dict[str, int] | None:
    """Every list's length, assumed from its selections where unknown; ``None`` when one
    cannot be assumed or is too long to enumerate."""
    selections = _selections(stages, lengths)
    known: dict[str, int] = {}
    for path, n in lengths.items():
        length = n if n is not None else _assumed_length(
            [s for s in selections if s.list == path])
        if length is None or length > MAX_ASSUMED_LAYERS:
            return None
        known[path] = length
    return known


def _layer_problems(stages: list[PipelineStage], lengths: Mapping[str, int | None],
                    interleaved: bool) -> list[Diagnostic]:
    selections = _selections(stages, lengths)
    found = []
    for path, n in lengths.items():
        mine = [s for s in selections if s.list == path]
        if mine:
            found += _list_problems(stages, path, mine, n, interleaved)
    return found


def _list_problems(stages: list[PipelineStage], path: str, selections: list[_Selection],
                   n_layers: int | None, interleaved: bool) -> list[Diagnostic]:
    """Overlaps, order and coverage of the selections of one module list ``path``."""
    length = n_layers if n_layers is not None else _assumed_length(selections)
    # Layers are enumerated below; a count beyond the bound (a typo, an absurd n_layers) skips
    # the checks rather than hang (and lengths past sys.maxsize would not even have a len()).
    if length is None or length > MAX_ASSUMED_LAYERS or \
            sum(len(s.layers(length)) for s in selections) > MAX_ASSUMED_LAYERS:
        return []
    owner: dict[int, _Selection] = {}
    found = []
    for sel in selections:
        for layer in sel.layers(length):
            earlier = owner.setdefault(layer, sel)
            if earlier is not sel and earlier.stage.index != sel.stage.index:
                found.append(_layer_overlap(layer, earlier, sel))
                break
    found += _parts_of_owned_layers(stages, path, owner)
    if not interleaved and not found:
        found += _order(selections, length)
    if n_layers is not None:
        found += _coverage(stages, path, selections, set(owner), n_layers)
    return found


def _parts_of_owned_layers(stages: list[PipelineStage], path: str,
                           owner: dict[int, _Selection]) -> list[Diagnostic]:
    """``blocks.3.attention`` in one stage while another stage holds all of block 3."""
    found = []
    for stage in stages:
        for member in stage.members:
            segs = member.segments
            n = _list_prefix(member)
            if n is None or _path_text(segs[:n]) != path or len(segs) < n + 2 or \
                    not isinstance(segs[n], IndexSeg):
                continue
            holder = owner.get(segs[n].index)
            if holder is not None and holder.stage.index != stage.index:
                found.append(messages.conflict(
                    codes.STAGE_OVERLAP,
                    f"'{member}' is in pipeline stage {stage.index}, but stage "
                    f"{holder.stage.index} holds all of '{holder.member}'",
                    holder.stage.origin, stage.origin, [],
                    "assign every module to exactly one stage"))
    return found


def _layer_overlap(layer: int, earlier: _Selection, later: _Selection) -> Diagnostic:
    return messages.conflict(
        codes.STAGE_OVERLAP,
        f"layer {layer} is in pipeline stage {earlier.stage.index} ('{earlier.member}') and "
        f"stage {later.stage.index} ('{later.member}')",
        earlier.stage.origin, later.stage.origin, [],
        "give each stage a disjoint range of layers")


def _order(selections: list[_Selection], length: int) -> list[Diagnostic]:
    spans: dict[int, tuple[int, int, PipelineStage]] = {}
    for sel in selections:
        layers = sel.layers(length)
        if not layers:
            continue
        low, high = min(layers[0], layers[-1]), max(layers[0], layers[-1])
        old = spans.get(sel.stage.index)
        spans[sel.stage.index] = (low, high, sel.stage) if old is None else (
            min(old[0], low), max(old[1], high), old[2])
    found = []
    ordered = sorted(spans.items())
    pairs = zip(ordered, ordered[1:], strict=False)
    for (index_a, (_, high_a, _)), (index_b, (low_b, _, stage_b)) in pairs:
        if low_b <= high_a:
            found.append(messages.at(
                codes.STAGE_ORDER,
                f"pipeline stage {index_b} starts at layer {low_b}, before the end of stage "
                f"{index_a} (layer {high_a})", stage_b.origin,
                notes=["stages must hold consecutive layer ranges in increasing order"],
                help="assign layers to stages in order: stage k+1 starts where stage k ends"))
    return found


def _coverage(stages: list[PipelineStage], path: str, selections: list[_Selection],
              owned: set[int], n_layers: int) -> list[Diagnostic]:
    """TVP245: elements of the list ``path`` on no stage (an element inside a member that
    is not a selection of this list, a list nested in a stage's module, is on its stage)."""
    depth = path.count(".") + 2  # the segments of an element, ``blocks.3``
    around = [m for stage in stages for m in stage.members
              if len(m.segments) <= depth and _layer_selection(m, {path: None}) is None]
    missing = [i for i in range(n_layers) if i not in owned
               and not any(m.matches(f"{path}.{i}", prefix=True) for m in around)]
    if not missing:
        return []
    last = max((s.stage for s in selections), key=lambda s: s.index)
    return [messages.at(
        codes.STAGE_COVERAGE,
        f"pipeline stages leave {len(missing)} of {n_layers} layers unassigned",
        last.origin, notes=[f"unassigned layers: {_ranges(missing, path)}"],
        help="every layer must belong to exactly one pipeline stage")]


def _ranges(indices: list[int], path: str) -> str:
    """``[0, 1, 2, 5]`` -> ``blocks[0:3], blocks[5]`` (indices sorted, non-empty)."""
    runs: list[list[int]] = [[indices[0], indices[0]]]
    for index in indices[1:]:
        if index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ", ".join(f"{path}[{a}]" if a == b else f"{path}[{a}:{b + 1}]" for a, b in runs)
