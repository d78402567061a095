"""The resolved plan: flat, exact, free of templates, loops and imports (no torch, no AST).

A ``Plan`` is what ``plan.resolve`` makes of a ``.tvp`` file and everything it uses. Every
item keeps an ``Origin``: the span of the statement that produced it and the expansion trail
(``use``/``for``/``apply`` sites, outermost first), so diagnostics can say "in template
column_parallel, applied at plans/x.tvp:12:5". Numbers are exact ``Fraction``s.
``plan_to_dict`` gives a JSON-able form with stable keys for auto-parallel tools.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from fractions import Fraction
from math import prod

from trainverify_dsl.ir.collectives import COLLECTIVES, STATEMENTS
from trainverify_dsl.report.span import Span

#: The pipeline axis (docs/semantics.md Rule 1.2), the only axis name with a meaning: it
#: places modules on stages (`pipeline-stage N` puts modules on its rank N), it never splits a
#: tensor or forms a group.
PIPELINE_AXIS = "pp"
#: Block orders of a split dimension (docs/semantics.md §2.6): plain blocks, or the
#: load-balanced order of context parallelism (chunks k and 2N-1-k of 2N on block k).
CONTIGUOUS = "contiguous"
ZIGZAG = "zigzag"

# ---------------------------------------------------------------- origins


@dataclass(frozen=True, slots=True)
class ExpansionSite:
    """One step of an expansion trail: ``kind`` is ``use``, ``for`` or ``apply``; ``name`` the
    fragment path, loop variable or template name."""

    kind: str
    name: str
    span: Span

    def describe(self) -> str:
        if self.kind == "apply":
            return f"in template {self.name}, applied at {self.span}"
        if self.kind == "for":
            return f"in loop 'for {self.name}' at {self.span}"
        return f"in {self.name}, used at {self.span}"


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a flat item came from: its statement's span plus the expansion trail."""

    span: Span
    trail: tuple[ExpansionSite, ...] = ()

    @property
    def report_span(self) -> Span:
        """Where to report a problem: the outermost ``apply`` site (the line the user wrote)
        when the statement comes from a template, else the statement itself."""
        for site in self.trail:
            if site.kind == "apply":
                return site.span
        return self.span

    def notes(self) -> tuple[str, ...]:
        """Trail notes, innermost first, naming the template statement when relocated."""
        notes = [site.describe() for site in reversed(self.trail) if site.kind != "for"]
        if self.report_span != self.span:
            notes.insert(0, f"the statement is at {self.span}")
        return tuple(notes)


# ---------------------------------------------------------------- tensor patterns


@dataclass(frozen=True, slots=True)
class NameSeg:
    name: str


@dataclass(frozen=True, slots=True)
class IndexSeg:
    index: int


@dataclass(frozen=True, slots=True)
class SliceSeg:
    """A range of a module list, Python slice semantics; ``None`` = omitted."""

    start: int | None
    stop: int | None
    step: int | None

    def indices(self, length: int) -> range:
        """The selected indices of a list of ``length`` (empty for a zero step)."""
        if self.step == 0:
            return range(0)
        return range(*slice(self.start, self.stop, self.step).indices(length))

    def contains(self, index: int, length: int | None = None) -> bool | None:
        """Whether ``index`` is selected; ``None`` when unknowable without the list length."""
        if length is not None:
            return index in self.indices(length)
        if any(bound is not None and bound < 0 for bound in (self.start, self.stop)):
            return None
        step = 1 if self.step is None else self.step
        if step <= 0:
            return None if step < 0 else False
        start = self.start or 0
        stop_ok = self.stop is None or index < self.stop
        return start <= index and stop_ok and (index - start) % step == 0


@dataclass(frozen=True, slots=True)
class GlobSeg:
    """Shell wildcards within one segment: ``*`` and ``?``."""

    pattern: str


PatternSegment = NameSeg | IndexSeg | SliceSeg | GlobSeg

_GRAD_RE = re.compile(r"^grad\((.*)\)$")


