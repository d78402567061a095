"""How each rank normalises its local loss: ``loss-reduction`` (docs/semantics.md §4.3).

The spec's loss ends in its *normaliser*: ``mean(x)`` over every dimension (the reference
losses without an ignore index, the MLP's MSE), or ``S / C``, a sum of per-token losses over
a token count (a loss with an ignore index: ``sum(where(counted, ℓ, 0)) / sum(counted)``),
possibly under a negation or a constant factor. Run locally the normaliser divides by the
rank's own count; ``loss-reduction`` states what the plan divides by instead:

- ``local-mean`` (default): the rank's own count, the spec's function on the local pieces
  (Rule 4.2). For a ``mean`` root this is the ordinary lowering of ``mean`` (nothing here
  runs); for a ratio ``S / C`` it is the local ratio, whose layout is called ``Partial(avg)``
  over the axes its sums are partial over — what §4.6 compares as the mean of the local
  losses, equal to the spec's loss only when every data block counts the same tokens;
- ``token-mean [over A]``: ``S`` divided by the **step's** count ``D``: the local counts
  summed over the microbatches and the data blocks along ``A`` (every data axis by default),
  computed before the first microbatch as Megatron-LM's per-token loss and Hugging Face's
  ``num_items_in_batch`` do. The count becomes an output ``count`` of the loss stage (a
  graph of the data alone) and ``D`` an input ``denominator``; the loss is ``Partial(sum)``;
- ``sum scale=s``: ``s * S``, ``Partial(sum)``.

The algorithms that replace the loss (``vocab-parallel-cross-entropy``) compute ``S`` and
``C`` themselves and call ``normalise``; everything else comes through ``lower_root``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainverify_dsl.ir.layout import MICROBATCH_AXIS, TLayout
from trainverify_dsl.ir.parallel import denominator_input
from trainverify_dsl.lower.findings import Finding, LoweringError
from trainverify_dsl.plan import vocab
from trainverify_dsl.report import codes_lower
from trainverify_dsl.spec.convert import packet_name

aten = torch.ops.aten

#: The name of the stage input that carries the step's denominator, and of the count output.
DENOMINATOR = "loss.denominator"
COUNT = "loss.count"


@dataclass(frozen=True, slots=True)
class Root:
    """The spec loss's normaliser: ``node`` is the ``mean``, the ``div`` or a ``sum``; for a
    ratio ``numerator``/``count`` are its operands, for a mean or a sum ``numerator`` is the
    averaged (summed) tensor and ``count`` is ``None``. A loss ending in a plain ``sum`` over
    every dimension has no normaliser (``summed``): its value over a split batch is the sum
    of the local losses, which only ``loss-reduction sum`` states."""

    node: torch.fx.Node
    numerator: torch.fx.Node
    count: torch.fx.Node | None
    summed: bool = False
    #: guards between the count and the division, innermost first (``guarded``): ``S /
    #: C.clamp(min=1)``, ``S / torch.maximum(C, 1)``, ``S / (C + eps)``
    guards: tuple[torch.fx.Node, ...] = ()
    #: a sum over every element of ``numerator``, a ``mean`` of ``averaged`` over these
    #: dimensions (``e.pow(2).mean(0).sum()``): where the plan splits only these dimensions
    #: of ``averaged``, the sum runs over none of a rank's shares, and the ordinary rules
    #: lower the loss (``lowering._mean_then_sum``); elsewhere it is a sum like any
    mean_dims: tuple[int, ...] = ()
    averaged: torch.fx.Node | None = None


#: Ops that guard a token count against an empty batch (``count.clamp(min=1)``,
#: ``torch.maximum(count, one)``, ``count + eps``, a cast), each applied to the count alone
#: with constants: the spec divides by the guarded count of the whole step, so a plan
#: applies the guard once to the count it divides by (the step's under ``token-mean``).
GUARD_OPS = frozenset({"aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.add",
                       "aten.sub", "aten.maximum", "aten.minimum", "aten._to_copy"})


def guarded(count: Any) -> tuple[Any, tuple[torch.fx.Node, ...]]:
    """The count under its guards (``GUARD_OPS``, each used by the next alone, the last by
    the division alone, its other operands numbers or scalar constants built from no input)
    and the guards, innermost first. Only such a chain may be passed through by the
    ordinary lowering and applied by the division (``normalise``): nothing else reads it."""
    guards: list[torch.fx.Node] = []
    node = count
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and \
            packet_name(node.target) in GUARD_OPS and len(_readers(node)) == 1:
        name = packet_name(node.target)
        operands = list(node.args) + list(node.kwargs.values())
        counts = [a for a in operands if isinstance(a, torch.fx.Node) and not _scalar_constant(a)]
        if len(counts) != 1 or any(isinstance(a, (list, tuple)) for a in operands):
            break  # the count alone, beside numbers and scalar constants
        inner = counts[0]
        if inner is not node.args[0] and name not in ("aten.add", "aten.maximum",
                                                      "aten.minimum"):
            break  # `1 - count`, a clamp of a constant by the count: not a guard
        if name in ("aten.add", "aten.sub") and (
                len(node.args) != 2 or any(isinstance(a, torch.fx.Node) and a is not inner
                                           for a in node.args)):
            break  # a number added, not a tensor (its layout would be its own)
        guards.append(node)
        node = inner
    return node, tuple(reversed(guards))


#: torch.export's checks: they read a value's metadata, never its value
CHECKS = frozenset({"aten._assert_tensor_metadata", "aten._assert_scalar"})


def _readers(node: torch.fx.Node) -> list[torch.fx.Node]:
    return [u for u in node.users if packet_name(u.target) not in CHECKS]


def _scalar_constant(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and packet_name(node.target) == "aten.full" and \
        not node.all_input_nodes and "val" in node.meta and node.meta["val"].dim() == 0


def apply_guards(lw: Any, count: Any, guards: tuple[torch.fx.Node, ...]) -> Any:
    """``guards`` (spec nodes, innermost first) applied to ``count``, a local node of the
    loss stage: the same ops, their constants as the lowering computed them."""
    for guard in guards:
        inner = guard.args[0]
        args = tuple(count if a is inner else lw.value(lw.stage, a)
                     if isinstance(a, torch.fx.Node) else a for a in guard.args)
        count = lw.emit(guard.target, args, dict(guard.kwargs))
    return count


def find_root(loss: Any) -> Root | None:
    """The normaliser under ``loss``: through negations and constant factors down to a
    ``mean`` over every dimension or a ``div`` of two tensors; ``None`` for any other loss."""
    node = _through_factors(loss)
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    name = packet_name(node.target)
    if name == "aten.div" and len(node.args) == 2 and \
            all(isinstance(a, torch.fx.Node) for a in node.args):
        count, guards = guarded(node.args[1])
        return Root(node, node.args[0], count, guards=guards)
    if name in ("aten.mean", "aten.sum") and isinstance(node.args[0], torch.fx.Node):
        x = node.args[0]
        if _reduced_dims(node) == set(range(x.meta["val"].dim())):
            averaged = _mean_dims(x) if name == "aten.sum" else None
            if averaged is not None:
                return Root(node, x, None, summed=True, mean_dims=averaged,
                            averaged=x.args[0])
            return Root(node, x, None, summed=name == "aten.sum")
    return None


def _reduced_dims(node: torch.fx.Node) -> frozenset[int]:
    """The dimensions a ``mean`` or ``sum`` node reduces (every one when it names none)."""
    rank = node.args[0].meta["val"].dim()
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or dims == []:
        return frozenset(range(rank))
    return frozenset(d % rank for d in (dims if isinstance(dims, (list, tuple)) else [dims]))


def _mean_dims(x: torch.fx.Node) -> tuple[int, ...] | None:
    """The dimensions ``x`` averages, when it is a ``mean`` over some (not all) dimensions of
    a tensor that only the loss's sum reads; else ``None``."""
    if x.op != "call_function" or packet_name(x.target) != "aten.mean" or \
            len(_readers(x)) != 1 or not isinstance(x.args[0], torch.fx.Node):
        return None
    found = _reduced_dims(x)
    return tuple(sorted(found)) if len(found) < x.args[0].meta["val"].dim() else None


