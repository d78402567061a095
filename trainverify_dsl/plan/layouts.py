"""Layout statements -> per-target ``Layout``s, with the per-statement and combination checks.

Each ``split``/``replicate``/``partial``/``place`` statement becomes a ``Claim`` (axis ->
placement, dim -> ordered axes). Claims about one target pattern (same canonical string) are
combined in program order; an axis given two placements is a conflict (or split-and-partial),
an identical statement is a duplicate. Patterns that merely overlap (``layers.*.w`` and
``layers.3.w``) are not compared here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainverify_dsl.parse import ast
from trainverify_dsl.parse.format import value_text
from trainverify_dsl.plan import messages, vocab
from trainverify_dsl.plan.model import (
    CONTIGUOUS,
    Layout,
    Mesh,
    Origin,
    Partial,
    PlacementKind,
    Replicate,
    Shard,
    TensorPattern,
)
from trainverify_dsl.report import codes_plan as codes
from trainverify_dsl.report.diagnostics import Collector
from trainverify_dsl.report.span import Span

LayoutStmt = ast.SplitStmt | ast.ReplicateStmt | ast.PartialStmt | ast.PlaceStmt


@dataclass(slots=True)
class Claim:
    target: TensorPattern
    placements: list[tuple[str, PlacementKind]]
    dims: dict[int, tuple[str, ...]]
    origin: Origin
    text: str
    ndim: int | None = None
    #: Where each axis name was written (for precise carets on unknown/repeated axes).
    spans: dict[int, Span] = field(default_factory=dict)
    #: dim -> block order word of a ``zigzag(cp)`` entry (docs/semantics.md §2.6)
    orders: dict[int, str] = field(default_factory=dict)


@dataclass(slots=True)
class _Combined:
    target: TensorPattern
    placements: dict[str, tuple[PlacementKind, Origin]] = field(default_factory=dict)
    dims: dict[int, tuple[tuple[str, ...], Origin]] = field(default_factory=dict)
    orders: dict[int, str] = field(default_factory=dict)
    origins: list[Origin] = field(default_factory=list)
    ndim: int | None = None
    keys: dict[object, Origin] = field(default_factory=dict)


# ---------------------------------------------------------------- statement -> claim


def claim_of(stmt: LayoutStmt, target: TensorPattern, origin: Origin, mesh: Mesh,
             collector: Collector) -> Claim:
    claim = Claim(target, [], {}, origin, _statement_text(stmt, target))
    match stmt:
        case ast.SplitStmt():
            _split(stmt, claim, collector)
        case ast.ReplicateStmt():
            axes = stmt.axes or tuple(ast.Ident(n, stmt.span) for n in mesh.names)
            claim.placements = [(a.name, Replicate()) for a in axes]
            claim.spans = {i: a.span for i, a in enumerate(stmt.axes)}
        case ast.PartialStmt():
            op = _partial_op(stmt, origin, collector)
            claim.placements = [(a.name, Partial(op)) for a in stmt.axes]
            claim.spans = {i: a.span for i, a in enumerate(stmt.axes)}
        case ast.PlaceStmt():
            _place(stmt, claim, mesh, collector)
    _check_axes(claim, mesh, collector)
    return claim


def _split(stmt: ast.SplitStmt, claim: Claim, collector: Collector) -> None:
    claim.ndim = len(stmt.dims)
    for dim, entry in enumerate(stmt.dims):
        names = tuple(axis.name for axis in entry.axes)
        for axis in entry.axes:
            claim.spans[len(claim.placements)] = axis.span
            claim.placements.append((axis.name, Shard(dim)))
        if names:
            claim.dims[dim] = names
        if entry.order is not None and entry.order.name != CONTIGUOUS:
            if entry.order.name in vocab.BLOCK_ORDERS:
                claim.orders[dim] = entry.order.name
            else:
                collector.add(messages.unknown_name(
                    codes.BLOCK_ORDER, "block order", entry.order.name, vocab.BLOCK_ORDERS,
                    Origin(entry.order.span, claim.origin.trail)))


def _partial_op(stmt: ast.PartialStmt, origin: Origin, collector: Collector) -> str:
    op = "sum"
    for option in stmt.options:
        key = option.key.name
        where = Origin(option.span, origin.trail)
        if key not in vocab.PARTIAL_OPTIONS:
            collector.add(unknown_option("partial", key, vocab.PARTIAL_OPTIONS, where))
            continue
        word = option.value.name if isinstance(option.value, ast.NameRef) else None
        if isinstance(option.value, ast.Path) and len(option.value.segments) == 1:
            word = getattr(option.value.segments[0], "name", None)
        if word not in vocab.REDUCE_OPS:
            collector.add(unknown_reduce_op(word or value_text(option.value), "partial",
                                            vocab.REDUCE_OPS, where))
            continue
        op = word
    return op


def _place(stmt: ast.PlaceStmt, claim: Claim, mesh: Mesh, collector: Collector) -> None:
    positional = [p for p in stmt.placements if p.axis is None]
    if positional and len(positional) != len(mesh.axes):
        collector.add(messages.at(
            codes.LAYOUT_RANK_MISMATCH,
            f"place lists {len(positional)} placement(s) for a mesh of {len(mesh.axes)} axes",
            claim.origin, notes=[f"mesh: {mesh.describe()}"],
            help="give one placement per mesh axis in mesh order, or name the axes "
                 "('place T [tp=S(0)]')"))
        return
    position = 0
    for placement in stmt.placements:
        if placement.axis is None:
            axis, position = mesh.names[position], position + 1
        else:
            axis = placement.axis.name
        kind = _placement_kind(placement)
        if isinstance(kind, Partial) and kind.op not in vocab.REDUCE_OPS:
            collector.add(unknown_reduce_op(kind.op, "place", vocab.REDUCE_OPS, claim.origin))
            continue
        if placement.axis is not None:
            claim.spans[len(claim.placements)] = placement.axis.span
        claim.placements.append((axis, kind))
        if isinstance(kind, Shard):
            claim.dims[kind.dim] = claim.dims.get(kind.dim, ()) + (axis,)
    # several Shard(d) on one dimension are ordered in mesh order (DTensor's), however the
    # named form writes them (docs/semantics.md §2.1); an unknown axis is reported elsewhere
    order = {name: k for k, name in enumerate(mesh.names)}
    for dim, axes in claim.dims.items():
        claim.dims[dim] = tuple(sorted(axes, key=lambda a: order.get(a, len(order))))


def _placement_kind(placement: ast.Placement) -> PlacementKind:
    if placement.kind == "shard":
        return Shard(placement.dim or 0)
    if placement.kind == "partial":
        return Partial(placement.op.name if placement.op is not None else "sum")
    return Replicate()


def _check_axes(claim: Claim, mesh: Mesh, collector: Collector) -> None:
    """Unknown axes are reported and dropped; an axis placed twice is reported once."""
    kept: list[tuple[str, PlacementKind]] = []
    seen: dict[str, PlacementKind] = {}
    for index, (axis, kind) in enumerate(claim.placements):
        if not mesh.has(axis):
            collector.add(messages.unknown_axis(axis, mesh, _axis_origin(claim, index),
                                                claim.text))
        elif axis in seen:
            collector.add(messages.at(
                codes.AXIS_USED_TWICE, f"mesh axis '{axis}' is used twice in one layout",
                _axis_origin(claim, index),
                notes=[f"{claim.text} on {mesh.describe()}",
                       f"axis '{axis}' is placed as {seen[axis]} and as {kind}"],
                help="each mesh axis may split one tensor dimension once"))
        else:
            seen[axis] = kind
            kept.append((axis, kind))
    claim.placements = kept
    claim.dims = {d: tuple(dict.fromkeys(a for a in axes if mesh.has(a)))
                  for d, axes in claim.dims.items()}
    claim.dims = {d: axes for d, axes in claim.dims.items() if axes}


def _axis_origin(claim: Claim, index: int) -> Origin:
    """Where the ``index``-th placement's axis was written (else the statement)."""
    span = claim.spans.get(index)
    return Origin(span, claim.origin.trail) if span is not None else claim.origin


