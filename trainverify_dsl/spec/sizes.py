"""Sizes read as numbers: arithmetic on a size of the inputs, found by exporting twice.

A model that divides by ``x.shape[0]`` (or ``len(x)``, ``labels.numel()``, ``x.size(1)``)
reads a size in Python: torch.export records the number, so the spec's step and the plan's
program (which takes the spec's constants, docs/semantics.md §4.2) both divide by the
global size. A rank of a real run reads its own, smaller size when the plan splits that
dimension (data ranks, microbatches, context parallelism), so the program checked would not
be the program run: a plan summing such losses is right on paper and wrong by the number
of data blocks in the run.

The reads are found by exporting the model's forward at the plan's sizes, again with
``batch`` doubled and again with ``seq`` doubled (fake tensors, no decomposition): two
graphs of one structure whose arithmetic ops differ in a number hold a number that follows
the sizes. Shape
arguments (``view``, ``expand``, ``arange``, ``slice`` ends) are not arithmetic and may
differ, except a view that cuts a growing dimension into a fixed number of groups
(``_fixed_outer``, TVP313): a rank of a real run makes that many groups of its own rows.
To keep the cost independent of depth, the model is exported with its block list
replaced by a stub (``spec/cut.py``; the embedding, the head and the loss, where a
normaliser sits) and the first block of each class on its own. Graphs whose structure
changes with the sizes (a Python loop over rows) and models whose ``input_specs`` or
forward reject the larger sizes are not compared: nothing is reported for them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainverify_dsl.spec.cut import BlockStub
from trainverify_dsl.spec.fx_import import user_frame
from trainverify_dsl.spec.trace import (
    _BlockCall,
    _export,
    _NoReuse,
    capture_stub_call,
    fake_mode_of,
    find_block_list,
)

#: ATen ops (by overload packet) whose number arguments are values, not shapes
ARITHMETIC = frozenset({
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "pow", "remainder",
    "fmod", "clamp", "clamp_min", "clamp_max", "masked_fill", "fill", "where", "lerp",
    "addcmul", "addcdiv", "scalar_tensor", "full_like", "maximum", "minimum",
})

#: ATen view ops (by overload packet): a count they fix along a growing dimension is read too
VIEWS = frozenset({"view", "_unsafe_view", "reshape"})

#: (batch, seq) -> {input: (shape, dtype)}
SpecsAt = Callable[[int, int], Mapping[str, tuple[Any, torch.dtype]]]


@dataclass(frozen=True)
class SizeRead:
    """A number in the model's arithmetic that follows the input sizes."""

    #: the number at the plan's sizes and with the size it follows doubled
    value: float
    doubled: float
    #: the ATen op (``div``) and the model code calling it (``path:line``, or ``""``)
    op: str
    frame: str
    #: a view fixing ``value`` groups along a dimension that grows (``_fixed_outer``)
    fixed: bool = False


def size_reads(model: nn.Module, specs_at: SpecsAt, batch: int, seq: int,
               wanted: Callable[[frozenset[tuple[str, int]]], bool] = lambda changed: True
               ) -> list[tuple[SizeRead, frozenset[tuple[str, int]]]]:
    """The numbers of ``model``'s arithmetic that change when ``batch`` doubles, and those
    that change when ``seq`` does, each with the input dimensions (name, dim) that change
    with that size. ``model`` is fake. ``wanted``: whether the numbers following a size that
    changes these input dimensions are asked for (the caller's split ones); a size nobody
    asks for is not traced (each size exports the model once more)."""
    try:
        small = specs_at(batch, seq)
        sizes = []
        for bigger in ((2 * batch, seq), (batch, 2 * seq)):
            try:
                large = specs_at(*bigger)
            except Exception:  # noqa: BLE001 - user code rejects the larger size
                continue
            changed = frozenset(
                (name, d) for name, (shape, _) in small.items()
                for d, (a, b) in enumerate(zip(shape, large[name][0], strict=False)) if a != b)
            if wanted(changed):
                sizes.append((large, changed))
        if not sizes:
            return []
        base = _graphs(model, _fake_inputs(model, small))
    except Exception:  # noqa: BLE001 - user code: its errors are the tracer's to report
        return []
    found = []
    for large, changed in sizes:
        try:
            graphs = _graphs(model, _fake_inputs(model, large))
        except Exception:  # noqa: BLE001 - user code rejects the larger size: not compared
            continue
        found += [(read, changed) for a, b in zip(base, graphs, strict=False)
                  for read in _compare(a, b)]
    return found


def _fake_inputs(model: nn.Module, specs: Mapping[str, tuple[Any, torch.dtype]]
                 ) -> tuple[torch.Tensor, ...]:
    with fake_mode_of(model):
        return tuple(torch.zeros(tuple(int(s) for s in shape), dtype=dtype)
                     for shape, dtype in specs.values())