def _segment_text(seg: PatternSegment) -> str:
    match seg:
        case NameSeg(name):
            return name
        case IndexSeg(index):
            return str(index)
        case GlobSeg(pattern):
            return pattern
        case SliceSeg(start, stop, step):
            text = f"{'' if start is None else start}:{'' if stop is None else stop}"
            return text + ("" if step is None else f":{step}")
    raise AssertionError(seg)


def _pattern_text(segments: tuple[PatternSegment, ...]) -> str:
    """``layers.3.wq``, ``layers[0:8]``, ``layers[-1]``: names, globs and indices joined by
    dots, slices and negative indices in brackets."""
    words = []
    for seg in segments:  # the common case first: names and indices, joined by dots
        if isinstance(seg, NameSeg) and seg.name:
            words.append(seg.name)
        elif isinstance(seg, IndexSeg) and seg.index >= 0:
            words.append(str(seg.index))
        else:
            return _bracketed_text(segments)
    return ".".join(words)


def _bracketed_text(segments: tuple[PatternSegment, ...]) -> str:
    """``_pattern_text`` in general."""
    pieces: list[str] = []
    started = False  # whether the text so far is not empty
    for seg in segments:
        if isinstance(seg, SliceSeg) or (isinstance(seg, IndexSeg) and seg.index < 0):
            piece = f"[{_segment_text(seg)}]"
        else:
            part = (seg.name if isinstance(seg, NameSeg) else str(seg.index)
                    if isinstance(seg, IndexSeg) else _segment_text(seg))
            piece = "." + part if started else part
        pieces.append(piece)
        started = started or bool(piece)
    return "".join(pieces)


def _segment_matches(seg: PatternSegment, part: str) -> bool:
    match seg:
        case NameSeg(name):
            return part == name
        case IndexSeg(index):
            return part == str(index)
        case GlobSeg(pattern):
            return fnmatchcase(part, pattern)
        case SliceSeg():
            return part.isdigit() and seg.contains(int(part)) is True
    raise AssertionError(seg)


@dataclass(frozen=True, slots=True)
class TensorPattern:
    """A resolved target: ``layers.*.attention.wq.weight``, ``layers[0:8]``, ``grad(params)``.

    ``params`` stands for every parameter; ``matches`` treats it as matching any concrete
    path, and the callers ask it of parameters only (``is_params``).
    """

    segments: tuple[PatternSegment, ...]
    grad: bool = False
    #: The canonical text, computed once (patterns are keys and message parts everywhere).
    _text: str = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        text = _pattern_text(self.segments)
        object.__setattr__(self, "_text", f"grad({text})" if self.grad else text)

    def __str__(self) -> str:
        return self._text

    @property
    def head(self) -> str | None:
        first = self.segments[0] if self.segments else None
        return first.name if isinstance(first, NameSeg) else None

    @property
    def is_params(self) -> bool:
        """``params``: every parameter of the model, never one of its inputs."""
        return self.segments == (NameSeg("params"),)

    @property
    def is_concrete(self) -> bool:
        return all(isinstance(seg, NameSeg | IndexSeg) for seg in self.segments)

    def matches(self, path: str, *, prefix: bool = False) -> bool:
        """Whether the concrete torch path (``layers.3.attention.wq.weight``, or
        ``grad(...)`` of one) is selected. ``prefix=True`` also accepts paths inside a
        selected module (``layers[0:8]`` contains ``layers.3.attention.wq.weight``)."""
        grad_match = _GRAD_RE.match(path)
        if bool(grad_match) != self.grad:
            return False
        parts = (grad_match.group(1) if grad_match else path).split(".")
        if self.segments == (NameSeg("params"),):
            # every path: the callers ask it of parameters only (the lowering keeps model
            # inputs and module boundaries out of `params`, ``is_params``); a name means
            # nothing here (a parameter called `out` or `in` is a parameter)
            return True
        if len(parts) < len(self.segments) or (not prefix and len(parts) != len(self.segments)):
            return False
        pairs = zip(self.segments, parts, strict=False)
        return all(_segment_matches(seg, part) for seg, part in pairs)