def _statement_text(stmt: LayoutStmt, target: TensorPattern) -> str:
    match stmt:
        case ast.SplitStmt():
            entries = []
            for entry in stmt.dims:
                names = [a.name for a in entry.axes]
                if entry.order is not None:
                    entries.append(f"{entry.order.name}({', '.join(names)})")
                    continue
                entries.append("-" if not names else names[0] if len(names) == 1
                               else "(" + ", ".join(names) + ")")
            return f"split {target} [{', '.join(entries)}]"
        case ast.ReplicateStmt():
            return f"replicate {target}"
        case ast.PartialStmt():
            return f"partial {target}"
    return f"place {target}"


# ---------------------------------------------------------------- combination


class LayoutTable:
    """Accumulates claims per target pattern in program order."""

    def __init__(self, mesh: Mesh, collector: Collector):
        self.mesh, self.collector = mesh, collector
        self.table: dict[str, _Combined] = {}

    def add(self, claim: Claim, key: object) -> None:
        entry = self.table.setdefault(str(claim.target), _Combined(claim.target))
        if key in entry.keys:
            self.collector.add(messages.conflict(
                codes.DUPLICATE_STATEMENT, f"duplicate statement: {claim.text}",
                entry.keys[key], claim.origin, [], "remove the repeated statement"))
            return
        entry.keys[key] = claim.origin
        entry.origins.append(claim.origin)
        if claim.ndim is not None:
            entry.ndim = max(entry.ndim or 0, claim.ndim)
        self._placements(entry, claim)
        self._dims(entry, claim)

    def _placements(self, entry: _Combined, claim: Claim) -> None:
        for axis, kind in claim.placements:
            earlier = entry.placements.get(axis)
            if earlier is None:
                entry.placements[axis] = (kind, claim.origin)
            elif earlier[0] != kind:
                self.collector.add(self._conflict(claim, axis, earlier, kind))

    def _conflict(self, claim: Claim, axis: str, earlier: tuple[PlacementKind, Origin],
                  kind: PlacementKind):
        kinds = {type(earlier[0]), type(kind)}
        size = self.mesh.size(axis)
        note = (f"mesh axis '{axis}' (of size {size}) is {earlier[0]} in the first statement "
                f"but {kind} here")
        if kinds == {Shard, Partial}:
            return messages.conflict(
                codes.SPLIT_AND_PARTIAL,
                f"'{claim.target}' is both split and partial over mesh axis '{axis}'",
                earlier[1], claim.origin, [f"on {self.mesh.describe()}", note],
                "a piece is a block or a summand, not both; drop one of the statements")
        return messages.conflict(
            codes.CONFLICTING_LAYOUT, f"conflicting layouts for '{claim.target}'",
            earlier[1], claim.origin, [f"on {self.mesh.describe()}", note],
            "keep the one layout that describes where the pieces live")

    def _dims(self, entry: _Combined, claim: Claim) -> None:
        for dim, axes in claim.dims.items():
            earlier = entry.dims.get(dim)
            order = claim.orders.get(dim, CONTIGUOUS)
            if earlier is None:
                entry.dims[dim] = (axes, claim.origin)
                if order != CONTIGUOUS:
                    entry.orders[dim] = order
            elif earlier[0] == axes and entry.orders.get(dim, CONTIGUOUS) != order:
                self.collector.add(messages.conflict(
                    codes.CONFLICTING_LAYOUT, f"conflicting layouts for '{claim.target}'",
                    earlier[1], claim.origin,
                    [f"dimension {dim} is split over {_axes(axes)} in "
                     f"{entry.orders.get(dim, CONTIGUOUS)} block order in the first statement "
                     f"and in {order} order here"],
                    "split each dimension in one statement, in one block order"))
            elif earlier[0] != axes:
                order = set(earlier[0]) == set(axes)
                self.collector.add(messages.conflict(
                    codes.CONFLICTING_LAYOUT, f"conflicting layouts for '{claim.target}'",
                    earlier[1], claim.origin,
                    [f"dimension {dim} is split over {_axes(earlier[0])} in the first "
                     f"statement and over {_axes(axes)} here"
                     + (" (the same axes in another block order: another placement of the "
                        "blocks)" if order else "")],
                    "split each dimension in one statement, axes in block order"))

    def layouts(self) -> tuple[Layout, ...]:
        result = []
        for entry in self.table.values():
            placements = tuple(
                (name, entry.placements[name][0] if name in entry.placements else Replicate())
                for name in self.mesh.names)
            dims = tuple(sorted((d, axes) for d, (axes, _) in entry.dims.items()))
            stated = tuple(n for n in self.mesh.names if n in entry.placements)
            orders = tuple(sorted(entry.orders.items()))
            result.append(Layout(entry.target, placements, dims, tuple(entry.origins),
                                 entry.ndim, stated, orders))
        return tuple(result)


def _axes(axes: tuple[str, ...]) -> str:
    return ", ".join(f"'{a}'" for a in axes)


def unknown_option(construct: str, key: str, known: tuple[str, ...], origin: Origin):
    return messages.unknown_name(codes.UNKNOWN_OPTION, f"option of {construct}", key,
                                 known, origin)


def unknown_reduce_op(op: str, construct: str, known: tuple[str, ...], origin: Origin):
    return messages.unknown_name(codes.UNKNOWN_REDUCE_OP, f"reduce op of {construct}", op,
                                 known, origin)