def find_roots(loss: Any, reads_data: Callable[[torch.fx.Node], bool] = lambda n: True
               ) -> tuple[Root, ...] | None:
    """The normalisers of a loss that adds several (a token-mean cross-entropy plus a z-loss
    averaged over every position, an auxiliary loss): ``find_root`` of each term of a sum
    or difference, through negations and constant factors; ``None`` unless every term that
    ``reads_data`` has one. Each term is normalised by its own count (§4.3). A term that
    reads no data input (a penalty on the parameters, ``0.01 * (w ** 2).sum()``) is no loss
    over the batch: every rank computes it whole, it has no normaliser, and the ordinary
    rules lower it with the rest of the loss."""
    single = find_root(loss)
    if single is not None:
        return (single,)
    node = _through_factors(loss)
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or \
            packet_name(node.target) not in ("aten.add", "aten.sub") or node.kwargs or \
            len(node.args) != 2 or not all(isinstance(a, torch.fx.Node) for a in node.args):
        return None
    found: list[Root] = []
    for term in node.args:
        if not reads_data(term):
            continue
        roots = find_roots(term, reads_data)
        if roots is None or not _read_once(term, roots):
            return None
        found += [r for r in roots if all(r.node is not f.node for f in found)]
    return tuple(found) or None


def reads_data_input(node: torch.fx.Node, kinds: Callable[[str], str]) -> bool:
    """Whether the spec node ``node`` depends on a data input of the model (``kinds``: a
    placeholder's kind by its name, ``param``, ``buffer``, ``data``, ``constant``)."""
    seen: set[torch.fx.Node] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder" and kinds(n.name) == "data":
            return True
        todo.extend(n.all_input_nodes)
    return False