def parse_pattern(text: str) -> TensorPattern:
    """The pattern for a canonical string (inverse of ``str``), for tests and tools.
    Accepts ``grad(...)``, dotted names, indices, globs and ``[a:b:c]`` slices."""
    grad_match = _GRAD_RE.match(text)
    body = grad_match.group(1) if grad_match else text
    segments: list[PatternSegment] = []
    for token in re.findall(r"\[[^\]]*\]|[^.\[\]]+", body):
        if token.startswith("["):
            inner = token[1:-1]
            if ":" not in inner:
                segments.append(IndexSeg(int(inner)))
                continue
            bounds = [int(b) if b.strip() else None for b in inner.split(":")] + [None]
            segments.append(SliceSeg(bounds[0], bounds[1], bounds[2]))
        elif token.isdigit():
            segments.append(IndexSeg(int(token)))
        elif "*" in token or "?" in token:
            segments.append(GlobSeg(token))
        else:
            segments.append(NameSeg(token))
    return TensorPattern(tuple(segments), grad=bool(grad_match))


# ---------------------------------------------------------------- mesh


@dataclass(frozen=True, slots=True)
class MeshAxis:
    name: str
    size: int
    span: Span


@dataclass(frozen=True, slots=True)
class Mesh:
    """Named axes, outermost first; ranks are row-major (the last axis varies fastest)."""

    axes: tuple[MeshAxis, ...]
    span: Span
    #: name -> size, derived from ``axes`` (lookups are hot in large plans).
    _sizes: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_sizes", {axis.name: axis.size for axis in self.axes})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._sizes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(axis.size for axis in self.axes)

    @property
    def total_devices(self) -> int:
        return prod(self.shape)

    def has(self, name: str) -> bool:
        return name in self._sizes

    def size(self, name: str) -> int:
        if name not in self._sizes:
            raise KeyError(f"mesh has no axis {name!r} (axes: {', '.join(self.names)})")
        return self._sizes[name]

    def group_size(self, names: tuple[str, ...] | list[str]) -> int:
        """Number of ranks in a group that differ only along ``names``."""
        return prod(self.size(name) for name in set(names))

    def coords(self, rank: int) -> dict[str, int]:
        if not 0 <= rank < self.total_devices:
            raise ValueError(f"rank {rank} outside mesh of {self.total_devices} devices")
        coords: dict[str, int] = {}
        for axis in reversed(self.axes):
            rank, coords[axis.name] = divmod(rank, axis.size)
        return {name: coords[name] for name in self.names}

    def rank(self, coords: dict[str, int]) -> int:
        rank = 0
        for axis in self.axes:
            index = coords.get(axis.name, 0)
            if not 0 <= index < axis.size:
                raise ValueError(f"coordinate {axis.name}={index} outside 0..{axis.size - 1}")
            rank = rank * axis.size + index
        return rank

    def describe(self) -> str:
        """``Mesh(pp=4, dp=4, tp=8)``, the context line of layout diagnostics."""
        return "Mesh(" + ", ".join(f"{a.name}={a.size}" for a in self.axes) + ")"


# ---------------------------------------------------------------- layouts


@dataclass(frozen=True, slots=True)
class Shard:
    dim: int

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True, slots=True)
class Replicate:
    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True, slots=True)
class Partial:
    op: str = "sum"

    def __str__(self) -> str:
        return f"P({self.op})"


PlacementKind = Shard | Replicate | Partial


