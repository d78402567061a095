"""The `.tvp` abstract syntax tree: frozen, slotted dataclasses, every node with its span.

The AST is exactly what the user wrote (after parsing), nothing resolved: imports are not
followed, templates not expanded, loops not unrolled, names not checked. The resolver
(``trainverify_dsl.plan``) turns a ``PlanFile`` into a flat ``Plan``. ``tvp fmt`` prints an AST
back to canonical text (``parse.format``); formatting then re-parsing yields an equal AST
(spans aside: compare with ``strip_spans``).

Conventions: children are tuples; ``span`` is the last field; ``Ident`` is used for every
name the user typed that is not a tensor path (mesh axes, template names, keywords-as-values
such as ``avg`` or ``1f1b``), so its span is known.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from fractions import Fraction
from typing import Any

from trainverify_dsl.report.span import NO_SPAN, Span

# ---------------------------------------------------------------- names, paths, targets


@dataclass(frozen=True, slots=True)
class Ident:
    """A bare word: ``tp``, ``avg``, ``1f1b``, ``vocab-parallel-cross-entropy``."""

    name: str
    span: Span


@dataclass(frozen=True, slots=True)
class Name:
    """A path segment that is a name: ``attention`` in ``layers.3.attention``."""

    name: str
    span: Span


@dataclass(frozen=True, slots=True)
class Index:
    """A path segment that is an index: ``3`` in ``layers.3`` or ``layers[3]``."""

    index: int
    span: Span


@dataclass(frozen=True, slots=True)
class Slice:
    """A path segment that selects a range of a module list: ``layers[0:8]``, ``layers[::2]``.

    Python slice semantics; ``None`` means omitted.
    """

    start: int | None
    stop: int | None
    step: int | None
    span: Span


@dataclass(frozen=True, slots=True)
class Glob:
    """A path segment with shell wildcards: ``*``, ``w*``, ``*_proj`` (``*`` and ``?``)."""

    pattern: str
    span: Span


Segment = Name | Index | Slice | Glob


@dataclass(frozen=True, slots=True)
class Path:
    """A tensor or module address following the torch module tree.

    ``layers.3.attention.wq.weight``; ``layers[0:8]``; ``layers.*.attention.wo.out``;
    ``tokens``; ``loss``; ``params`` (every parameter). ``.out``/``.in`` as the last segment
    name a module's output/input activation; the binding to the spec decides what exists.
    A one-segment path is also how a loop variable or template parameter is referenced.
    """

    segments: tuple[Segment, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class GradRef:
    """``grad(X)``: the gradient of the loss with respect to ``X`` (X may be a pattern)."""

    path: Path
    span: Span


Target = Path | GradRef

# ---------------------------------------------------------------- expressions and values


@dataclass(frozen=True, slots=True)
class Num:
    """A number literal. ``value`` is exact (``1e-4`` is ``Fraction(1, 10000)``); ``text`` is
    the literal as written, kept so ``fmt`` does not rewrite ``1e-4`` as ``1/10000``."""

    value: Fraction
    text: str
    span: Span


@dataclass(frozen=True, slots=True)
class NameRef:
    """A name used as a value: ``microbatches``, ``batch``, ``seq``, a mesh axis (its size),
    a template parameter, or a word value such as ``avg`` in ``op=avg``. A dotted path used
    as a value (template argument ``l.attention.wq``) is a ``Path`` instead."""

    name: str
    span: Span


@dataclass(frozen=True, slots=True)
class BinOp:
    """``left op right`` with op one of ``+ - * /``; evaluated exactly (Fractions)."""

    op: str
    left: Expr
    right: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class TupleValue:
    """``(0.9, 0.95)`` as an option value."""

    items: tuple[Value, ...]
    span: Span


Expr = Num | NameRef | BinOp | Neg
Value = Expr | Path | TupleValue


@dataclass(frozen=True, slots=True)
class Option:
    """``key=value``: ``op=avg``, ``dim=1``, ``lr=3e-4``, ``betas=(0.9, 0.95)``.
    Keys may contain hyphens (``split-dim``, ``weight-decay``)."""

    key: Ident
    value: Value
    span: Span


# ---------------------------------------------------------------- layouts


@dataclass(frozen=True, slots=True)
class DimEntry:
    """One entry of ``split T [...]``: the mesh axes splitting that tensor dimension, in
    order (first = outermost block). Empty tuple is ``-`` (not split). ``order`` is the block
    order word of ``zigzag(cp)`` (docs/semantics.md §2.6), ``None`` for plain blocks."""

    axes: tuple[Ident, ...]
    span: Span
    order: Ident | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """DTensor-style placement sugar: ``S(d)``/``Shard(d)``, ``R``/``Replicate()``,
    ``P(op)``/``Partial(op)``. ``axis`` is set in the named form ``place T [tp=S(0)]`` and
    ``None`` in the positional form (one placement per mesh axis, in mesh order)."""

    kind: str  # "shard" | "replicate" | "partial"
    dim: int | None
    op: Ident | None
    axis: Ident | None
    span: Span


# ---------------------------------------------------------------- statements


@dataclass(frozen=True, slots=True)
class PlanHeader:
    """``plan NAME``: only in a main plan file; a file without it is a fragment/library."""

    name: Ident
    span: Span


@dataclass(frozen=True, slots=True)
class SpecDecl:
    """``spec "stdlib/models/llama.py:Llama" config llama3_8b batch 512 seq 8192``.

    ``settings`` holds the word-value pairs after the model reference, in order
    (``config``, ``batch``, ``seq``, and any other model keyword)."""

    model: str
    model_span: Span
    settings: tuple[Option, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class MeshAxis:
    name: Ident
    size: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class MeshDecl:
    """``mesh pp=4, dp=4, tp=8``: named axes, outermost first (rank order is row-major)."""

    axes: tuple[MeshAxis, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class MicrobatchesDecl:
    """``microbatches 16 schedule 1f1b``."""

    count: Expr
    schedule: Ident | None
    span: Span


@dataclass(frozen=True, slots=True)
class LossScaleDecl:
    """``loss-scale 1/microbatches``: the seed of every local backward (default 1)."""

    value: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class LossReductionDecl:
    """``loss-reduction token-mean [over dp, cp]`` / ``loss-reduction sum scale=1/4096``: how
    every rank normalises its local loss (default ``local-mean``)."""

    mode: Ident
    options: tuple[Option, ...]
    span: Span
    axes: tuple[Ident, ...] = ()


@dataclass(frozen=True, slots=True)
class UseDecl:
    """``use "stdlib/megatron.tvp"``: include a fragment; its templates become visible."""

    path: str
    path_span: Span
    span: Span


@dataclass(frozen=True, slots=True)
class SplitStmt:
    """``split T [dp, -]`` / ``split T [(dp, cp), -, tp]``."""

    target: Target
    dims: tuple[DimEntry, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class ReplicateStmt:
    """``replicate T over dp, pp``; no axes means every mesh axis."""

    target: Target
    axes: tuple[Ident, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class PartialStmt:
    """``partial T over tp op=sum`` (op defaults to sum)."""

    target: Target
    axes: tuple[Ident, ...]
    options: tuple[Option, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class PlaceStmt:
    """``place T [S(0), R, P(sum)]`` or ``place T [tp=S(0), dp=R]`` (DTensor sugar)."""

    target: Target
    placements: tuple[Placement, ...]
    span: Span


COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "copy", "scatter")


@dataclass(frozen=True, slots=True)
class CollectiveStmt:
    """``all-reduce T over tp op=avg backward identity`` and the other collectives.

    ``kind`` is one of ``COLLECTIVE_KINDS``; ``backward`` is the stated backward meaning
    (``identity``, ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all``,
    ``scatter``), ``None`` for the Megatron default."""

    kind: str
    kind_span: Span
    target: Target
    axes: tuple[Ident, ...]
    options: tuple[Option, ...]
    backward: Ident | None
    span: Span


@dataclass(frozen=True, slots=True)
class SendStmt:
    """``send T from 0 to 1``: explicit point-to-point between pipeline stages."""

    target: Target
    source: Expr
    dest: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class PipelineStageStmt:
    """``pipeline-stage 0: embed, layers[0:8]``."""

    index: Expr
    members: tuple[Path, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class SpecOptimizerDecl:
    """``spec-optimizer adamw lr=3e-4 betas=(0.9, 0.95) weight-decay=0.1``: the reference
    step's optimizer (the single-device script's recipe), checked against ``optimizer``."""

    kind: Ident
    options: tuple[Option, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class OptimizerDecl:
    """``optimizer adamw lr=3e-4 betas=(0.9, 0.95) weight-decay=0.1 shard over dp``.

    ``shard_axes`` non-empty means ZeRO-1: optimizer states sharded over those axes."""

    kind: Ident
    options: tuple[Option, ...]
    shard_axes: tuple[Ident, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class ClipGradNormDecl:
    """``clip-grad-norm 1.0 [over tp, pp] [replicas=once]``: clip by the gradient norm summed
    over the axes (no axes: every mesh axis)."""

    max_norm: Expr
    options: tuple[Option, ...]
    span: Span
    axes: tuple[Ident, ...] = ()


@dataclass(frozen=True, slots=True)
class OnCoord:
    axis: Ident
    value: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class OnStmt:
    """``on dp=1: optimizer adamw lr=1e-3 eps=1e-6``: the statement holds on the ranks with
    those coordinates, in place of the plan-wide one (a per-rank override).
    ``on norm.weight, layers.*.ffn_norm.weight: optimizer adamw weight-decay=0`` (or
    ``spec-optimizer``): a parameter group, for the parameters the targets select."""

    coords: tuple[OnCoord, ...]
    body: OptimizerDecl | SpecOptimizerDecl
    span: Span
    targets: tuple[Path, ...] = ()


@dataclass(frozen=True, slots=True)
class AlgorithmStmt:
    """``algorithm vocab-parallel-cross-entropy for output, loss over tp``."""

    name: Ident
    targets: tuple[Target, ...]
    axes: tuple[Ident, ...]
    options: tuple[Option, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Param:
    """A template parameter, with an optional default value."""

    name: Ident
    default: Value | None
    span: Span


@dataclass(frozen=True, slots=True)
class TemplateDef:
    """``template column_parallel(m, axis=tp):`` followed by an indented block."""

    name: Ident
    params: tuple[Param, ...]
    body: tuple[Statement, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class ApplyStmt:
    """``apply column_parallel(l.attention.wq, tp)`` / ``apply sp_norm(m=l.ffn_norm)``."""

    name: Ident
    args: tuple[Value, ...]
    kwargs: tuple[Option, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class ForStmt:
    """``for l in layers:`` / ``for l in layers[0:8], layers[16:24]:`` then a block."""

    var: Ident
    iterables: tuple[Path, ...]
    body: tuple[Statement, ...]
    span: Span


Statement = (
    PlanHeader | SpecDecl | MeshDecl | MicrobatchesDecl | LossScaleDecl | LossReductionDecl
    | UseDecl
    | SplitStmt | ReplicateStmt | PartialStmt | PlaceStmt | CollectiveStmt | SendStmt
    | PipelineStageStmt | OptimizerDecl | SpecOptimizerDecl | ClipGradNormDecl | OnStmt
    | AlgorithmStmt
    | TemplateDef | ApplyStmt | ForStmt
)


@dataclass(frozen=True, slots=True)
class Comment:
    """A ``#`` comment, kept for ``fmt``. ``text`` includes the ``#``."""

    text: str
    span: Span


@dataclass(frozen=True, slots=True)
class PlanFile:
    path: str
    statements: tuple[Statement, ...]
    comments: tuple[Comment, ...]
    span: Span


# ---------------------------------------------------------------- helpers


def strip_spans(node: Any) -> Any:
    """A copy of ``node`` with every span replaced by ``NO_SPAN`` (and comments dropped),
    for comparing ASTs structurally (the ``fmt`` round trip)."""
    if isinstance(node, tuple):
        return tuple(strip_spans(item) for item in node)
    if isinstance(node, PlanFile):
        return replace(node, path="", statements=strip_spans(node.statements), comments=(),
                       span=NO_SPAN)
    if is_dataclass(node) and not isinstance(node, type):
        changes = {}
        for f in fields(node):
            value = getattr(node, f.name)
            changes[f.name] = NO_SPAN if isinstance(value, Span) else strip_spans(value)
        return replace(node, **changes)
    return node