def _read_once(term: torch.fx.Node, roots: tuple[Root, ...]) -> bool:
    """Whether the sum alone reads ``term`` and every node from it down to its normalisers:
    a normaliser is lowered to its share of the loss (under token-mean, its local sum over
    the step's count), which no other reader of the spec's value may see."""
    todo, seen = [term], set()
    stops = {r.node for r in roots}
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if len(_readers(node)) != 1:
            return False
        if node not in stops:
            todo.extend(a for a in node.all_input_nodes if not _scalar_constant(a))
    return True


def _through_factors(node: Any) -> Any:
    """``node`` under negations and constant factors (as ``find_root`` walks them)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        name = packet_name(node.target)
        if name == "aten.neg":
            node = node.args[0]
            continue
        if name in ("aten.mul", "aten.div") and len(node.args) == 2:
            a, b = node.args
            if isinstance(a, torch.fx.Node) and isinstance(b, (int, float)):
                node = a
                continue
            if name == "aten.mul" and isinstance(b, torch.fx.Node) and \
                    isinstance(a, (int, float)):
                node = b
                continue
        break
    return node


def mode_of(plan: Any) -> str:
    reduction = plan.loss_reduction
    return vocab.LOSS_REDUCTION_DEFAULT if reduction is None else reduction.mode


def intercepts(plan: Any, root: Root | None) -> bool:
    """Whether the loss's normaliser is lowered here (else by the ordinary rules): a ratio
    and a plain sum always, a mean when the plan states a reduction other than
    ``local-mean``."""
    if root is None:
        return False
    return root.count is not None or root.summed or \
        mode_of(plan) != vocab.LOSS_REDUCTION_DEFAULT


def no_root(plan: Any) -> LoweringError:
    reduction = plan.loss_reduction
    return LoweringError(Finding(
        codes_lower.LOSS_REDUCTION_MISMATCH,
        f"`loss-reduction {reduction.mode}` needs a loss that ends in a mean over every "
        "dimension or a sum divided by a token count; the spec's loss ends otherwise",
        reduction.origin, "loss"))


def summed_loss(plan: Any, root: Root | None = None) -> LoweringError:
    """A loss that sums over the batch, under a reduction that averages or counts."""
    reduction = plan.loss_reduction
    mode = mode_of(plan)
    origin = reduction.origin if reduction is not None else plan.spec.origin
    said = f"`loss-reduction {mode}`" if reduction is not None else \
        "the default `loss-reduction local-mean`"
    return LoweringError(Finding(
        codes_lower.LOSS_REDUCTION_MISMATCH,
        f"the spec's loss ends in a sum over every element, not a mean or a sum divided by a "
        f"token count: over a split batch its value is the sum of the ranks' local losses, "
        f"while {said} {'averages them' if mode == 'local-mean' else 'divides by a count'} "
        "(docs/semantics.md Rule 4.5)", origin, "loss",
        "state `loss-reduction sum scale=1` and sum the gradients (`op=sum`); if the loss "
        "divides that sum by a size read in Python (`x.shape[0]`), write `.mean()` instead: "
        "each rank of a real run reads its own, smaller size"))


def _given_divisor(plan: Any, root: Root) -> LoweringError:
    """A sum over the batch divided by a number every rank holds whole, under a reduction
    that averages or counts."""
    reduction = plan.loss_reduction
    mode = mode_of(plan)
    origin = reduction.origin if reduction is not None else plan.spec.origin
    said = f"`loss-reduction {mode}`" if reduction is not None else \
        "the default `loss-reduction local-mean`"
    count = root.count
    divisor = f"the input `{count.name}`" if count is not None and count.op == "placeholder" \
        else "a number"
    return LoweringError(Finding(
        codes_lower.LOSS_REDUCTION_MISMATCH,
        f"the spec's loss divides a sum over the batch by {divisor}, which every rank holds "
        "whole (a count given as an input, as Hugging Face's `num_items_in_batch`): "
        "over a split batch the loss is the sum of the ranks' shares, while "
        f"{said} {'averages them' if mode == 'local-mean' else 'divides by a count of its own'} "
        "(docs/semantics.md Rule 4.5)", origin, "loss",
        "state `loss-reduction sum scale=1` and sum the gradients (`op=sum`)"))


def lower_root(lw: Any, root: Root) -> tuple[torch.fx.Node, TLayout]:
    """The local normaliser of the spec's loss, on the loss stage (``lw.stage``)."""
    stage = lw.stage
    if root.summed and mode_of(lw.plan) != "sum":
        raise summed_loss(lw.plan, root)
    if root.count is None:  # a mean: its sum over every dimension, the local element count
        x = root.numerator
        lay = lw.layout(x)
        if lay.partial:
            raise LoweringError(Finding(
                codes_lower.PARTIAL_NONLINEAR, f"the loss {'sums' if root.summed else 'averages'} "
                f"a partial sum over "
                f"{', '.join(lay.partial[1])}: reduce it first", lay.cause, "loss"))
        local_x = lw.value(stage, x)
        numerator = lw.emit(aten.sum.dim_IntList, (local_x, []))
        axes = tuple(a for d in range(lay.rank) for a in lay.dim_axes(d))
        count: Any = int(local_x.meta["val"].numel())
        cause = lay.cause
    else:
        s_lay, c_lay = lw.layout(root.numerator), lw.layout(root.count)
        if s_lay.partial and s_lay.partial[0] == "sum" and not c_lay.partial and \
                c_lay.rank == 0:
            # a divisor every rank holds whole (Hugging Face's `num_items_in_batch` input):
            # the division is linear in the sum, and the loss a sum of the local ones
            if mode_of(lw.plan) != "sum":
                raise _given_divisor(lw.plan, root)
            divisor = apply_guards(lw, lw.value(stage, root.count), root.guards)
            share = lw.emit(aten.div.Tensor, (lw.value(stage, root.numerator), divisor))
            return normalise(lw, share, 1, s_lay.partial[1], s_lay.cause, summed=True)
        if mode_of(lw.plan) == "token-mean":
            _check_count(lw, lw.value(stage, root.count))
        if (s_lay.partial or ("sum", ()))[0] != "sum" or s_lay.partial != c_lay.partial:
            raise LoweringError(Finding(
                codes_lower.PARTIAL_NONLINEAR, "the loss divides a sum partial over "
                f"{_axes_text(s_lay)} by a count partial over {_axes_text(c_lay)}: a token "
                "mean needs both summed over the same ranks", s_lay.cause or c_lay.cause,
                "loss"))
        numerator = lw.value(stage, root.numerator)
        count = lw.value(stage, root.count)
        axes = s_lay.partial[1] if s_lay.partial else ()
        cause = s_lay.cause
    return normalise(lw, numerator, count, axes, cause, guards=root.guards)