@dataclass(frozen=True, slots=True)
class Layout:
    """The layout of one target pattern: one placement per mesh axis (mesh order) and, per
    split dimension, its axes in block order (first outermost). ``origins`` are the
    statements that set it, in program order."""

    target: TensorPattern
    placements: tuple[tuple[str, PlacementKind], ...]
    dim_axes: tuple[tuple[int, tuple[str, ...]], ...]
    origins: tuple[Origin, ...]
    #: Number of tensor dimensions a ``split`` stated (its entry count), if any did.
    ndim: int | None = None
    #: The axes some statement placed explicitly (the others default to ``Replicate``).
    stated_axes: tuple[str, ...] = ()
    #: Split dimensions whose blocks are not in plain order: ``(dim, "zigzag")``
    #: (``split T [dp, zigzag(cp)]``, docs/semantics.md §2.6); the others are contiguous.
    orders: tuple[tuple[int, str], ...] = ()

    def placement(self, axis: str) -> PlacementKind:
        for name, placement in self.placements:
            if name == axis:
                return placement
        return Replicate()

    def axes_of_dim(self, dim: int) -> tuple[str, ...]:
        return dict(self.dim_axes).get(dim, ())

    def order_of_dim(self, dim: int) -> str:
        return dict(self.orders).get(dim, CONTIGUOUS)

    @property
    def partial_axes(self) -> tuple[str, ...]:
        return tuple(n for n, p in self.placements if isinstance(p, Partial))


# ---------------------------------------------------------------- statements

#: An option value: an exact number, a word, a path string, or a tuple of those.
OptionValue = Fraction | str | tuple


@dataclass(frozen=True, slots=True)
class SpecRef:
    model: str
    config: str | None
    batch: int | None
    seq: int | None
    settings: tuple[tuple[str, OptionValue], ...]
    origin: Origin


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective in program order. ``backward`` is the effective backward (the stated one
    or the Megatron default); ``backward_stated`` says which."""

    kind: str
    target: TensorPattern
    axes: tuple[str, ...]
    op: str | None
    dim: int | None
    split_dim: int | None
    concat_dim: int | None
    backward: str
    backward_stated: bool
    options: tuple[tuple[str, OptionValue], ...]
    origin: Origin


#: Each collective's default backward (docs/semantics.md §3.2, §3.5), from the one table.
DEFAULT_BACKWARD: dict[str, str] = {k: COLLECTIVES[k].default_backward for k in STATEMENTS}


@dataclass(frozen=True, slots=True)
class Send:
    target: TensorPattern
    source: int
    dest: int
    origin: Origin


@dataclass(frozen=True, slots=True)
class PipelineStage:
    index: int
    members: tuple[TensorPattern, ...]
    origin: Origin


@dataclass(frozen=True, slots=True)
class Optimizer:
    """``kind`` is ``sgd``, ``adam`` or ``adamw``; ``hyper`` maps names to exact values
    (``betas`` a tuple); non-empty ``shard_axes`` means ZeRO-1."""

    kind: str
    hyper: tuple[tuple[str, OptionValue], ...]
    shard_axes: tuple[str, ...]
    origin: Origin
    #: the reference recipe's gradient clipping (``spec-optimizer ... clip-grad-norm=C``):
    #: ``torch.nn.utils.clip_grad_norm_(params, C)`` before the step; ``None``: no clipping
    clip: Fraction | None = None

    def get(self, name: str) -> OptionValue | None:
        return dict(self.hyper).get(name)


@dataclass(frozen=True, slots=True)
class ClipGradNorm:
    """``clip-grad-norm`` (docs/semantics.md §6.3): the norm group's axes (empty: every mesh
    axis) and whether copies replicated over a group axis count once (``replicas=once``, the
    default) or each (``replicas=each``)."""

    max_norm: Fraction
    options: tuple[tuple[str, OptionValue], ...]
    origin: Origin
    axes: tuple[str, ...] = ()

    @property
    def replicas(self) -> str:
        return str(dict(self.options).get("replicas", "once"))


@dataclass(frozen=True, slots=True)
class RankOverride:
    """``on AXIS=K, ...: optimizer ...`` (docs/semantics.md §6.4): on the ranks whose mesh
    coordinates are ``coords`` the optimizer step is ``optimizer`` (the plan-wide one's kind
    and sharding, other hyper-parameters)."""

    coords: tuple[tuple[str, int], ...]
    optimizer: Optimizer
    origin: Origin
    #: the hyper-parameters the statement states (the rest come from the optimizer, or from
    #: the parameter's group, §6.5)
    given: tuple[tuple[str, OptionValue], ...] = ()

    def matches(self, coords: Mapping[str, int]) -> bool:
        return all(coords.get(axis) == k for axis, k in self.coords)


@dataclass(frozen=True, slots=True)
class ParamGroup:
    """``on TARGET, ...: optimizer ...`` or ``spec-optimizer ...`` (docs/semantics.md §6.5):
    a torch.optim parameter group. The parameters the targets select are updated with
    ``optimizer``: the plan-wide statement's kind and sharding, the hyper-parameters ``given``
    here, the plan-wide statement's for the rest."""

    targets: tuple[TensorPattern, ...]
    optimizer: Optimizer
    given: tuple[tuple[str, OptionValue], ...]
    origin: Origin

    def matches(self, param: str) -> bool:
        """Whether the parameter (its torch path) is in the group; a module target selects
        every parameter inside it."""
        return any(t.matches(param, prefix=True) for t in self.targets)


