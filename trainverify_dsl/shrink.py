"""Small model sizes for simulating a full-size plan, keeping its mesh and every divisibility
it has (docs/semantics.md, "Shrinking for simulation").

The rule works on **widths**: the model's independent integer sizes (config fields, with the
derived ones of ``DERIVED`` rewritten as products of independent ones, plus ``batch`` and
``seq``). Every tensor dimension the plan can split is a product of widths (a monomial).

1. **Which widths feed which split.** The model is built on fake tensors with every width set
   to a distinct large prime (a *probe*); the exponent of a width in a dimension is then the
   multiplicity of its prime in the dimension's size. The plan is bound to the probe model
   (``bind_plan``): each parameter and input dimension split over mesh axes, each module
   boundary a collective splits or gathers along a dimension (shapes from one fake forward),
   and each parameter's ZeRO block (Rule 6.1) is a *divisibility*: a monomial and the product
   ``N`` of the axis sizes (times the microbatches on an input's batch dimension, times 2 on
   a dimension split in zigzag order: two chunks per block) that must divide it.
2. **How much of each width to keep.** Let ``A(w)`` be every axis that splits any dimension
   fed by width ``w`` (and ``@mb`` when ``w`` feeds a batch dimension, ``@zigzag`` of size 2
   when it feeds a dimension split in zigzag order); for every prime ``p``
   of ``N(w) = prod A(w)`` the shrunk width keeps ``min(v_p(w), v_p(N(w)))`` factors ``p``.
   Because every width of a split dimension keeps enough, every sub-product keeps enough too,
   so a reshape of that dimension into heads divides as it does at full size. A dimension made
   only of a shipped model's nested widths (``nesting``: laid out outer-major) is reshaped
   onto its outer prefix only: there ``A(w)`` counts the split for the shortest outer prefix
   whose full-size product it divides (``split_members``). ZeRO blocks are
   the exception (only the whole dimension 0 is cut into blocks): a ZeRO divisibility that the
   widths do not meet yet gets the missing factors from the width with the most to spare.
   A dimension's factor that is no width (a count a shipped model keeps, laid out outside
   its widths: ``Divisibility.constant``) is the same at every size: the axes it divides are
   taken off that dimension's ``A(w)``, and it counts towards a ZeRO block's product.
3. **Minimum sizes and ratios.** A width that is at least 2 stays at least 2 (the shape
   reduction theorem needs computing dimensions >= 2), multiplying by the least number that
   gives no mesh prime more factors than the full-size width has, so no divisibility appears
   that the full-size width lacks; ratios
   the model relies on (``head_dim = hidden / n_heads``, the grouped-query ratio
   ``n_heads / n_kv_heads``, experts per routing group) are independent widths themselves, so
   they keep their mesh factors and stay >= 2 when they were. A shrunk width never exceeds the
   full-size one.

So a divisibility over the mesh's primes holds shrunk exactly when it holds at full size;
axis and input names mean nothing. The one per-model table, ``DERIVED`` (with ``KEPT`` and
``AT_LEAST``), is data: which config fields are products of others, which are counts that
must not change (layer counts, routing top-k) and model-intrinsic lower bounds.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from trainverify_dsl.plan.model import PIPELINE_AXIS, ZIGZAG, Plan

#: Widths at or below this are simulated as they are (unless shrinking is forced).
SMALL = 128
#: Spec-line settings that are not model config fields.
NOT_CONFIG = ("config", "batch", "seq")
#: Counts kept by every model (pipeline stages and layouts name layer indices).
#: Integer fields that are never widths: the layer count (structure) and the label a loss
#: ignores (a value the labels are compared with, not a size: shrunk like a width it became 3
#: beside a vocabulary of 2).
KEPT_ALWAYS = ("n_layers", "ignore_index")

#: Per shipped model class (the config's ``model``): config fields that are products of other
#: widths, in the order to rebuild them; the new independent width is named after the
#: quotient. A class not listed (a user's model) has no field shrunk (``shrink_plan``).
#: ``(field, (outer factor, new inner width))``: ``field = outer * inner``.
DERIVED: dict[str, tuple[tuple[str, tuple[str, str]], ...]] = {
    "Llama": (("n_heads", ("n_kv_heads", "kv_group")), ("hidden", ("n_heads", "head_dim"))),
    "GPT2": (("hidden", ("n_heads", "head_dim")),),
    "DeepSeekV3": (("n_routed_experts", ("n_group", "experts_per_group")),),
    "MLP": (),  # every field independent
}
#: Counts that are not shrunk (structure, routing top-k, RoPE scaling constants).
KEPT: dict[str, tuple[str, ...]] = {
    "Llama": ("rope_original_max_seq_len",),
    "DeepSeekV3": ("n_dense_layers", "n_group", "topk_group", "n_activated_experts",
                   "n_shared_experts"),
}
#: Model-intrinsic bounds on the shrunk widths: (width, multiple it keeps, least value).
AT_LEAST: dict[str, tuple[tuple[str, int, Callable[[Mapping[str, Any]], int]], ...]] = {
    "Llama": (("head_dim", 2, lambda c: 2),),  # RoPE rotates pairs
    "DeepSeekV3": (("qk_rope_head_dim", 2, lambda c: 2),
                   ("experts_per_group", 1,
                    lambda c: max(2, -(-c["n_activated_experts"] // c["topk_group"])))),
}
#: Per shipped model class: widths laid out outside every other factor of any dimension they
#: are part of, sums of widths included (DeepSeek-V3's attention: ``split_heads`` and
#: ``merge_heads`` of ``stdlib/models/common.py`` put the heads outermost in the rows of
#: ``wq``/``wq_b`` and ``wkv_b``, ``n_heads * (qk_nope_head_dim + ...)``, and the columns of
#: ``wo``, ``n_heads * v_head_dim``). A split the heads take whole leaves the head dims uncut.
OUTERMOST: dict[str, tuple[str, ...]] = {
    "DeepSeekV3": ("n_heads",),
}
#: Probe primes start here; no mesh factor or model constant is that large.
PROBE_FLOOR = 101
#: Sums of at most this many widths, times a constant up to ``SUM_SCALES``, are recognised in
#: a dimension; constants of the model in a dimension must stay below ``PROBE_FLOOR``.
SUM_TERMS = 3
SUM_SCALES = 8
#: ``max_seq_len`` follows the shrunk sequence (RoPE tables and position embeddings).
SEQ_BOUND = "max_seq_len"
#: The pseudo-axis of a zigzag split's two chunks per block (docs/semantics.md §2.6).
ZIGZAG_CHUNKS = "@zigzag"


class ShrinkError(ValueError):
    """The model cannot be probed (its constructor rejects independent widths)."""


@dataclass(frozen=True, slots=True)
class Divisibility:
    """The product of ``widths`` (each with its exponent) must be divisible by the sizes of
    ``axes`` (mesh axes, and ``@mb`` for the microbatches of a batch dimension)."""

    widths: tuple[tuple[str, int], ...]
    axes: tuple[tuple[str, int], ...]
    #: factors that are sums of widths (each summand must keep the factors: a sum of
    #: multiples of ``n`` is one)
    sums: tuple[tuple[str, ...], ...] = ()
    #: a ZeRO block: only the whole product is cut, never a sub-product
    whole: bool = False
    #: what the divisibility comes from, for messages and tests
    source: str = ""
    #: a factor of the dimension that is no width: a count the model keeps (DeepSeek-V3's
    #: ``n_group``, the 8 of its 8 x ``experts_per_group`` experts), the same at every size
    constant: int = 1

    def members(self) -> tuple[str, ...]:
        return tuple(w for w, _ in self.widths) + tuple(w for s in self.sums for w in s)

    @property
    def n(self) -> int:
        return math.prod(n for _, n in self.axes)

    def uncredited(self) -> tuple[tuple[str, int], ...]:
        """The axes the widths must supply: without the largest set of axes whose product
        divides ``constant`` (the constant holds their factors at every size). An axis the
        constant divides only in part stays (its widths keep its factors, more than needed)."""
        if self.constant == 1:
            return self.axes
        best: tuple[int, tuple[int, ...]] = (1, ())
        for count in range(1, len(self.axes) + 1):
            for chosen in itertools.combinations(range(len(self.axes)), count):
                n = math.prod(self.axes[i][1] for i in chosen)
                if self.constant % n == 0 and n > best[0]:
                    best = (n, chosen)
        return tuple(a for i, a in enumerate(self.axes) if i not in best[1])


def _primes(n: int) -> Iterator[int]:
    p = 2
    while p * p <= n:
        if n % p == 0:
            yield p
            while n % p == 0:
                n //= p
        p += 1
    if n > 1:
        yield n


def _valuation(n: int, p: int) -> int:
    k = 0
    while n and n % p == 0:
        n //= p
        k += 1
    return k


# -- widths ---------------------------------------------------------------------------------


def independent_widths(config: Mapping[str, Any], model: str, batch: int, seq: int
                       ) -> dict[str, int]:
    """The model's independent widths at full size (``DERIVED`` fields replaced by their
    inner factor), with ``batch`` and ``seq``."""
    kept = set(KEPT_ALWAYS) | set(KEPT.get(model, ())) | {SEQ_BOUND}
    widths = {k: v for k, v in config.items() if type(v) is int and k not in kept}
    for field, (outer, inner) in DERIVED.get(model, ()):
        if field in widths and outer in config and config[outer]:
            widths[inner] = config[field] // config[outer]
            del widths[field]
    return {**widths, "batch": batch, "seq": seq}


def config_values(widths: Mapping[str, int], config: Mapping[str, Any], model: str
                  ) -> dict[str, Any]:
    """Config overrides for ``widths`` (derived fields rebuilt, ``max_seq_len`` = seq)."""
    values = {k: v for k, v in widths.items() if k not in ("batch", "seq")}
    for field, (outer, inner) in DERIVED.get(model, ()):
        if inner in values:
            values[field] = values.get(outer, config.get(outer)) * values.pop(inner)
    if SEQ_BOUND in config:
        values[SEQ_BOUND] = widths["seq"]
    return {k: v for k, v in values.items() if k in config or k in widths}


# -- the probe ------------------------------------------------------------------------------


def probe_primes(widths: Mapping[str, int], multiples: Mapping[str, int]) -> dict[str, int]:
    """A distinct prime >= ``PROBE_FLOOR`` per width above 1, chosen so that no sum of up to
    ``SUM_TERMS`` probe values (prime times the width's multiple) is divisible by another
    probe prime or made of small primes only: a dimension's factors and sums then read back
    without coincidences (``monomial``)."""
    return dict(_probe_primes(tuple(sorted(w for w in widths if widths[w] > 1)),
                              tuple(sorted(multiples.items()))))


@functools.lru_cache(maxsize=64)
def _probe_primes(names: tuple[str, ...], multiples: tuple[tuple[str, int], ...]
                  ) -> tuple[tuple[str, int], ...]:
    """``probe_primes`` of the widths ``names`` (a search of seconds for a large model,
    the same answer for the same arguments: remembered)."""
    out: dict[str, int] = {}
    candidate = PROBE_FLOOR
    for name in names:
        while not (_is_prime(candidate) and
                   _no_coincidence({**out, name: candidate}, dict(multiples))):
            candidate += 2
        out[name] = candidate
        candidate += 2
    return tuple(out.items())


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


def _no_coincidence(primes: Mapping[str, int], multiples: Mapping[str, int]) -> bool:
    """No sum of 2..``SUM_TERMS`` probe values is divisible by a probe prime, and no two such
    sums (times a constant up to ``SUM_SCALES``) are equal."""
    values = {w: q * multiples.get(w, 1) for w, q in primes.items()}
    seen: set[int] = set()
    for count in range(2, SUM_TERMS + 1):
        for group in itertools.combinations(sorted(values), count):
            total = sum(values[w] for w in group)
            if any(total % q == 0 for q in primes.values()):
                return False
            scaled = {total * k for k in range(1, SUM_SCALES + 1)}
            if scaled & seen:
                return False
            seen |= scaled
    return True


def monomial(size: int, probe: Mapping[str, int], primes: Mapping[str, int],
             constants: bool = False
             ) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, ...], ...], int]:
    """The widths (with exponents) a probe dimension of ``size`` is the product of, the
    sums of widths among its factors (DeepSeek's ``qk_nope_head_dim + qk_rope_head_dim``),
    and its constant factor (``Divisibility.constant``; 1 when there is a sum, or when the
    dimension holds a width without the multiple it is built with, as ``head_dim / 2``).
    ``probe``: the probe value of each width, ``primes``: its probe prime. ``constants``:
    the model has config fields kept at their values (a user's model, ``_width_fields``),
    so a factor that is no width nor sum of widths is one of those constants."""
    factors = tuple((w, _valuation(size, q)) for w, q in sorted(primes.items())
                    if size % q == 0)
    rest = size // math.prod(primes[w] ** e for w, e in factors)
    # the widths' own multiples (a probe ``head_dim`` is twice its prime) are no constant:
    # the shrunk width supplies them itself, so only what is left beside them is credited
    built = math.prod(probe[w] ** e for w, e in factors)
    constant = size // built if size % built == 0 else 1
    if rest < PROBE_FLOOR:  # a constant of the model (a top-k, a pair of RoPE halves)
        return factors, (), constant
    for scale in range(1, SUM_SCALES + 1):
        if rest % scale == 0:
            found = _summands(rest // scale, {w: probe[w] for w in primes})
            if found:
                return factors, (found,), 1
    if constants:
        return factors, (), constant
    raise ShrinkError(f"a dimension of size {size} at probe widths {dict(probe)} is neither a "
                      "product nor a sum of widths")


def _summands(total: int, probe: Mapping[str, int]) -> tuple[str, ...] | None:
    names = sorted(w for w, v in probe.items() if v >= PROBE_FLOOR)  # the probed widths
    for count in range(2, min(len(names), SUM_TERMS) + 1):
        for group in itertools.combinations(names, count):
            if sum(probe[w] for w in group) == total:
                return group
    return None


# -- the rule -------------------------------------------------------------------------------


def nesting(model: str) -> tuple[tuple[str, ...], ...]:
    """The model's nested widths, outermost first, from ``DERIVED`` (Llama: ``n_kv_heads``,
    ``kv_group``, ``head_dim``, as ``hidden = n_heads * head_dim`` and ``n_heads = n_kv_heads
    * kv_group``): a dimension that is a product of some of them is laid out outer-major
    (the shipped models' ``split_heads``, ``merge_heads``, ``repeat_kv``)."""
    expansion: dict[str, tuple[str, ...]] = {}
    for field, (outer, inner) in DERIVED.get(model, ()):
        expansion[field] = expansion.get(outer, (outer,)) + (inner,)
    return tuple(expansion.values())


def outermost(model: str) -> tuple[str, ...]:
    """The model's widths laid out outside every other factor of any dimension they are part
    of (``OUTERMOST``)."""
    return OUTERMOST.get(model, ())


def split_members(rule: Divisibility, widths: Mapping[str, int],
                  chains: Sequence[tuple[str, ...]] = (),
                  outer: Sequence[str] = ()) -> tuple[str, ...]:
    """The widths a split reaches: every member of its dimension, except for a dimension made
    of nested widths only (each once, ``nesting``), or one holding an ``outer`` width
    (``outermost``), which is laid out outer-major: there the split falls on the shortest
    outer prefix whose full-size product it divides, and the inner widths are not cut at
    full size, nor shrunk, where the prefix keeps the factors."""
    members = rule.members()
    n = math.prod(size for _, size in rule.uncredited())
    first = next((w for w in outer if (w, 1) in rule.widths), None)
    if first is not None and len(members) > 1 and widths[first] % n == 0:
        return (first,)
    if rule.sums or len(members) < 2 or any(e != 1 for _, e in rule.widths):
        return members
    chain = next((c for c in chains if set(members) <= set(c)), None)
    if chain is None:
        return members
    ordered = sorted(members, key=chain.index)
    for j in range(1, len(ordered) + 1):
        if math.prod(widths[w] for w in ordered[:j]) % n == 0:
            return tuple(ordered[:j])
    return members


def keep_exponents(widths: Mapping[str, int], rules: list[Divisibility],
                   multiples: Mapping[str, int],
                   chains: Sequence[tuple[str, ...]] = (),
                   outer: Sequence[str] = ()) -> dict[str, dict[int, int]]:
    """Per width and mesh prime, how many factors the shrunk width keeps (step 2 of the
    module docstring, with the model's own multiples), before the minimum sizes.
    ``chains``: the model's nested widths (``nesting``), ``outer``: its ``outermost``."""
    primes = mesh_primes(rules, multiples)
    axes_of: dict[str, dict[str, int]] = {w: {} for w in widths}
    for rule in rules:
        if not rule.whole:
            for w in split_members(rule, widths, chains, outer):
                axes_of[w].update(rule.uncredited())
    keep = {w: {p: min(_valuation(widths[w], p),
                       sum(_valuation(n, p) for n in axes_of[w].values()))
                for p in primes} for w in widths}
    for w, m in multiples.items():
        if w in keep:
            for p in _primes(m):
                keep[w][p] = max(keep[w][p], min(_valuation(widths[w], p), _valuation(m, p)))
    for rule in rules:
        if rule.whole:
            _top_up(rule, widths, keep)
    return keep


def mesh_primes(rules: list[Divisibility], multiples: Mapping[str, int]) -> list[int]:
    return sorted({p for r in rules for p in _primes(r.n)} |
                  {p for m in multiples.values() for p in _primes(m)})


def _top_up(rule: Divisibility, widths: Mapping[str, int],
            keep: dict[str, dict[int, int]]) -> None:
    """Give a ZeRO divisibility its missing factors from the width with the most to spare
    (a sum only when no product width has any: its summands with the fewest grow)."""
    for p in _primes(rule.n):
        while _kept(rule, keep, p) < _valuation(rule.n, p):
            spare = [(_valuation(widths[w], p) - keep[w][p], w) for w, _ in rule.widths
                     if _valuation(widths[w], p) > keep[w][p]]
            if spare:
                keep[max(spare)[1]][p] += 1
                continue
            grown = next((s for s in rule.sums if _lowest_can_grow(s, widths, keep, p)), None)
            if grown is None:
                return  # the full-size plan lacks it too (reported by the full-size pass)
            lowest = min(keep[w][p] for w in grown)
            for w in grown:
                if keep[w][p] == lowest:
                    keep[w][p] += 1


def _lowest_can_grow(summands: tuple[str, ...], widths: Mapping[str, int],
                     keep: Mapping[str, Mapping[int, int]], p: int) -> bool:
    """The summands holding the fewest factors ``p`` (they bound the sum's) all have more."""
    lowest = min(keep[w][p] for w in summands)
    return all(_valuation(widths[w], p) > lowest for w in summands if keep[w][p] == lowest)


def _kept(rule: Divisibility, keep: Mapping[str, Mapping[int, int]], p: int) -> int:
    """A lower bound of ``v_p`` of the rule's shrunk product."""
    return sum(e * keep[w][p] for w, e in rule.widths) + \
        sum(min(keep[w][p] for w in s) for s in rule.sums) + _valuation(rule.constant, p)


def shrink_widths(widths: Mapping[str, int], rules: list[Divisibility],
                  multiples: Mapping[str, int], least: Mapping[str, int],
                  chains: Sequence[tuple[str, ...]] = (),
                  outer: Sequence[str] = ()) -> dict[str, int]:
    """The shrunk value of every width (the rule of the module docstring); ``chains``: the
    model's nested widths (``nesting``), ``outer``: its ``outermost``."""
    keep = keep_exponents(widths, rules, multiples, chains, outer)
    primes = mesh_primes(rules, multiples)
    out = {}
    for w, full in widths.items():
        base = math.prod(p ** e for p, e in keep[w].items())
        lowest = least.get(w, 2 if full >= 2 else full)
        k = 1
        while base * k < lowest or any(_valuation(k, p) > _valuation(full, p) - keep[w][p]
                                       for p in primes):
            k += 1
        out[w] = min(full, base * k)
    _sums_divide(out, widths, rules, keep, primes)
    return out


def _product(rule: Divisibility, values: Mapping[str, int]) -> int:
    """The rule's dimension at ``values`` (its sums' constant scales left out)."""
    return math.prod(values[w] ** e for w, e in rule.widths) * \
        math.prod(sum(values[w] for w in s) for s in rule.sums) * rule.constant


#: how many values of each summand ``_sums_divide`` tries (the least ones allowed)
SUM_CANDIDATES = 12


def _sums_divide(out: dict[str, int], widths: Mapping[str, int], rules: list[Divisibility],
                 keep: Mapping[str, Mapping[int, int]], primes: list[int]) -> None:
    """A split of a sum of widths that divides only through the sum (DeepSeek's ``wkv_a``
    rows, 512 + 64, over 3: neither summand has the factor, so each keeps none and the shrunk
    sum 2 + 2 does not divide). Its summands take the least values, each a multiple of what it
    keeps, at most its full size and with no mesh prime more often than there, whose sum
    divides again while every rule that held still holds. A rule the full-size widths do not
    meet either is left (the full-size pass reports it)."""
    for rule in rules:
        if not rule.sums or _product(rule, out) % rule.n == 0 or \
                _product(rule, widths) % rule.n:
            continue
        held = [r for r in rules if _product(r, out) % r.n == 0]
        best: tuple[int, dict[str, int]] | None = None
        for summands in rule.sums:
            options = [_summand_values(w, out[w], widths[w], keep[w], primes)
                       for w in summands]
            for values in itertools.product(*options):
                trial = {**out, **dict(zip(summands, values, strict=True))}
                if _product(rule, trial) % rule.n == 0 and \
                        all(_product(r, trial) % r.n == 0 for r in held) and \
                        (best is None or sum(values) < best[0]):
                    best = (sum(values), dict(zip(summands, values, strict=True)))
        if best is not None:
            out.update(best[1])


def _summand_values(w: str, least: int, full: int, keep: Mapping[int, int],
                    primes: list[int]) -> list[int]:
    """The values a summand may take from ``least`` up: multiples of what it keeps, with no
    mesh prime more often than in its full size, at most its full size."""
    base = math.prod(p ** e for p, e in keep.items())
    found, v = [], -(-least // base) * base
    while v <= full and len(found) < SUM_CANDIDATES:
        if all(_valuation(v, p) <= _valuation(full, p) for p in primes):
            found.append(v)
        v += base
    return found


# -- divisibilities of a plan ---------------------------------------------------------------


def plan_divisibilities(plan: Plan, binding: Any, points: Mapping[str, tuple[int, ...]],
                        probe: Mapping[str, int], primes: Mapping[str, int],
                        constants: bool = False) -> list[Divisibility]:
    """Every divisibility the plan imposes on the probe model ``binding`` is bound to (module
    docstring, step 1): split parameter and input dimensions, ZeRO blocks, and dimensions
    collectives split or gather at module boundaries (``points``: boundary -> probe shape)."""
    from trainverify_dsl.ir.layout import MICROBATCH_AXIS
    from trainverify_dsl.lower.bind import PLACEMENT_AXES
    from trainverify_dsl.lower.lowering import input_sizes

    sizes = input_sizes(plan)
    _rule = functools.partial(_divisibility, constants=constants)

    def axes(names: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
        return tuple((a, sizes[a]) for a in names
                     if a in sizes and a not in PLACEMENT_AXES and sizes[a] > 1)

    rules = []
    tensors = [(n, s, binding.param_layouts.get(n), False) for n, s in binding.params.items()]
    tensors += [(n, s, binding.data_layouts.get(n), n not in binding.unbatched)
                for n, s in binding.data.items()]
    for name, shape, layout, batch in tensors:
        for d, size in enumerate(shape):
            split = axes(layout.axes_of_dim(d)) if layout else ()
            if batch and d == 0 and sizes[MICROBATCH_AXIS] > 1:
                split = ((MICROBATCH_AXIS, sizes[MICROBATCH_AXIS]),) + split
            if split and layout is not None and layout.order_of_dim(d) == ZIGZAG:
                split = split + ((ZIGZAG_CHUNKS, 2),)  # two chunks per block (§2.6)
            if split:
                rules.append(_rule(size, split, probe, primes, source=f"{name} dimension {d}"))
    rules += _zero_blocks(plan, binding, axes, probe, primes, constants)
    rules += _gradient_scatters(binding, axes, probe, primes, constants)
    for point, statements in binding.point_collectives.items():
        shape = points.get(point)
        for st in statements:
            for d in (st.dim, st.split_dim, st.concat_dim):
                if shape is not None and d is not None and -len(shape) <= d < len(shape):
                    rules.append(_rule(shape[d], axes(st.axes), probe, primes,
                                       source=f"{st.kind} {point} dimension {d}"))
    for point, d, names, zigzag in algorithm_needs(binding):
        shape = points.get(point)
        if shape is not None and -len(shape) <= d < len(shape) and axes(names):
            chunks = ((ZIGZAG_CHUNKS, 2),) if zigzag else ()
            rules.append(_rule(shape[d], axes(names) + chunks, probe, primes,
                               source=f"algorithm at {point} dimension {d}"))
    return [r for r in rules if r.axes and r.members()]


def algorithm_needs(binding: Any) -> list[tuple[str, int, tuple[str, ...], bool]]:
    """What the plan's algorithms need divided (``lower.algorithms.Algorithm.needs``)."""
    from trainverify_dsl.lower.algorithms import ALGORITHMS

    out = []
    for statement, paths in binding.algorithms:
        definition = ALGORITHMS.get(statement.name)
        if definition is None:
            continue
        for module in paths:
            out += definition.needs(statement, module)
    return out


def _divisibility(size: int, axes: tuple[tuple[str, int], ...], probe: Mapping[str, int],
                  primes: Mapping[str, int], *, source: str, whole: bool = False,
                  constants: bool = False) -> Divisibility:
    factors, sums, constant = monomial(size, probe, primes, constants)
    return Divisibility(factors, axes, sums, whole, source, constant)


def _zero_blocks(plan: Plan, binding: Any, axes: Callable[[tuple[str, ...]], Any],
                 probe: Mapping[str, int], primes: Mapping[str, int], constants: bool
                 ) -> list[Divisibility]:
    """Rule 6.1: each parameter's dimension 0 is cut into its own split times the ZeRO group."""
    if plan.optimizer is None or not axes(plan.optimizer.shard_axes):
        return []
    group = axes(plan.optimizer.shard_axes)
    rules = []
    for name, shape in binding.params.items():
        layout = binding.param_layouts.get(name)
        own = axes(layout.axes_of_dim(0)) if layout else ()
        if shape:
            rules.append(_divisibility(shape[0], own + group, probe, primes, whole=True,
                                       source=f"ZeRO block of {name}", constants=constants))
    return rules


def _gradient_scatters(binding: Any, axes: Callable[[tuple[str, ...]], Any],
                       probe: Mapping[str, int], primes: Mapping[str, int], constants: bool
                       ) -> list[Divisibility]:
    """Rule 2.1 for ``reduce-scatter grad(P) ... dim=d``: the parameter's dimension ``d`` is
    cut into its own split times the statement's group, as a ZeRO block is (with or
    without a sharded optimizer)."""
    rules = []
    for st, names in binding.grad_statements:
        if st.kind != "reduce-scatter" or not axes(st.axes):
            continue
        for name in names:
            shape = binding.params.get(name)
            d = st.dim if st.dim is not None else 0
            if not shape or not -len(shape) <= d < len(shape):
                continue
            layout = binding.param_layouts.get(name)
            own = axes(layout.axes_of_dim(d % len(shape))) if layout else ()
            rules.append(_divisibility(shape[d], own + axes(st.axes), probe, primes,
                                       whole=True,
                                       source=f"reduce-scatter of grad({name}) dimension {d}",
                                       constants=constants))
    return rules


#: The spec line's input sizes (``batch``, ``seq``): widths of every model, shrunk for a user's
#: model only when its class lists them in ``WIDTHS``.
INPUT_SIZES = ("batch", "seq")


def _width_fields(plan: Plan, config: dict[str, Any], shipped: bool, model_ref: Any
                  ) -> tuple[dict[str, Any], frozenset[str]]:
    """The config fields that are widths, and the input sizes kept at their values. A shipped
    model's (its file in the stdlib, however the path or config names it): every field, the
    tables saying which are products and counts, and ``batch`` and ``seq`` shrink. A model of
    the user's own: only the fields and input sizes its class lists in ``WIDTHS``
    (docs/models.md). Any other field may select code (``mode 3``) or be tied to another
    inside the model (``head_dim = hid // heads``), and the model may compare positions with
    a constant of its own (a sliding window of 2 is plain causal attention at ``seq`` 2):
    shrunk, it would prove another model, so it keeps its value."""
    from trainverify_dsl.spec.load import model_class

    if shipped:
        return config, frozenset()
    declared = getattr(model_class(_ref(plan, model_ref)), "WIDTHS", ())
    return ({k: v for k, v in config.items() if k in declared},
            frozenset(k for k in INPUT_SIZES if k not in declared))


def _ref(plan: Plan, model_ref: Any) -> Any:
    from trainverify_dsl.spec.load import ModelRef, resolve_ref

    assert plan.spec is not None
    return model_ref if isinstance(model_ref, ModelRef) else \
        resolve_ref(plan.spec.model, plan.spec.config)


def _shipped(plan: Plan, model: str, model_ref: Any) -> bool:
    """A model class of the stdlib's (its file there, however the path or config names it)
    with a row in ``DERIVED``: the tables describe it."""
    from trainverify_dsl.resources import RESOURCES

    return model in DERIVED and Path(_ref(plan, model_ref).file).resolve().is_relative_to(
        RESOURCES.stdlib_dir.resolve())


def point_shapes(model: Any, inputs: Mapping[str, Any], points: set[str]
                 ) -> dict[str, tuple[int, ...]]:
    """Shapes at module boundaries ``X.in`` / ``X.out``, from one fake forward with hooks."""
    import torch

    shapes: dict[str, tuple[int, ...]] = {}
    modules = dict(model.named_modules())
    handles = []
    for point in points:
        path, _, side = point.rpartition(".")
        module = modules.get(path)
        if module is None or not path:
            continue
        if side == "in":
            handles.append(module.register_forward_pre_hook(
                lambda _m, args, _p=point: _record(shapes, _p, args)))
        else:
            handles.append(module.register_forward_hook(
                lambda _m, _a, out, _p=point: _record(shapes, _p, (out,))))
    try:
        from trainverify_dsl.spec.trace import fake_mode_of

        mode = fake_mode_of(model)
        with mode, torch.no_grad():
            model(*[torch.zeros(tuple(s), dtype=d) for s, d in inputs.values()])
    finally:
        for handle in handles:
            handle.remove()
    return shapes


def _record(shapes: dict[str, tuple[int, ...]], point: str, values: tuple[Any, ...]) -> None:
    import torch

    first = next((v for v in values if isinstance(v, torch.Tensor)), None)
    if first is not None:
        shapes.setdefault(point, tuple(int(n) for n in first.shape))


# -- the plan's shrunk sizes ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shrunk:
    """Config overrides, batch and seq for the simulation, and the rule's evidence."""

    overrides: dict[str, Any]
    batch: int
    seq: int
    widths: dict[str, int]
    full: dict[str, int]
    rules: tuple[Divisibility, ...]


def _class_name(plan: Plan) -> str:
    assert plan.spec is not None
    return plan.spec.model.rpartition(":")[2]


def _config(plan: Plan, settings: Mapping[str, Any]) -> dict[str, Any]:
    from trainverify_dsl.spec.load import read_configs

    assert plan.spec is not None
    base = dict(read_configs().get(plan.spec.config or "", {})) if plan.spec.config else {}
    base.pop("model", None)
    base.pop("file", None)
    return {**base, **{k: v for k, v in settings.items() if k not in NOT_CONFIG}}


def needs_shrinking(plan: Plan, settings: Mapping[str, Any]) -> bool:
    assert plan.spec is not None
    config = _config(plan, settings)
    model = _class_name(plan)
    widths = independent_widths(config, model, plan.spec.batch or 1, plan.spec.seq or 1)
    return any(v > SMALL for k, v in widths.items() if k != "batch") or \
        widths["batch"] > 64


def shrink_plan(plan: Plan, settings: Mapping[str, Any], model_ref: Any = None) -> Shrunk:
    """The shrunk sizes of ``plan``'s model (the rule of the module docstring); ``model_ref``
    is the model file already located and allowed (``setup.locate_model``). Raises
    ``ShrinkError`` when the model cannot be probed, ``SpecError`` when it cannot be built."""
    from trainverify_dsl.lower.bind import bind_plan, resolve_indices
    from trainverify_dsl.lower.lowering import input_sizes
    from trainverify_dsl.report import codes_spec as codes
    from trainverify_dsl.spec.errors import SpecError
    from trainverify_dsl.spec.load import load_model, model_input_specs

    assert plan.spec is not None and plan.mesh is not None
    config, model = _config(plan, settings), _class_name(plan)
    shipped = _shipped(plan, model, model_ref)
    fields, kept = _width_fields(plan, config, shipped, model_ref)
    constants = bool(kept) or any(type(v) is int for k, v in config.items() if k not in fields)
    full = independent_widths(fields, model, plan.spec.batch or 1, plan.spec.seq or 1)
    if set(full) <= kept:  # a user's model that lists no widths: nothing is shrunk
        return Shrunk({}, full["batch"], full["seq"], full, dict(full), ())
    bounds = AT_LEAST.get(model, ())
    multiples = {w: m for w, m, _ in bounds if w in full}
    # a kept size is built at its own value, a constant of the probe model
    primes = probe_primes({w: v for w, v in full.items() if w not in kept}, multiples)
    probe = {w: primes[w] * multiples.get(w, 1) if w in primes else v for w, v in full.items()}
    try:
        fake = load_model(model_ref or plan.spec.model, plan.spec.config,
                          **{**settings, **config_values(probe, config, model)})
    except SpecError as error:
        if not any(d.code is codes.MODEL_LOAD_FAILED for d in error.diagnostics):
            raise  # the reference itself is wrong (no such file, class, config): not the probe
        raise ShrinkError(f"the model rejects independent widths {probe}: {error}") from None
    except Exception as error:  # noqa: BLE001 - the model's own check of its sizes
        raise ShrinkError(f"the model rejects independent widths {probe}: {error}") from None
    specs = dict(model_input_specs(fake, probe["batch"], probe["seq"]))
    plan = resolve_indices(plan, fake)  # as the lowering reads it
    binding = bind_plan(plan, fake, {k: tuple(s) for k, (s, _) in specs.items()},
                        input_sizes(plan))
    points = {p for p, sts in binding.point_collectives.items()
              if any(d is not None for st in sts for d in (st.dim, st.split_dim, st.concat_dim))}
    points |= {point for point, _, _, _ in algorithm_needs(binding)}
    shapes = point_shapes(fake, specs, points) if points else {}
    rules = plan_divisibilities(plan, binding, shapes, probe, primes, constants)
    if not shipped:  # how a user's model lays its kept counts out is unknown: no credit
        rules = [replace(r, constant=1) for r in rules]
    least = {w: lowest(config) for w, _, lowest in bounds if w in full}
    chains, outer = (nesting(model), outermost(model)) if shipped else ((), ())
    widths = {**shrink_widths(full, rules, multiples, least, chains, outer),
              **{w: full[w] for w in kept}}
    overrides = config_values(widths, config, model)
    return Shrunk({k: v for k, v in overrides.items() if config.get(k) != v},
                  widths["batch"], widths["seq"], widths, full, tuple(rules))


# -- idle axes (issue 13, item 2): a mesh axis that no statement uses (no split, partial,
# collective, ZeRO shard or algorithm names it, and it is not the pipeline axis of a plan with
# stages) leaves every rank along it computing exactly what its coordinate-0 rank computes; the
# simulation runs it at size 1 and says so. The full-size layout pass has run on the real sizes.


def used_axes(plan: Any) -> set[str]:
    """Every mesh axis some statement of ``plan`` names."""
    used: set[str] = set()
    for layout in plan.layouts:
        used.update(a for _, axes in layout.dim_axes for a in axes)
        used.update(layout.partial_axes)
    for st in plan.collectives:
        used.update(st.axes)
    for opt in (plan.optimizer, plan.spec_optimizer):
        if opt is not None:
            used.update(opt.shard_axes)
    for alg in plan.algorithms:
        used.update(alg.axes)
    for override in plan.overrides:  # ranks along it run another step
        used.update(a for a, _ in override.coords)
    clip = plan.clip_grad_norm
    if clip is not None and clip.replicas == "each":  # every copy counts in the norm
        used.update(clip.axes or (a.name for a in plan.mesh.axes))
    if plan.stages:
        used.add(PIPELINE_AXIS)
    return used


def idle_axes(plan: Any) -> dict[str, int]:
    """Mesh axes of size > 1 that no statement uses: ``{axis: its size}``."""
    used = used_axes(plan)
    return {a.name: a.size for a in plan.mesh.axes if a.size > 1 and a.name not in used}


def without_idle_axes(plan: Any) -> tuple[Any, dict[str, int]]:
    """``plan`` with its idle axes at size 1, and what they were."""
    idle = idle_axes(plan)
    if not idle:
        return plan, {}
    axes = tuple(replace(a, size=1) if a.name in idle else a for a in plan.mesh.axes)
    return replace(plan, mesh=replace(plan.mesh, axes=axes)), idle


# -- fewer microbatches (docs/checking.md, "Fewer microbatches"): every microbatch runs the same
# stage programs on its own rows and the gradient statements sum their gradients, so with a
# seed ``s(M)`` such that ``M * s(M)`` does not depend on ``M`` the step is the spec's at ``M``
# microbatches exactly when it is at two. ``tvp check`` proves the plan at two when the plan
# allows it; the full-size layout pass and ``tvp simulate`` keep the plan's count.

#: The microbatches ``tvp check`` proves a plan with, where ``fewer_microbatches`` allows.
CHECKED_MICROBATCHES = 2


def fewer_microbatches(plan: Any, reduced: Any) -> str | None:
    """Why ``plan`` (its ``microbatches`` statement's count) may not be proven as ``reduced``
    (the same plan resolved with ``CHECKED_MICROBATCHES``), or ``None`` when it may: the two
    differ in the count and the seed only, the seed times the count is the same, no gradient
    statement runs after a given microbatch, nothing couples the microbatches (clipping acts
    on the accumulated gradients; a token-mean or sum loss reduction counts over them)."""
    if plan.loss_reduction is not None and plan.loss_reduction.mode != "local-mean":
        return f"`loss-reduction {plan.loss_reduction.mode}` counts over the microbatches"
    if plan.clip_grad_norm is not None:
        return "clipping acts on the gradients accumulated over every microbatch"
    from trainverify_dsl.plan.checks import sync_time

    timed = next((c for c in plan.collectives if c.target.grad
                  and isinstance(sync_time(c, plan.microbatches), int)), None)
    if timed is not None:
        return f"a gradient statement runs after microbatch {sync_time(timed, plan.microbatches)}"
    if reduced is None:
        return "the plan with fewer microbatches does not resolve"
    if plan.microbatches * plan.loss_scale != reduced.microbatches * reduced.loss_scale:
        return (f"its seed times the microbatch count is not the same at both counts "
                f"(loss-scale {plan.loss_scale} at {plan.microbatches} microbatches, "
                f"{reduced.loss_scale} at {reduced.microbatches}): write the seed in terms "
                f"of the count, `loss-scale 1/microbatches`")
    if replace(reduced, microbatches=plan.microbatches, loss_scale=plan.loss_scale) != plan:
        return "another statement than `loss-scale` depends on the microbatch count"
    return None


# -- fewer data-parallel ranks (docs/checking.md, "Fewer data-parallel ranks"): along an axis
# that only splits the batch and sums the gradients (a data-parallel axis, whatever its name),
# every rank runs the same stage programs on its own rows and one gradient statement per
# parameter sums (or averages) the ranks' gradients, so with a seed ``s`` such that
# ``D * a(D) * s`` does not depend on the axis size ``D`` (``a`` 1 for sum, ``1/D`` for avg) the
# step is the spec's at ``D`` ranks exactly when it is at two. ``tvp check`` proves the plan with
# the axis at two when the plan allows it (the plan from its statements here, its parallel
# program with ``fewer_ranks_refusal``); the layout pass and ``tvp simulate`` keep the mesh.

#: The size ``tvp check`` proves a data-parallel axis at, where ``fewer_ranks`` allows.
CHECKED_RANKS = 2
#: The gradient statements and ops a data-parallel axis may carry.
_SUMMING = ("all-reduce", "reduce-scatter")
_SUMMING_OPS = (None, "sum", "avg")


def _line(origin: Any) -> str:
    span = origin.report_span
    return f"{span.file}:{span.line}"


def data_axis_refusal(plan: Any, axis: str) -> str | None:
    """Why mesh axis ``axis`` of ``plan`` may not be proven at ``CHECKED_RANKS`` ranks from
    its statements alone, or ``None``: it is not the pipeline axis, the loss is a local mean
    and the step does not clip, and the axis appears only in splits of dimension 0, alone or
    with other axes (the batch of an input: which inputs is checked on the program), in
    gradient all-reduces over it or a group holding it and reduce-scatters over it alone, all
    with one op, and in `shard over` it alone."""
    from trainverify_dsl.plan.checks import sync_time

    if axis == PIPELINE_AXIS:
        return f"`{axis}` is the pipeline axis"
    if plan.loss_reduction is not None and plan.loss_reduction.mode != "local-mean":
        return f"`loss-reduction {plan.loss_reduction.mode}` counts over the data ranks"
    if plan.clip_grad_norm is not None or \
            plan.spec_optimizer is not None and plan.spec_optimizer.clip is not None:
        return "clipping acts on the gradients summed over the data ranks"
    for layout in plan.layouts:
        if axis in layout.partial_axes:
            return f"`{layout.target}` is partial over `{axis}` ({_line(layout.origins[0])})"
        for dim, axes in layout.dim_axes:
            if axis in axes and (dim != 0 or layout.target.grad
                                 or any(d == dim for d, _ in layout.orders)):
                return (f"`{layout.target}` is split over `{axis}` otherwise than on its "
                        f"batch dimension ({_line(layout.origins[0])})")
    ops = set()
    for st in plan.collectives:
        if axis not in st.axes:
            continue
        if not st.target.grad or st.kind not in _SUMMING or st.op not in _SUMMING_OPS or \
                (st.kind != "all-reduce" and st.axes != (axis,)):
            return (f"`{st.kind} {st.target} over {', '.join(st.axes)}` is not a gradient "
                    f"all-reduce over a group holding `{axis}` or a reduce-scatter over "
                    f"`{axis}` alone ({_line(st.origin)})")
        if isinstance(sync_time(st, plan.microbatches), int):
            return (f"`{st.kind} {st.target} over {axis}` runs after microbatch "
                    f"{sync_time(st, plan.microbatches)} ({_line(st.origin)})")
        ops.add(st.op or "sum")
    if not ops:
        return f"no gradient statement sums over `{axis}`"
    if len(ops) > 1:
        return f"gradient statements over `{axis}` both sum and average"
    if plan.optimizer is not None and axis in plan.optimizer.shard_axes and \
            plan.optimizer.shard_axes != (axis,):
        return (f"the optimizer is sharded over `{', '.join(plan.optimizer.shard_axes)}`, "
                f"not `{axis}` alone ({_line(plan.optimizer.origin)})")
    for override in plan.overrides:
        if any(a == axis for a, _ in override.coords):
            return f"an `on {axis}=...` override names a coordinate ({_line(override.origin)})"
    for algorithm in plan.algorithms:
        if axis in algorithm.axes:
            return f"`algorithm {algorithm.name}` runs over `{axis}` ({_line(algorithm.origin)})"
    return None


def ranks_factor(plan: Any, axes: Mapping[str, int]) -> Fraction:
    """What every row's gradient is weighted by in ``plan``'s step, up to the spec's
    ``1/batch``: the seed times the microbatches times, for each of ``axes``, its size times
    ``1/size`` when its gradient statements average (``data_axis_refusal`` found one op)."""
    factor = Fraction(plan.loss_scale) * plan.microbatches
    for axis in axes:
        ops = {st.op or "sum" for st in plan.collectives if axis in st.axes and st.target.grad}
        factor *= 1 if ops == {"avg"} else plan.mesh.size(axis)
    return factor


def fewer_ranks(plan: Any, reduced: Any, axes: Mapping[str, int]) -> str | None:
    """Why ``plan`` may not be proven as ``reduced`` (the same plan resolved with each of
    ``axes`` at ``CHECKED_RANKS`` and perhaps fewer microbatches), or ``None`` when it may:
    the two differ in those sizes, the microbatches and the seed only, and every row's
    gradient weighs the same in both (``ranks_factor``)."""
    if reduced is None:
        return "the plan with fewer ranks does not resolve"
    if ranks_factor(plan, axes) != ranks_factor(reduced, axes):
        shown = ", ".join(axes)
        return (f"its seed times the microbatches and the data ranks (`{shown}`) is not the "
                f"same at both sizes (loss-scale {plan.loss_scale} at the plan's sizes, "
                f"{reduced.loss_scale} with `{shown}` at {CHECKED_RANKS}): write the seed in "
                f"terms of the sizes")
    if replace(reduced, mesh=plan.mesh, microbatches=plan.microbatches,
               loss_scale=plan.loss_scale) != plan:
        return "another statement than `loss-scale` depends on the size of " + \
            ", ".join(f"`{a}`" for a in axes)
    return None


def fewer_ranks_refusal(program: Any, axes: Mapping[str, int]) -> str | None:
    """Why the parallel program (lowered with ``axes`` at ``CHECKED_RANKS``) may not stand
    for the plan's, or ``None``: along each axis no stage reads its coordinate or runs a
    collective, only data inputs are split over it (on dimension 0), no parameter, buffer or
    claim is laid out over it, every parameter's gradient goes through exactly one gradient
    statement over it (an all-reduce over it or a group holding it, or a reduce-scatter over
    it alone; a sum or a mean, of every microbatch's contribution), every
    gradient statement is linear (a sum or a mean), the optimizer shards over it alone, no
    per-rank override names it, the step does not clip and the loss is a local mean of
    losses that do not divide by their own token counts."""
    from trainverify_dsl.ir.ops import OPS

    def mentions(layout: Any, axis: str) -> bool:
        return any(axis in f.axes for dim in layout.dims for f in dim) or \
            (layout.partial is not None and axis in layout.partial[1])

    if program.clip is not None:
        return "clipping acts on the gradients summed over the data ranks"
    odd = next((g for g in program.grad_syncs if g.op not in ("sum", "avg")), None)
    if odd is not None:  # what follows the ranks' sum must be linear in it
        return f"a gradient statement over `{', '.join(odd.axes)}` takes the {odd.op}"
    if program.loss.mode != "local-mean" or program.loss.local_counts:
        return "the loss counts tokens over the data ranks"
    for axis in axes:
        for stage in program.stages:
            for slot in stage.inputs:
                if slot.kind == "coord" and slot.spec == axis:
                    return f"stage {stage.index} reads the `{axis}` coordinate"
                if slot.kind in ("param", "buffer") and mentions(slot.layout, axis):
                    return f"`{slot.spec}` is laid out over `{axis}`"
                if slot.kind == "data" and (
                        any(axis in f.axes for dim in slot.layout.dims[1:] for f in dim) or
                        slot.layout.partial is not None and axis in slot.layout.partial[1]):
                    return f"input `{slot.spec}` is split over `{axis}` past its batch dimension"
            for node in stage.graph.nodes:
                if OPS[node.op].group == "collective" and \
                        axis in str(node.attr_map().get("axis", "")).split(","):
                    return f"stage {stage.index} runs a collective over `{axis}`"
        for name, layout in program.param_layouts:
            if mentions(layout, axis):
                return f"`{name}` is laid out over `{axis}`"
        for claim in program.claims:
            if mentions(claim.layout, axis):
                return f"a claim on `{claim.target}` names `{axis}`"
        seen: dict[str, int] = {}
        for sync in program.grad_syncs:
            if axis not in sync.axes:
                continue
            if sync.kind not in ("all_reduce", "reduce_scatter") or \
                    sync.op not in ("sum", "avg") or \
                    (sync.kind == "reduce_scatter" and sync.axes != (axis,)):
                return f"a gradient statement over `{', '.join(sync.axes)}` is not an " \
                       f"all-reduce over a group holding `{axis}` or a reduce-scatter " \
                       f"over `{axis}` alone"
            if not all(sync.reduces(m, program.microbatches)
                       for m in range(program.microbatches)):
                return f"a gradient statement over `{axis}` runs after microbatch {sync.after}"
            for param in sync.params:
                seen[param] = seen.get(param, 0) + 1
        for name, _ in program.param_layouts:
            if seen.get(name, 0) != 1:
                return (f"the gradient of `{name}` goes through {seen.get(name, 0)} gradient "
                        f"statements over `{axis}`, not one")
        step = program.optimizer
        if step is not None:
            if axis in step.shard_axes and step.shard_axes != (axis,):
                return f"the optimizer is sharded over `{', '.join(step.shard_axes)}`"
            if any(a == axis for o in step.overrides for a, _ in o.coords):
                return f"a per-rank optimizer override names `{axis}`"
    return None


# -- work bounds decided from the plan alone (issue 13): the simulation evaluates every rank
# (rank-batched, one array row per rank of a stage) and loops over the microbatches, so a
# mesh of millions of ranks or a loop of millions of microbatches is refused before torch is
# imported (which alone takes seconds) and before anything is allocated. The limits are far
# above every published configuration (Llama3-405B: 8,192 ranks, 16 microbatches).

#: The most ranks ``tvp simulate`` and ``tvp check`` evaluate (after idle axes run at size 1).
MAX_RANKS = 65_536
#: The most microbatches they loop over.
MAX_MICROBATCHES = 65_536


def work_refusal(plan: Any) -> Any:
    """TVP501 at the ``mesh`` (or ``microbatches``) line when the plan asks the simulation
    for more ranks or microbatches than the limits above, else ``None``. Idle axes (no
    statement uses them) do not count: they run at size 1."""
    from trainverify_dsl.report.codes_run import OVER_BUDGET
    from trainverify_dsl.report.diagnostics import Diagnostic

    if plan.mesh is None:
        return None
    busy, idle = without_idle_axes(plan)
    ranks = busy.mesh.total_devices
    if ranks > MAX_RANKS:
        shown = " x ".join(f"{a.name}={a.size:,}" for a in busy.mesh.axes if a.size > 1)
        return Diagnostic(
            OVER_BUDGET, f"simulating this plan would evaluate {ranks:,} ranks ({shown}), "
            f"above the limit of {MAX_RANKS:,}", plan.mesh.span,
            ("decided from the plan alone, before the model is built or anything is "
             "allocated",) + ((f"idle axes already run at size 1: {', '.join(idle)}",)
                              if idle else ()),
            "check the mesh sizes; every published configuration is far below this limit")
    count = plan.microbatches
    if count > MAX_MICROBATCHES:
        origin = plan.header_origin("microbatches")
        span = origin.report_span if origin is not None else plan.mesh.span
        return Diagnostic(
            OVER_BUDGET, f"simulating this plan would loop over {count:,} microbatches, "
            f"above the limit of {MAX_MICROBATCHES:,}", span,
            ("decided from the plan alone, before the model is built or anything is "
             "allocated",), "check the `microbatches` count")
    return None


def file_work_refusal(path: Any) -> Any:
    """``work_refusal`` of the plan file at ``path`` (torch-free: the CLI asks before the
    drivers import torch); ``None`` when the plan does not resolve (its errors are reported
    by the command as usual)."""
    from trainverify_dsl.plan import resolve_file
    from trainverify_dsl.report.diagnostics import Severity

    try:
        result = resolve_file(path)
    except OSError:
        return None
    if result.plan is None or any(d.severity is Severity.ERROR for d in result.diagnostics):
        return None
    return work_refusal(result.plan)