def root_axes(layouts: Any, root: Root) -> tuple[str, ...] | None:
    """The axes the loss is split over at its normaliser: those splitting the averaged
    tensor of a mean, those a ratio's sum is partial over; ``None`` when not lowered."""
    lay = layouts.get(root.numerator)
    if root.averaged is not None and not (lay is None or isinstance(lay, tuple)) and \
            lay.partial and lay.partial[0] == "avg":
        lay = layouts.get(root.averaged)  # a mean's own: the axes splitting what it averages
    if lay is None or isinstance(lay, tuple):
        return None
    if root.count is None:
        return tuple(a for d in range(lay.rank) for a in lay.dim_axes(d))
    return lay.partial[1] if lay.partial else ()


def normalise(lw: Any, numerator: torch.fx.Node, count: torch.fx.Node | int,
              axes: tuple[str, ...], cause: Any, summed: bool = False,
              guards: tuple[torch.fx.Node, ...] = ()) -> tuple[torch.fx.Node, TLayout]:
    """``numerator`` (this rank's sum of per-token losses, partial over ``axes``) divided as
    the plan's ``loss-reduction`` says, with its layout; a ``token-mean`` registers the
    count output and the denominator input of the loss stage. ``summed``: the spec's loss is
    that sum itself (no normaliser), which only ``loss-reduction sum`` states. ``guards``:
    the spec's ops between its count and the division (``Root.guards``), applied to the
    count divided by: the rank's own under ``local-mean``, the step's under ``token-mean``."""
    plan = lw.plan
    mode = mode_of(plan)
    if summed and mode != "sum":
        raise summed_loss(plan)
    reduction = plan.loss_reduction
    scalar = TLayout(())
    if mode == "local-mean":
        if axes and not isinstance(count, int):  # a count of the data, split: each its own
            lw.local_counts = tuple(axes)
            if _reads_data(lw, count):
                lw.findings.append(_per_block(lw, axes, cause))
        out = lw.emit(aten.div.Tensor, (numerator, apply_guards(lw, count, guards)))
        return out, scalar.with_partial(("avg", axes), cause) if axes else scalar
    origin = reduction.origin
    if mode == "sum":
        if not summed and not isinstance(count, int) and _reads_data(lw, count):
            lw.fixed_count = True  # a fixed number where the spec divides by a data count
            lw.findings.append(Finding(
                codes_lower.COUNT_PER_BLOCK,
                f"`loss-reduction sum scale={reduction.scale}` divides by a fixed number where "
                "the spec's loss divides by a token count of the data: the step's loss only "
                "for batches counting exactly that many tokens; `tvp check` never verifies "
                "it (docs/semantics.md §4.3)", reduction.origin, "loss",
                "state `loss-reduction token-mean` to divide by the step's count, and sum "
                "the gradients (`op=sum`)"))
        out = lw.emit(aten.mul.Tensor, (numerator, float(reduction.scale)))
        return out, scalar.with_partial(("sum", axes), origin) if axes else scalar
    data = lw.binding.data_axes()
    counted = reduction.axes or tuple(a for a in lw.plan.mesh.names if a in data)
    outside = [a for a in counted if a not in data]
    if outside:
        raise LoweringError(Finding(
            codes_lower.LOSS_REDUCTION_MISMATCH,
            f"`loss-reduction token-mean over {', '.join(reduction.axes)}`: "
            f"{', '.join(outside)} splits no model input, so its ranks hold the same tokens "
            "and summing their counts would count them twice (docs/semantics.md §4.3)",
            origin, "loss"))
    if isinstance(count, int):
        count = lw.emit(aten.full.default, ([], count), {"dtype": torch.int64})
    _check_count(lw, count)
    dtype = numerator.meta["val"].dtype
    k = len(lw.loss_counts)  # one count per normaliser of the loss (``find_roots``)
    denominator = lw.placeholder(lw.stage, DENOMINATOR if not k else f"{DENOMINATOR}.{k}",
                                 "denominator", denominator_input(k), scalar, dtype)
    lw.loss_counts.append((count, tuple(counted)))
    out = lw.emit(aten.div.Tensor, (numerator, apply_guards(lw, denominator, guards)))
    summed = tuple(a for a in axes if a in counted or a == MICROBATCH_AXIS)
    return out, scalar.with_partial(("sum", summed), origin) if summed else scalar