def group_of(groups: tuple[ParamGroup, ...], param: str) -> ParamGroup | None:
    """The group of ``param`` (the binding refuses a parameter in two), or ``None``: the
    plan-wide statement's."""
    return next((g for g in groups if g.matches(param)), None)


@dataclass(frozen=True, slots=True)
class LossReduction:
    """``loss-reduction`` (docs/semantics.md §4.3): ``mode`` one of ``vocab.LOSS_REDUCTIONS``;
    ``axes`` the data axes whose token counts a ``token-mean`` sums (empty: every data axis);
    ``scale`` the factor of a ``sum``."""

    mode: str
    origin: Origin
    axes: tuple[str, ...] = ()
    scale: Fraction | None = None


@dataclass(frozen=True, slots=True)
class Algorithm:
    name: str
    targets: tuple[TensorPattern, ...]
    axes: tuple[str, ...]
    options: tuple[tuple[str, OptionValue], ...]
    origin: Origin


@dataclass(frozen=True, slots=True)
class Plan:
    name: str | None
    file: str
    spec: SpecRef | None
    mesh: Mesh | None
    microbatches: int
    schedule: str | None
    loss_scale: Fraction
    layouts: tuple[Layout, ...]
    collectives: tuple[Collective, ...]
    sends: tuple[Send, ...]
    stages: tuple[PipelineStage, ...]
    optimizer: Optimizer | None
    clip_grad_norm: ClipGradNorm | None
    algorithms: tuple[Algorithm, ...]
    #: Every file read, main file first, then ``use``d files in inclusion order.
    files: tuple[str, ...] = ()
    #: The reference step's optimizer (``spec-optimizer``): what ``optimizer`` implements.
    spec_optimizer: Optimizer | None = None
    #: Where the step-wide headers stand: ``("microbatches" | "loss-scale", origin)``.
    header_origins: tuple[tuple[str, Origin], ...] = ()
    #: ``loss-reduction`` (``None``: ``local-mean``, each rank's own token count)
    loss_reduction: LossReduction | None = None
    #: ``on AXIS=K: optimizer ...``: per-rank optimizer overrides, in statement order
    overrides: tuple[RankOverride, ...] = ()
    #: ``on TARGET, ...: optimizer ...``: the plan's parameter groups (§6.5)
    param_groups: tuple[ParamGroup, ...] = ()
    #: ``on TARGET, ...: spec-optimizer ...``: the reference recipe's parameter groups
    spec_param_groups: tuple[ParamGroup, ...] = ()

    def header_origin(self, name: str) -> Origin | None:
        return next((origin for key, origin in self.header_origins if key == name), None)

    def layout_of(self, target: str) -> Layout | None:
        """The layout declared for exactly this pattern (canonical string), if any."""
        for layout in self.layouts:
            if str(layout.target) == target:
                return layout
        return None

    def stage_of(self, path: str) -> int | None:
        """The pipeline stage whose members contain the concrete module/parameter path."""
        for stage in self.stages:
            if any(member.matches(path, prefix=True) for member in stage.members):
                return stage.index
        return None

    def layouts_for(self, path: str) -> tuple[Layout, ...]:
        """Every declared layout whose pattern selects the concrete path."""
        return tuple(lay for lay in self.layouts if lay.target.matches(path))