def _graphs(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[Any]:
    """The exported forward of the model with its block list stubbed, then of the first
    block of each class (the whole model when it has no block list)."""
    found = find_block_list(model)
    if found is None:
        return [_export(model, inputs)]
    list_path, blocks = found
    try:
        args, kwargs = capture_stub_call(model, list_path, inputs)[0].calls[0]
    except _NoReuse:  # not a plain loop over its blocks: the model is read whole
        return [_export(model, inputs)]
    parent_path, _, attr = list_path.rpartition(".")
    parent = model.get_submodule(parent_path)
    original = getattr(parent, attr)
    setattr(parent, attr, nn.ModuleList([BlockStub()]))
    try:
        graphs = [_export(model, inputs)]
    finally:
        setattr(parent, attr, original)
    seen: set[type] = set()
    for block in blocks:
        if type(block) not in seen:
            seen.add(type(block))
            graphs.append(_export(_BlockCall(block, args, kwargs), _tensors(args, kwargs)))
    return graphs


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    return tuple(a.detach() for a in list(args) + list(kwargs.values())
                 if isinstance(a, torch.Tensor))


def _compare(small: Any, large: Any) -> Iterator[SizeRead]:
    a, b = list(small.graph.nodes), list(large.graph.nodes)
    if len(a) != len(b) or any(x.op != y.op or x.target != y.target
                               for x, y in zip(a, b, strict=True)):
        return  # the structure follows the sizes: not compared
    for x, y in zip(a, b, strict=True):
        op = _packet(x.target) if x.op == "call_function" else ""
        if op in VIEWS:
            count = _fixed_outer(x, y)
            if count is not None:
                yield SizeRead(count, count, op, user_frame(x.meta.get("stack_trace")),
                               fixed=True)
            continue
        if op not in ARITHMETIC:
            continue
        for u, v in zip(_leaves((x.args, x.kwargs)), _leaves((y.args, y.kwargs)), strict=False):
            if _number(u) and _number(v) and u != v:
                yield SizeRead(u, v, op, user_frame(x.meta.get("stack_trace")))
                break


def _fixed_outer(small: Any, large: Any) -> int | None:
    """The count a view fixes along a dimension that grows with the inputs: the output
    dimension that starts where the input's growing dimension starts (the outer part of it)
    keeps its size when that dimension doubles (``h.view(2, -1, d)``: two groups of rows,
    whatever the rows). A rank of a real run makes that many groups of its own rows; the
    lowering (which gives a view its local sizes) makes the spec's groups. ``None`` when the
    outer part follows the size (``view(-1, 4, d)``: groups of 4 rows)."""
    shapes = [_shape(n) for n in (small.args[0], small, large.args[0], large)]
    if any(shape is None for shape in shapes):
        return None
    si, so, li, lo = shapes
    if len(si) != len(li) or len(so) != len(lo):
        return None
    for i, (m, n) in enumerate(zip(si, li, strict=True)):
        if m == n:
            continue
        before, k, at = math.prod(si[:i]), 0, 1
        while k < len(so) and at < before:  # the output dimension where dimension i starts
            at *= so[k]
            k += 1
        while k < len(so) and so[k] == 1 and lo[k] == 1:
            k += 1
        if at == before and k < len(so) and so[k] == lo[k] > 1:
            if so[k] in _fixed_leads(_factors(small.args[0], large.args[0], i)):
                return None  # it splits off the fixed outer factor of a merged dimension
            return so[k]
    return None


#: ops whose output dimension ``d`` is their first tensor argument's dimension ``d``
_SAME_DIMS = frozenset({"clone", "contiguous", "_to_copy", "alias", "detach", "to",
                        "dropout", "add", "sub", "mul", "div", "neg", "relu", "gelu",
                        "silu", "sigmoid", "tanh"})


def _factors(small: Any, large: Any, d: int, depth: int = 16) -> list[tuple[int, int]]:
    """Dimension ``d`` of a node as the factors it was merged from, outermost first, each
    as its (size at the plan's sizes, size when they grow): ``x.transpose(0, 1)`` of a
    ``[b, s, h]`` reshaped to ``[s*b, h]`` has a fixed outer factor ``s`` and a growing
    inner one ``b``. Followed back through reshapes that merge dimensions, permutations,
    linear layers and elementwise ops; any other producer is one factor."""
    own = _shape(small), _shape(large)
    if own[0] is None or own[1] is None:
        return []
    whole = [(own[0][d], own[1][d])]
    if depth == 0 or not isinstance(small, torch.fx.Node) or small.op != "call_function":
        return whole
    op, args = _packet(small.target), small.args
    source = args[0] if args else None
    if not isinstance(source, torch.fx.Node):
        return whole
    twin = large.args[0]
    si, li = _shape(source), _shape(twin)
    if si is None or li is None:
        return whole
    if op in VIEWS:
        before = math.prod(own[0][:d])
        at, j = 1, 0
        while j < len(si) and at < before:  # the input dimension where output d starts
            at *= si[j]
            j += 1
        if at != before:
            return whole
        merged, size = [], 1
        while j < len(si) and size < own[0][d]:
            merged += _factors(source, twin, j, depth - 1)
            size *= si[j]
            j += 1
        return merged if size == own[0][d] and merged else whole
    if op == "permute":
        return _factors(source, twin, int(args[1][d]) % len(si), depth - 1)
    if op == "transpose":
        a, b = (int(x) % len(si) for x in args[1:3])
        return _factors(source, twin, b if d == a else a if d == b else d, depth - 1)
    if (op == "linear" and d < len(si) - 1) or (op == "mm" and d == 0) or \
            (op in _SAME_DIMS and si == own[0]):
        return _factors(source, twin, d, depth - 1)
    if op == "addmm" and d == 0 and isinstance(args[1], torch.fx.Node):
        return _factors(args[1], large.args[1], 0, depth - 1)
    return whole


def _fixed_leads(factors: list[tuple[int, int]]) -> set[int]:
    """The sizes the leading factors that do not grow multiply to (``{s}`` for ``[s, b]``
    with ``b`` growing; nothing when the outermost factor grows)."""
    leads, size = set(), 1
    for small, large in factors:
        if small != large:
            break
        size *= small
        leads.add(size)
    return leads


def _shape(node: Any) -> tuple[int, ...] | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return tuple(int(n) for n in value.shape)
    except (TypeError, ValueError):  # a symbolic size
        return None


def _packet(target: Any) -> str:
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", "") if packet is not None else ""


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for key in sorted(value):
            yield from _leaves(value[key])
    else:
        yield value