def _per_block(lw: Any, axes: tuple[str, ...], cause: Any) -> Finding:
    """TVP415 for the default local mean of a loss divided by a token count of the data,
    at the statement that splits the loss's sum (the `microbatches` line, a `split`)."""
    names = [a for a in axes if a != MICROBATCH_AXIS] + \
        ["the microbatches" for a in axes if a == MICROBATCH_AXIS]
    shown = " and ".join(names)
    return Finding(
        codes_lower.COUNT_PER_BLOCK,
        "the spec's loss divides by a token count of the data, and under the default "
        f"`loss-reduction local-mean` each block along {shown} divides by its own count: "
        "the step's loss only when every block counts the same tokens; `tvp check` never "
        "verifies it (docs/semantics.md §4.3)", cause or lw.plan.spec.origin, "loss",
        "state `loss-reduction token-mean` to divide by the step's count, and sum the "
        "gradients (`op=sum`, no `loss-scale`)")


def _check_count(lw: Any, count: torch.fx.Node) -> None:
    """A step-wide count exists before the first microbatch only when the local count is
    computed from the model inputs alone (Rule 4.5)."""
    floats = _float_data(lw, count)
    if floats:
        raise LoweringError(Finding(
            codes_lower.LOSS_REDUCTION_MISMATCH,
            "`loss-reduction token-mean`: the loss's count depends on the float input "
            f"{', '.join(sorted(floats))}, not on integer or boolean data alone: a token count "
            "counts positions (labels, masks), so it is an integer (a weighted mean is not "
            "one; docs/semantics.md Rule 4.5)",
            lw.plan.loss_reduction.origin, "loss"))
    reads = {n.name for n, slot in _placeholders(lw, count)
             if slot is None or slot.kind not in ("data", "buffer", "coord")}
    if reads:
        raise LoweringError(Finding(
            codes_lower.LOSS_REDUCTION_MISMATCH,
            "`loss-reduction token-mean`: the loss's token count depends on "
            f"{', '.join(sorted(reads))}, not on the model inputs alone, so no step-wide count "
            "exists before the first microbatch (docs/semantics.md Rule 4.5)",
            lw.plan.loss_reduction.origin, "loss"))