# ---------------------------------------------------------------- JSON form


def exact(value: OptionValue | int | None) -> object:
    """JSON form of an exact value: ints stay ints, other fractions become ``"1/16"``."""
    if isinstance(value, Fraction):
        return value.numerator if value.denominator == 1 else str(value)
    if isinstance(value, tuple):
        return [exact(item) for item in value]
    return value


def _origin_dict(origin: Origin) -> dict:
    site = [{"kind": s.kind, "name": s.name, "at": str(s.span)} for s in origin.trail]
    return {"at": str(origin.span), "trail": site}


def _options_dict(options: tuple[tuple[str, OptionValue], ...]) -> dict:
    return {key: exact(value) for key, value in options}


def _layout_dict(layout: Layout) -> dict:
    return {
        "target": str(layout.target),
        "placements": {axis: str(p) for axis, p in layout.placements},
        "dims": {str(dim): list(axes) for dim, axes in layout.dim_axes},
        "orders": {str(dim): order for dim, order in layout.orders},
        "ndim": layout.ndim,
        "stated_axes": list(layout.stated_axes),
        "origins": [_origin_dict(o) for o in layout.origins],
    }


def _collective_dict(c: Collective) -> dict:
    return {
        "kind": c.kind, "target": str(c.target), "axes": list(c.axes), "op": c.op,
        "dim": c.dim, "split_dim": c.split_dim, "concat_dim": c.concat_dim,
        "backward": c.backward, "backward_stated": c.backward_stated,
        "options": _options_dict(c.options), "origin": _origin_dict(c.origin),
    }


def _header_dict(plan: Plan) -> dict:
    spec = None
    if plan.spec is not None:
        spec = {"model": plan.spec.model, "config": plan.spec.config, "batch": plan.spec.batch,
                "seq": plan.spec.seq, "settings": _options_dict(plan.spec.settings)}
    mesh = None
    if plan.mesh is not None:
        mesh = [{"name": a.name, "size": a.size} for a in plan.mesh.axes]
    return {"name": plan.name, "file": plan.file, "files": list(plan.files), "spec": spec,
            "mesh": mesh, "microbatches": plan.microbatches, "schedule": plan.schedule,
            "loss_scale": exact(plan.loss_scale)}


def plan_to_dict(plan: Plan) -> dict:
    """A JSON-able dict with stable keys; exact numbers as ints or ``"p/q"`` strings."""
    data = _header_dict(plan)
    data["layouts"] = [_layout_dict(layout) for layout in plan.layouts]
    data["collectives"] = [_collective_dict(c) for c in plan.collectives]
    data["sends"] = [{"target": str(s.target), "from": s.source, "to": s.dest,
                      "origin": _origin_dict(s.origin)} for s in plan.sends]
    data["stages"] = [{"index": s.index, "members": [str(m) for m in s.members],
                       "origin": _origin_dict(s.origin)} for s in plan.stages]
    for key, opt in (("optimizer", plan.optimizer), ("spec_optimizer", plan.spec_optimizer)):
        data[key] = None if opt is None else {
            "kind": opt.kind, "hyper": _options_dict(opt.hyper),
            "shard_axes": list(opt.shard_axes), "origin": _origin_dict(opt.origin)}
    clip = plan.clip_grad_norm
    data["clip_grad_norm"] = None if clip is None else {
        "max_norm": exact(clip.max_norm), "axes": list(clip.axes),
        "options": _options_dict(clip.options),
        "origin": _origin_dict(clip.origin)}
    data["algorithms"] = [{"name": a.name, "targets": [str(t) for t in a.targets],
                           "axes": list(a.axes), "options": _options_dict(a.options),
                           "origin": _origin_dict(a.origin)} for a in plan.algorithms]
    return data
