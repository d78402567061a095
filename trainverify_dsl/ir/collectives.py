"""The collectives' semantics, one table (docs/semantics.md §3): for each plan statement, the IR
op that evaluates it (its ``OpDef`` in ``ops.py`` holds the shape rule and the numpy
evaluation), its default backward, whether that backward sums the group's cotangents, the
backward that passes a complete cotangent on, the framework function it transcribes, and its
layout rule (what the layout pass derives and what it finds wrong).

Everything that needs a collective's meaning reads it here: the plan's default ``backward``
(``plan/build.py``), the lowering's layout pass and cotangent check (``lower/``), the kinds of
the torch custom op and the converter's IR ops (``spec/convert.py``). The torch custom op
(``lower/collectives.py``) runs the same arithmetic eagerly with torch tensors;
``tests/test_lower_collectives.py`` holds it to the IR's evaluation and to
``torch.distributed``.

Importing this module does not import numpy (``tvp lint`` stays light): the layout rules import
``ir.layout`` when they run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainverify_dsl.ir.layout import Dim, TLayout

#: What is wrong with applying a collective to a layout (each a collective mismatch, TVP406).
Problems = list[str]
#: ``rule(op, axes, dim, dim2, layout, sizes) -> (layout after, problems)``
LayoutRule = Callable[[str, tuple[str, ...], int, int, "TLayout", Mapping[str, int]],
                      tuple["TLayout", Problems]]


@dataclass(frozen=True, slots=True)
class Collective:
    #: the plan keyword (``all-reduce``)
    statement: str
    #: its kind in a lowered local program (``torch.ops.tvp.collective``'s ``kind``)
    kind: str
    #: the IR op evaluating it (an entry of ``ops.OPS``: shape rule and numpy semantics), or
    #: ``None`` for a copy, which is the value itself
    ir_op: str | None
    #: the default ``backward`` (a statement keyword, or ``identity``): Megatron's regions
    default_backward: str
    #: used as a backward, it sums the group's cotangents (so it multiplies a cotangent that is
    #: already complete on every rank by the group size: TVP406)
    sums: bool
    #: the backward to state where the cotangent arriving here is already complete (the
    #: convention of §3.3) and the framework function doing so, or ``None``
    complete_backward: tuple[str, str] | None
    #: the framework functions it transcribes (docs/semantics.md §3.5)
    counterpart: str
    #: what the layout pass derives (``None``: the layout is unchanged)
    layout: LayoutRule | None


def _reduce(kind: str) -> LayoutRule:
    def rule(op: str, axes: tuple[str, ...], dim: int, dim2: int, lay: TLayout,
             sizes: Mapping[str, int]) -> tuple[TLayout, Problems]:
        from trainverify_dsl.ir.layout import TLayout, append_axes

        problems: Problems = []
        partial_axes = set(lay.partial[1]) if lay.partial else set()
        sharded = lay.shard_axes()
        for a in axes:
            if sizes.get(a) == 1:
                continue  # one copy, one slice: the reduction is the identity
            if a in sharded:
                problems.append(f"the tensor is split over {a}: the "
                                "reduction adds pieces of different slices")
            elif a not in partial_axes and op == "sum":
                problems.append(f"the tensor is not partial over {a}: "
                                f"every copy is added, multiplying it by {sizes[a]}")
        if lay.partial and op == "avg" and lay.partial[0] == "sum" and partial_axes & set(axes):
            problems.append("op=avg divides a partial sum by the group size")
        if lay.partial and lay.partial[0] == "max" and op != "max":
            problems.append(f"op={op} of a partial max")
        left = tuple(a for a in (lay.partial[1] if lay.partial else ()) if a not in axes)
        partial = (lay.partial[0], left) if left and lay.partial else None
        dims = list(lay.dims)
        if kind == "reduce_scatter":
            dims[dim] = append_axes(dims[dim], axes)
        return TLayout(tuple(dims), partial, lay.const, lay.cause), problems
    return rule


def _all_gather(op: str, axes: tuple[str, ...], dim: int, dim2: int, lay: TLayout,
                sizes: Mapping[str, int]) -> tuple[TLayout, Problems]:
    from trainverify_dsl.ir.layout import TLayout

    problems: Problems = []
    if lay.partial and set(lay.partial[1]) & set(axes):
        problems.append("the tensor is a partial sum: all-gather "
                        "concatenates the summands instead of adding them")
    dims = list(lay.dims)
    dims[dim], problem = remove_axes(dims[dim], axes)
    if problem:
        problems.append(problem)
    return TLayout(tuple(dims), lay.partial, lay.const, lay.cause), problems


def _all_to_all(op: str, axes: tuple[str, ...], dim: int, dim2: int, lay: TLayout,
                sizes: Mapping[str, int]) -> tuple[TLayout, Problems]:
    from trainverify_dsl.ir.layout import TLayout, append_axes

    problems: Problems = []
    dims = list(lay.dims)
    dims[dim2], problem = remove_axes(dims[dim2], axes)
    if problem:
        problems.append(problem.replace("gather", "all-to-all concat"))
    dims[dim] = append_axes(dims[dim], axes)
    return TLayout(tuple(dims), lay.partial, lay.const, lay.cause), problems


def _scatter(op: str, axes: tuple[str, ...], dim: int, dim2: int, lay: TLayout,
             sizes: Mapping[str, int]) -> tuple[TLayout, Problems]:
    from trainverify_dsl.ir.layout import TLayout, append_axes

    problems: Problems = []
    if any(a in lay.shard_axes() for a in axes):
        problems.append("scatter of a tensor already split over the axis")
    dims = list(lay.dims)
    dims[dim] = append_axes(dims[dim], axes)
    return TLayout(tuple(dims), lay.partial, lay.const, lay.cause), problems


def remove_axes(dim: Dim, axes: tuple[str, ...]) -> tuple[Dim, str | None]:
    """``dim`` with ``axes`` gathered (they must be its innermost split axes, in order)."""
    from trainverify_dsl.ir.layout import Factor, normalize_dim

    factors = list(normalize_dim(dim))
    for i, f in enumerate(factors):
        if set(axes) <= set(f.axes):
            if f.axes[-len(axes):] != tuple(axes):
                return dim, (f"the dimension is split over {', '.join(f.axes)}: gathering over "
                             f"{', '.join(axes)} concatenates the blocks in the wrong order")
            factors[i] = Factor(f.size, f.axes[:-len(axes)])
            return tuple(factors), None
    return dim, f"the dimension is not split over {', '.join(axes)}: gathering repeats it"


COLLECTIVES: dict[str, Collective] = {c.statement: c for c in (
    Collective("all-reduce", "all_reduce", "all_reduce", "identity", True,
               ("identity", "as Megatron's `reduce_from_tensor_model_parallel_region`"),
               "Megatron `reduce_from_tensor_model_parallel_region`", _reduce("all_reduce")),
    Collective("all-gather", "all_gather", "all_gather", "reduce-scatter", False,
               ("scatter", "Megatron's `gather_from_tensor_model_parallel_region`, used by "
                "`ColumnParallelLinear(gather_output=True)`, splits the gradient"),
               "Megatron `gather_from_sequence_parallel_region` (the tensor-parallel "
               "`gather_from_tensor_model_parallel_region` is `backward scatter`)", _all_gather),
    Collective("reduce-scatter", "reduce_scatter", "reduce_scatter", "all-gather", True, None,
               "Megatron `reduce_scatter_to_sequence_parallel_region`",
               _reduce("reduce_scatter")),
    Collective("all-to-all", "all_to_all", "all_to_all", "all-to-all", False, None,
               "Megatron `all_to_all` (MoE token dispatch)", _all_to_all),
    Collective("copy", "identity", None, "all-reduce", False,
               ("identity", "nothing after it is split over the group"),
               "Megatron `copy_to_tensor_model_parallel_region`", None),
    Collective("scatter", "scatter", "local_scatter", "all-gather", False, None,
               "Megatron `scatter_to_tensor_model_parallel_region`", _scatter),
    # not a statement: the backward keyword `identity`
    Collective("identity", "identity", None, "identity", False, None, "-", None),
)}
#: The plan's collective statements (docs/language.md, "Collectives").
STATEMENTS = tuple(k for k in COLLECTIVES if k != "identity")


#: A local program's collective kind -> the IR op evaluating it (``spec/convert.py``); the
#: kind ``identity`` (a copy) has none.
IR_OPS: dict[str, str] = {c.kind: c.ir_op for c in COLLECTIVES.values() if c.ir_op}


def kind_of(keyword: str) -> str:
    """The local-program kind of a statement or backward keyword (``copy``, ``identity``:
    ``identity``)."""
    return COLLECTIVES[keyword].kind


def layout_after(keyword: str, op: str, axes: tuple[str, ...], dim: int, dim2: int,
                 lay: TLayout, sizes: Mapping[str, int]) -> tuple[TLayout, Problems]:
    """The layout after the collective ``keyword`` and what is wrong with applying it.
    Raises ``LayoutError`` when the result has no layout at all (a zigzag dimension moved)."""
    from trainverify_dsl.ir.layout import LayoutError

    rule = COLLECTIVES[keyword].layout
    if rule is None:
        return lay, []
    moved = {"all-gather": (dim,), "reduce-scatter": (dim,), "scatter": (dim,),
             "all-to-all": (dim, dim2)}.get(keyword, ())
    zigzag = [d for d in moved if 0 <= d < lay.rank and lay.is_zigzag(d)]
    if zigzag:
        # the pieces would be put together (or cut) in rank order: positions k and 2N-1-k
        # of a zigzag split are not a block of anything (docs/semantics.md §2.6)
        raise LayoutError(f"dimension {zigzag[0]} is split in zigzag order "
                          f"({lay.describe()}): {keyword} along it would put the positions in "
                          "rank order, not in sequence order; only an algorithm that knows "
                          "the order (context-parallel-attention order=zigzag) may move them")
    return rule(op, axes, dim, dim2, lay, sizes)