def _placeholders(lw: Any, node: torch.fx.Node) -> list[tuple[torch.fx.Node, Any]]:
    """The stage inputs ``node`` (in the loss stage's local graph) depends on, each with its
    slot (``None`` for a placeholder that is no stage input)."""
    slots = {s.name: s for s in lw.inputs[lw.stage]}
    seen: set[torch.fx.Node] = set()
    todo, found = [node], []
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            found.append((n, slots.get(n.name)))
        todo.extend(n.all_input_nodes)
    return found


def _float_data(lw: Any, node: torch.fx.Node) -> set[str]:
    """The floating-point data inputs ``node`` depends on, by their spec names."""
    return {f"`{slot.spec}`" for n, slot in _placeholders(lw, node)
            if slot is not None and slot.kind == "data" and "val" in n.meta
            and n.meta["val"].is_floating_point()}


def _reads_data(lw: Any, node: torch.fx.Node) -> bool:
    """Whether ``node`` depends on a data input."""
    return any(slot is not None and slot.kind == "data" for _, slot in _placeholders(lw, node))


def _axes_text(lay: TLayout) -> str:
    return ", ".join(lay.partial[1]) if lay.partial else "no axis"


__all__ = ["COUNT", "DENOMINATOR", "GUARD_OPS", "Root", "apply_guards", "find_root", "find_roots",
           "guarded", "intercepts", "lower_root", "normalise", "no_root", "reads_data_input",
           "summed_loss"]
