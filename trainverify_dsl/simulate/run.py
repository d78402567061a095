"""Numeric simulation: the plan's parallel program and the reference step on the same values.

Two IR programs are evaluated on the same random parameters, optimizer states and inputs:

- the **reference**: the spec's traced single-device training step with the spec's own
  optimizer (``SpecProgram``, ``ir.program.evaluate_program``);
- the **plan**: its ``ParallelProgram`` (``ir.execute.evaluate_parallel``).

Then the named checks of ``ir/compare.py`` run (``CHECKS``: the copies of the loss, the logical
loss (docs/semantics.md §4.6), gradient coverage, every gradient copy in its final layout, the
plan's layout claims (§2.4), the optimizer's hyper-parameters against the spec's, every updated
parameter and optimizer state, and the derived lineages at marked points), comparing float64
values with a relative tolerance (``Float64``). The reference values at marked points are
outputs of the reference IR too (``point:<point>``: the spec is traced with the points
``reference_points`` lists marked, ``spec/marks.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainverify_dsl.ir.compare import Comparison, Mismatch, Pair, Recipe, run_checks
from trainverify_dsl.ir.execute import evaluate_parallel
from trainverify_dsl.ir.ops import OPS
from trainverify_dsl.ir.parallel import ParallelProgram
from trainverify_dsl.ir.program import Program
from trainverify_dsl.ir.types import INT_DTYPES
from trainverify_dsl.spec import optim
from trainverify_dsl.spec.marks import POINT, point_values

#: Relative error below which two float64 results agree (round-off of the same real numbers).
TOLERANCE = 1e-9
#: A relative error at or above this is never put down to round-off (``Roundoff``).
MARGINAL = 1e-6
#: How much more round-off than the reference's own an evaluation of the same real numbers in
#: another order (the ranks' partial sums, eager torch's kernels) may carry (``Roundoff``).
ROUNDOFF_FACTOR = 100


@dataclass
class SimulationResult:
    plan: str
    ranks: int
    max_rel_error: float
    compared: int
    mismatches: list[Mismatch] = field(default_factory=list)
    sizes: dict[str, Any] = field(default_factory=dict)
    #: layout-pass findings of the lowering (Diagnostics)
    findings: list[Any] = field(default_factory=list)
    #: marked points whose values differ from their derived lineage, in program order
    lineage_mismatches: list[Mismatch] = field(default_factory=list)
    #: mesh axes no statement uses, simulated at size 1: ``{axis: its size in the plan}``
    idle_axes: dict[str, int] = field(default_factory=dict)
    #: the memory estimate the budget was checked against (``simulate.budget``)
    estimated_bytes: int = 0
    #: how the first difference differs (``ir.reading.Reading``), when it has values
    reading: Any = None
    #: how the inputs compared were drawn, when not the first draw (``COUNT_DRAW``)
    draw: str = ""
    #: the largest relative error at or above ``TOLERANCE`` that the reference step's own
    #: float64 round-off explains (``Roundoff``); 0.0 when there was none
    roundoff: float = 0.0

    @property
    def agrees(self) -> bool:
        """The final outputs agree (loss, gradients, updates). A derived lineage that differs
        while they agree is not a disagreement (docs/semantics.md §8)."""
        return not self.mismatches and (self.max_rel_error < TOLERANCE or
                                        self.max_rel_error <= self.roundoff)

    @property
    def first(self) -> Mismatch | None:
        """The first tensor in program order that differs: an intermediate value at a marked
        point if one does, else the first final output."""
        if not self.mismatches:
            return None
        return (self.lineage_mismatches or self.mismatches)[0]


#: A tensor is compared relative to its own largest entry, but never relative to less than
#: this fraction of the largest entry of all expected values: a gradient that is zero in real
#: arithmetic (GPT-2's key bias: softmax ignores a constant added to every score) is
#: round-off on both sides, and its relative error would be noise.
FLOOR = 1e-6


def rel_error(got: np.ndarray, want: np.ndarray, floor: float = 1e-12) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return math.inf
    if got.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(want))), floor)
    diff = float(np.max(np.abs(got - want)))
    return diff / scale if np.isfinite(diff) else math.inf


# -- random values --------------------------------------------------------------------------


#: The second draw of a loss divided by per-block counts (``random_inputs(few=True)``): its
#: integer inputs drawn from {0, 1}, masked at random positions, so a mask built from them
#: (`m > 0`, `arange(s) < lengths`, labels shifted in the model) counts differently from
#: block to block.
COUNT_DRAW = "a second draw, integer inputs from {0, 1} masked at random positions and " \
             "random booleans, so that the blocks count different tokens"


def random_inputs(spec_inputs: Any, model: torch.nn.Module, rng: np.random.Generator,
                  program: Program | None = None, few: bool = False) -> dict[str, np.ndarray]:
    """Parameters ~ N(0, 0.5²), states positive where they must be (Adam's v), token ids in
    range (the vocabulary is the first dimension of the embedding table), real inputs N(0,1),
    buffers as the model built them. An input the model names in ``masked_inputs()`` (labels
    with an ``ignore_index``), or that the reference step ``program`` tests against a value
    never drawn (``inferred_masks``), has some entries masked (``mask_rows``). ``few``: the
    integer inputs drawn from {0, 1} (within their range), masked at random positions, and
    the booleans at random (``COUNT_DRAW``)."""
    buffers = {n: b.detach().cpu().double().numpy() if b.is_floating_point() else
               b.detach().cpu().numpy() for n, b in model.named_buffers()}
    vocab = model_vocab(model) or 2
    ranges = input_ranges(program, vocab) if program is not None else {}
    masked = input_masks(model, program, ranges or vocab)
    values: dict[str, np.ndarray] = {}
    for g in spec_inputs:
        shape = g.type.shape
        if g.kind == "buffer":
            values[g.name] = buffers[g.name]
        elif g.type.dtype == "bool":
            values[g.name] = rng.integers(0, 2, size=shape).astype(bool) if few else \
                draw_bool(shape)
        elif g.type.dtype in INT_DTYPES:
            high = ranges.get(g.name, vocab)
            values[g.name] = rng.integers(0, min(high, 2) if few else high, size=shape)
            if g.name in masked and few:
                values[g.name] = mask_at_random(values[g.name], masked[g.name], rng)
            elif g.name in masked:
                values[g.name] = mask_rows(values[g.name], masked[g.name], high)
        elif g.kind == "state" and g.name.startswith("v("):
            values[g.name] = rng.uniform(0.1, 1.0, size=shape)
        else:
            values[g.name] = rng.normal(0.0, 0.5, size=shape)
    return values


#: The values a counterexample is shrunk towards (``small_values``): every float input but the
#: buffers takes one of these; one that must stay positive (Adam's ``v``, an input positive
#: everywhere) takes one of ``SMALL_POSITIVE``.
SMALL = (-1.0, -0.5, 0.5, 1.0)
SMALL_POSITIVE = (0.5, 1.0)


def small_values(values: Mapping[str, np.ndarray], buffers: set[str],
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``values`` with every float input except ``buffers`` redrawn from ``SMALL`` (or
    ``SMALL_POSITIVE``): the inputs a counterexample is shown at when they still show it.
    Integer inputs (token ids, labels) and buffers (RoPE tables) are kept."""
    out = dict(values)
    for name, value in values.items():
        array = np.asarray(value)
        if name in buffers or not np.issubdtype(array.dtype, np.floating):
            continue
        choices = SMALL_POSITIVE if name.startswith("v(") or (array.size and np.all(array > 0)) \
            else SMALL
        out[name] = rng.choice(choices, size=array.shape)
    return out


#: Ops whose result holds some of their first operand's values as they are (a reshape, a
#: slice: `labels[:, 1:]`, the labels a model shifts itself)
CARRIED = frozenset({"slice", "select"})


def _carries(node: Any) -> bool:
    return bool(node.inputs) and (OPS[node.op].group == "view" or node.op in CARRIED)


def input_ranges(program: Program, default: int) -> dict[str, int]:
    """Every integer data input's drawn range ``[0, high)``: the fewest rows of any table it
    indexes in the step (``embedding``, ``gather``, ``index_select``, through reshapes), else
    ``default`` (the first embedding's vocabulary). A ``position_ids`` input indexing a
    position table of 8 rows was drawn up to the vocabulary (an internal IndexError), and so
    were a classifier's labels (3 classes beside an embedding of 13 rows) behind
    cross-entropy's ``where`` of the ignored index."""
    data = {g.name for g in program.inputs if g.kind == "data" and g.type.dtype in INT_DTYPES}
    found = dict.fromkeys(data, default)
    seen: dict[str, int] = {}
    table = dict(program.graphs)
    for call in program.calls:
        graph = table[call.graph]
        of: dict[int, str] = {i: arg for i, arg in enumerate(call.args) if arg in data}
        shapes = [g.type.shape for g in graph.inputs] + [n.shape for n in graph.nodes]
        for k, node in enumerate(graph.nodes):
            value = len(graph.inputs) + k
            if _carries(node) and node.inputs[0] in of:
                of[value] = of[node.inputs[0]]
            elif node.op == "where" and len(node.inputs) == 3 and node.inputs[1] in of:
                # cross-entropy's `where(target != ignore_index, target, 0)` before its
                # gather: the classes index the logits, not the embedding's vocabulary
                of[value] = of[node.inputs[1]]
            elif node.op in ("embedding", "gather", "index_select") and \
                    len(node.inputs) == 2 and node.inputs[1] in of:
                source = shapes[node.inputs[0]]
                rows = source[0 if node.op == "embedding" else node.attr_map()["dim"]]
                name = of[node.inputs[1]]
                seen[name] = min(seen.get(name, rows), rows)
    return {**found, **{name: max(1, rows) for name, rows in seen.items()}}


def input_masks(model: torch.nn.Module, program: Program | None,
                high: int | Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Input name -> the values masking it: the model's ``masked_inputs()``, then the
    constants the reference step ``program`` tests it against (``inferred_masks``)."""
    masked = {name: (int(value),) for name, value in
              dict(getattr(model, "masked_inputs", dict)()).items()}
    for name, found in (inferred_masks(program, high) if program is not None else {}).items():
        masked[name] = tuple(dict.fromkeys(masked.get(name, ()) + found))
    return masked


def unheld_masks(masks: Mapping[str, tuple[int, ...]], ranges: Mapping[str, int],
                 default: int) -> dict[str, tuple[int, int]]:
    """Integer data inputs masked (``input_masks``) with a value past the range they are
    drawn in (``input_ranges``; ``default`` for the others): input -> (the least such value,
    the range). When the model indexes a table with the input where the value masks it (a
    pad label compared by hand, `tgt != 3`, beside a vocabulary shrunk to 2 rows), the step
    cannot run at these widths (TVP312); negative values (torch's -100) are never rows."""
    found: dict[str, tuple[int, int]] = {}
    for name, values in masks.items():
        high = ranges.get(name, default)
        beyond = [v for v in values if v >= high]
        if beyond:
            found[name] = (min(beyond), high)
    return found


def inferred_masks(program: Program, high: int | Mapping[str, int]
                   ) -> dict[str, tuple[int, ...]]:
    """Integer data inputs the step's forward tests for equality (``eq``, ``ne``, through
    reshapes) with a constant, and the constants: ``labels != -100`` of torch's
    ``cross_entropy`` (its ``ignore_index`` is -100 whether the model writes it or not),
    ``ignore_index=0`` of a pad label, a 0/1 mask input ``keep != 0``. Drawn uniformly, an
    input would hold the constant rarely or never, every token count would be the full one,
    and a plan dividing each rank's loss by its own count could not be told from one
    dividing by the step's: a model need not declare ``masked_inputs()`` for its masked
    positions to be exercised. An input tested against several constants (torch's -100 and
    a pad label of the model's own) is masked with each, in the order the step tests them.
    An ordering (``labels >= 0``, ``0 <= labels``, ``labels < 0``) whose outcome is the
    same for every drawn value masks with the value next to its constant that has the other
    outcome (-1 for ``labels >= 0``: unread, a model counting ``labels >= 0`` tokens had
    every token counted, and a plan dividing by its ranks' own counts was verified). An
    ordering whose constant lies inside the drawn range already has both outcomes."""
    data = {g.name for g in program.inputs if g.kind == "data" and g.type.dtype in INT_DTYPES}
    found: dict[str, tuple[int, ...]] = {}
    table = dict(program.graphs)
    for call in program.calls:
        graph = table[call.graph]
        of: dict[int, str] = {i: arg for i, arg in enumerate(call.args) if arg in data}
        constants: dict[int, int] = {}
        for k, node in enumerate(graph.nodes):
            value = len(graph.inputs) + k
            attrs = node.attr_map()
            if _carries(node) and node.inputs[0] in of:
                of[value] = of[node.inputs[0]]
            elif node.op == "full" and not node.shape and node.dtype in INT_DTYPES:
                constants[value] = int(attrs["value"])
            elif node.op == "convert" and attrs.get("dtype") == "bool" and \
                    node.inputs[0] in of and 0 not in found.get(of[node.inputs[0]], ()):
                # `m.bool()`: a test against 0 as `m != 0` is
                found[of[node.inputs[0]]] = found.get(of[node.inputs[0]], ()) + (0,)
            elif node.op in ("ne", "eq", *ORDERINGS) and len(node.inputs) == 2 and \
                    node.origin.phase == "forward":  # the model's own test, not autograd's
                # (the embedding's backward tests its indices against padding_idx -1)
                a, b = node.inputs
                for x, c, op in ((a, b, node.op), (b, a, FLIPPED.get(node.op, node.op))):
                    if x not in of or c not in constants:
                        continue
                    drawn = high if isinstance(high, int) else high.get(of[x], 2)
                    value = constants[c] if op in ("ne", "eq") else \
                        _other_outcome(op, constants[c], drawn)
                    if value is not None and value not in found.get(of[x], ()):
                        found[of[x]] = found.get(of[x], ()) + (value,)
    return found


#: ``x op c`` of an ordering, and ``c op x`` written as ``x FLIPPED[op] c``
ORDERINGS = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}
FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _other_outcome(op: str, c: int, high: int) -> int | None:
    """A value next to ``c`` outside the drawn range ``[0, high)`` for which ``x op c`` has
    the outcome no drawn value has; ``None`` when the drawn values have both."""
    test = ORDERINGS[op]
    drawn = bool(test(0, c))
    if drawn != bool(test(high - 1, c)):
        return None
    return next((v for v in (c, c - 1, c + 1)
                 if not 0 <= v < high and bool(test(v, c)) != drawn), None)


def mask_rows(ids: np.ndarray, values: tuple[int, ...], high: int) -> np.ndarray:
    """Masked entries at position ``k`` of every row but the first for the ``k``-th masking
    value (a 1-D input: its entry ``k``; positions past the last one share it), nothing
    else: an entry drawn equal to a masking value inside the drawn range ``[0, high)`` is
    moved off it. No row is masked whole while a row has more positions than values (every
    row counts), and any split of the rows or of the positions into equal contiguous blocks
    (data axes, microbatches, context parallelism; Rule 4.1) gives blocks of different
    token counts for each value: the block holding row 0 counts one more token per
    row-block than the others, the block holding the value's position fewer. Drawn at
    random (30% of the entries, before) the counts of a shrunk step's blocks came out equal
    about one seed in four, and a plan dividing each rank's loss by its own count was then
    verified; so was one whose pad label (0, inside the range) was masked only where the
    uniform draw hit it."""
    out = ids.copy()
    for value in values:
        if 0 <= value < high and high >= 2:
            moved = (value + 1) % high
            while moved in values and moved != value:
                moved = (moved + 1) % high
            out[out == value] = moved
    if out.ndim == 1:
        for k, value in enumerate(values):
            if out.size >= 2:
                out[min(k, out.size - 2)] = value
        return out
    if out.shape[-1] >= 2:
        rows = out.reshape(-1, out.shape[-1])
        for k, value in enumerate(values):
            rows[1:, min(k, out.shape[-1] - 2)] = value
    return out


def mask_at_random(ids: np.ndarray, values: tuple[int, ...], rng: np.random.Generator
                   ) -> np.ndarray:
    """``ids`` with half its entries, at random, set to one of the masking ``values`` (the
    second draw's masks, ``COUNT_DRAW``: every block counts a different number of tokens
    wherever it has a few)."""
    hit = rng.random(ids.shape) < 0.5
    return np.where(hit, rng.choice(np.asarray(values), size=ids.shape), ids)


def draw_bool(shape: tuple[int, ...]) -> np.ndarray:
    """A boolean input (a mask the model counts or selects with): true but where
    ``mask_rows`` masks, so every split of its rows or positions into equal contiguous blocks
    holds a different number of true entries. (Drawn as floats, every entry was nonzero:
    the model failed on a float condition, or a count was the full one everywhere.)"""
    return mask_rows(np.ones(shape, dtype=np.int64), (0,), 2).astype(bool)


def model_vocab(model: torch.nn.Module) -> int | None:
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            return module.num_embeddings
    return None




def reference_points(program: ParallelProgram) -> list[str]:
    """The marked points whose reference values the checks read: every lineage's point and
    every claim on a computed tensor (not ``loss``, not ``grad(...)``). Trace the spec with
    them (``trace_training_step(..., points=...)``)."""
    points = {lin.point for lin in program.lineages}
    points |= {claim.target for claim in program.claims}
    return sorted(p for p in points if p != "loss" and not p.startswith("grad("))


class Roundoff:
    """How far float64 round-off alone moves each output of the reference step: its float64
    outputs ``want`` against the same program evaluated in extended precision (``precise``,
    ``ir.interp.EXTENDED``), computed the first time a comparison asks.

    A deep model at shrunk widths can be ill-conditioned (DeepSeek-V3 671B at ``hidden`` 2
    through 61 layers: gradients near 1e4 from inputs near 1, whose float64 evaluations in two
    orders differ by a relative 2e-9). A difference between ``TOLERANCE`` and ``MARGINAL`` is
    then put down to round-off only where the reference's own float64 error in that tensor,
    times ``ROUNDOFF_FACTOR``, reaches it; a wrong constant (an epsilon off by 1e-6) moves
    the float64 and extended evaluations alike and is not excused."""

    def __init__(self, want: Mapping[str, Any], precise: Any) -> None:
        self.want = want
        self._precise = precise
        self._values: Mapping[str, Any] | None = None
        self._errors: dict[tuple[str, float], float] = {}
        self.excused = 0.0

    def error(self, tensor: str, floor: float) -> float:
        """The reference's own relative float64 error in ``tensor`` (scaled as the comparison
        scales: by its largest entry, at least ``floor``); the largest of all tensors when the
        comparison's name is none of the reference's outputs."""
        if (tensor, floor) not in self._errors:
            self._errors[tensor, floor] = self._error(tensor, floor)
        return self._errors[tensor, floor]

    def _error(self, tensor: str, floor: float) -> float:
        if self._values is None:
            self._values = self._precise()
        values = self._values
        for key in (tensor, POINT + tensor, tensor.partition(" ")[0]):
            if key in values and key in self.want:
                return _own_error(self.want[key], values[key], floor)
        return max((_own_error(self.want[k], v, floor) for k, v in values.items()
                    if k in self.want), default=0.0)

    def explains(self, error: float, tensor: str, floor: float) -> bool:
        """Whether round-off explains a relative ``error`` of ``tensor`` (below ``MARGINAL``,
        within ``ROUNDOFF_FACTOR`` times the reference's own); records the largest excused."""
        if not TOLERANCE <= error < MARGINAL:
            return False
        if error > ROUNDOFF_FACTOR * self.error(tensor, floor):
            return False
        self.excused = max(self.excused, error)
        return True


def _own_error(want: Any, precise: Any, floor: float) -> float:
    """``rel_error`` of a float64 value against its extended-precision evaluation."""
    precise = np.asarray(precise)
    if precise.dtype.kind != "f" or not np.all(np.isfinite(precise)):
        return 0.0
    return rel_error(want, precise.astype(np.float64), floor)


class Float64:
    """Float64 values agree when their relative error is below ``TOLERANCE``, relative to the
    larger of the expected tensor's largest entry and ``floor``, or when ``roundoff`` says the
    reference's own float64 round-off explains it."""

    def __init__(self, floor: float, roundoff: Roundoff | None = None) -> None:
        self.floor = floor
        self.roundoff = roundoff

    def equal(self, got: Any, want: Any, where: Comparison) -> tuple[bool, float]:
        err = rel_error(got, want, self.floor)
        if err < TOLERANCE:
            return True, err
        return (self.roundoff is not None and
                self.roundoff.explains(err, where.tensor, self.floor)), err


def recipe(program: ParallelProgram, reference_opt: optim.Recipe | None) -> Recipe:
    """What the checks need to know of the optimizer recipes (``ir.compare.Recipe``)."""
    opt = program.optimizer
    if opt is None or reference_opt is None:
        return Recipe(reference_opt is not None)
    clip = program.clip.max_norm if program.clip is not None else None
    if isinstance(reference_opt, optim.Groups) or \
            any(u.group.span is not None for u in opt.updates):
        return _group_recipe(opt, reference_opt, clip)
    mine = optim.optimizer_config(opt.kind, dict(opt.hyper), clip)
    problem = None if mine == reference_opt else (
        f"the plan's optimizer {_describe_opt(mine)} differs from the spec's "
        f"{_describe_opt(reference_opt)}")
    # an override that changes anything is a difference from the spec on its ranks (§6.4),
    # however small its effect on the drawn values
    overrides = []
    for index, override in enumerate(opt.overrides):
        theirs = optim.optimizer_config(opt.kind, {**dict(opt.hyper), **dict(override.hyper)},
                                        clip)
        if theirs != reference_opt:
            overrides.append((index, f"the override's optimizer {_describe_opt(theirs)} "
                                     f"differs from the spec's {_describe_opt(reference_opt)}"))
    return Recipe(True, problem, tuple(overrides))


def _group_recipe(opt: Any, reference: optim.Recipe, clip: Any) -> Recipe:
    """The recipe check where a side has parameter groups (§6.5): each parameter's update
    against the reference's for that parameter, reported at the statement that chose the
    plan's (its group, or the optimizer), with the parameters it concerns."""
    differs: dict[tuple[Any, str], list[str]] = {}
    for u in opt.updates:
        mine = optim.optimizer_config(opt.kind, dict(u.hyper), clip)
        theirs = optim.config_of(reference, u.param)
        if mine != theirs:
            where = u.group.span if u.group.span is not None else opt.origin.span
            text = f"the plan's optimizer {_describe_opt(mine)} differs from the spec's " \
                   f"{_describe_opt(theirs)}"
            differs.setdefault((where, text), []).append(u.param)
    problems = tuple((where, f"{_params_text(params)}: {text}")
                     for (where, text), params in differs.items())
    overrides = []
    for index, override in enumerate(opt.overrides):
        for u in opt.updates:
            theirs = optim.optimizer_config(opt.kind, {**dict(u.hyper), **dict(override.hyper)},
                                            clip)
            want = optim.config_of(reference, u.param)
            if theirs != want:
                overrides.append((index, f"{u.param}: the override's optimizer "
                                         f"{_describe_opt(theirs)} differs from the spec's "
                                         f"{_describe_opt(want)}"))
                break
    return Recipe(True, None, tuple(overrides), problems)


def _params_text(params: list[str]) -> str:
    shown = ", ".join(params[:3])
    more = f" and {len(params) - 3} more" if len(params) > 3 else ""
    return f"the update of {shown}{more}"


def _describe_opt(opt: optim.Optimizer) -> str:
    import dataclasses

    fields = [f"{f.name}={getattr(opt, f.name)}" for f in dataclasses.fields(opt)
              if f.name != "step"]
    return f"{type(opt).__name__}({', '.join(fields)})"


def final_outputs(want: Mapping[str, Any]) -> dict[str, Any]:
    """The reference step's outputs without its values at marked points."""
    return {k: v for k, v in want.items() if not k.startswith(POINT)}


def compare_programs(program: ParallelProgram, want: dict[str, np.ndarray],
                     values: Mapping[str, np.ndarray], reference_opt: optim.Optimizer | None,
                     roundoff: Roundoff | None = None) -> SimulationResult:
    """Evaluate the parallel program on ``values`` and run ``CHECKS`` against the reference
    step's outputs ``want`` on the same values (its ``point:`` outputs are the values at
    marked points). ``roundoff``: the reference's own float64 round-off (``Roundoff``)."""
    got = evaluate_parallel(program, values)
    final = final_outputs(want)
    magnitude = max((float(np.max(np.abs(v))) for v in final.values()
                     if np.size(v) and np.all(np.isfinite(v))), default=1.0)
    pair = run_checks(Pair(program, final, point_values(want), got,
                           recipe(program, reference_opt),
                           Float64(FLOOR * magnitude, roundoff)))
    result = SimulationResult(program.name, pair.mesh.world_size, pair.worst, pair.compared,
                              pair.mismatches)
    result.roundoff = roundoff.excused if roundoff is not None else 0.0
    result.lineage_mismatches = pair.lineage_mismatches
    if result.first is not None:
        from trainverify_dsl.ir.reading import read

        result.reading = read(pair, result.first)
    return result


def plan_states(program: ParallelProgram, values: dict[str, np.ndarray],
                rng: np.random.Generator) -> None:
    """Random optimizer states the plan's optimizer reads and the reference has none of (its
    recipe differs: the recipe check reports it; the update still runs)."""
    if program.optimizer is None:
        return
    for u in program.optimizer.updates:
        for s in u.states:
            name = f"{s}({u.param})"
            if name not in values:
                shape = values[u.param].shape
                values[name] = rng.uniform(0.1, 1.0, size=shape) if s == "v" else \
                    rng.normal(0.0, 0.5, size=shape)
