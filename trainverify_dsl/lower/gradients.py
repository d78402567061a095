"""The layout pass for the backward: which gradients come out partial, and whether the plan
reduces them (docs/semantics.md §3.3, §4.5, §4.7).

Under the cotangent convention of §3.3 (a copy of a replicated value holds the full gradient),
a value that is **complete** over an axis ``X`` but consumed by an op whose output is **split**
over ``X`` on a dimension the value does not run along (a weight multiplying batch-split rows, a
norm weight scaling sequence-split tokens, a replicated activation entering a
column-parallel product) receives only its share of the gradient on each rank: its cotangent
is ``Partial(sum)`` over ``X``. A partial cotangent flows back through every op (a backward is
linear in the output's cotangent) until a collective whose backward sums over ``X`` (``copy``:
all-reduce; ``all-gather``: reduce-scatter) makes it complete.

The forward walk records every op (``record``) and collective (``collective``); ``finish`` runs
the backward over the record and checks the parameters' gradients against the plan's gradient
statements:

- a gradient partial over an axis no statement reduces (a missing ``copy``, a missing
  sequence-parallel norm all-reduce, a missing data-parallel all-reduce): TVP410
  ``missing-collective``, reported once per axis and cause, at the split statement that made
  it partial; a tied parameter used on several pp ranks (``pipeline_copies``) is partial over
  ``pp`` (each stage's copy has its own uses' gradient, docs/semantics.md §5.4), reported at
  the ``pipeline-stage`` that put its last use on another rank when no
  ``all-reduce grad(P) over pp`` sums the copies;
- ``op=avg`` over an axis that splits no input (avg divides a true sum), a reduction over an
  axis that splits the parameter (adds different slices): TVP406 ``collective-mismatch``; one
  over which its gradient is already complete with ``op=sum`` multiplies it by the axis size,
  a factor of the §4.7 product below (a loss scale may divide it back), and is TVP406 where
  that product cannot be checked or the loss scale only undoes the microbatch sum;
- over the data axes, the reduction's factor times the loss scale times the number of data
  ranks and microbatches must be 1 (§4.7): TVP411 ``loss-scale-mismatch``; a ``token-mean``
  loss is already divided by the step's count along its counted axes and microbatches, which
  then leave the product; a ``sum`` loss's scale is the plan's claim about the token count,
  which only the simulation checks;
- a ``copy``/``all-gather`` whose backward sums a cotangent that is already complete multiplies
  it by the group size: the factor is carried to the parameters it reaches (``_Factor``), and
  is right only where a gradient statement averages over that axis afterwards (a loss on
  embeddings gathered over dp, CLIP's: the reduce-scatter's x|dp| and DDP's average cancel);
  elsewhere, or where it meets a contribution without it, it is TVP406 ``collective-mismatch``
  at the collective. One summing over an axis that splits the value adds the gradients of
  different pieces: TVP406, checked axis by axis. The statements at
  one point apply one after the other (a repeated ``copy`` sums twice), and so do a
  parameter's gradient statements (a repeated ``all-reduce`` sums complete gradients).

Ops inside parallel algorithms are not seen (the algorithm's own collectives carry its
backward and the simulation checks it); an algorithm's input gets, from the algorithm, the
output's cotangent made partial over the axes the algorithm declares
(``Context.partial_cotangent``: context-parallel attention declares the axes splitting its
heads), and nothing from an algorithm that declares nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from trainverify_dsl.ir.collectives import COLLECTIVES
from trainverify_dsl.ir.layout import MICROBATCH_AXIS, TLayout, broadcast_dim
from trainverify_dsl.lower.findings import Finding
from trainverify_dsl.plan.model import PIPELINE_AXIS
from trainverify_dsl.report import codes_lower
from trainverify_dsl.report.diagnostics import Code
from trainverify_dsl.report.span import Span

#: axis -> (the plan span that made the cotangent partial over it, the module where it did)
Partial = dict[str, tuple[Span | None, str]]


def covered_dims(name: str, index: int, operand: TLayout, out: TLayout) -> set[int] | None:
    """Output dimensions operand ``index`` of op ``name`` runs along (its gradient does not
    sum over them); ``None`` when every output dimension is (the op is not understood, so no
    first-order partial is assumed)."""
    if name == "aten.mm":
        return {0} if index == 0 else {1}
    if name == "aten.addmm":
        return {1} if index in (0, 2) else {0}
    if name == "aten.bmm":
        # an operand expanded along the batch (a weight: `linear` on a 3-d input that is not
        # contiguous) holds one value there: it does not run along the batch
        batch = set() if broadcast_dim(operand.dims[0]) else {0}
        return batch | ({1} if index == 0 else {2})
    if name == "aten.embedding":
        return {out.rank - 1} if index == 0 else set(range(out.rank - 1))
    if name in ("aten.mul", "aten.add", "aten.sub", "aten.div", "aten.where"):
        shape, out_shape = operand.global_shape(), out.global_shape()
        offset = out.rank - operand.rank
        return {d for d in range(out.rank) if d - offset >= 0 and shape[d - offset] ==
                out_shape[d] and shape[d - offset] > 1 and
                not broadcast_dim(operand.dims[d - offset])}
    return None


#: Ops whose backward gives their operand no gradient (``x.detach()``)
STOPS_GRADIENT = frozenset({"aten.detach"})


@dataclass(frozen=True, slots=True)
class _Op:
    out: Any
    name: str
    #: (operand, its layout, floating point) in argument order
    operands: tuple[tuple[Any, Any, bool], ...]
    layout: Any
    span: Span | None
    where: str = ""


def _gathers(item: _Collective) -> set[str]:
    """The axes whose pieces the statement's backward gathers (an all-gather backward)."""
    statement = item.statement
    backward = getattr(statement, "backward", None)
    return set(statement.axes) if backward == "all-gather" else set()


@dataclass(frozen=True, slots=True)
class _AlgorithmInput:
    """An input of a parallel algorithm whose cotangent the algorithm's backward makes
    partial over ``axes`` (``algorithms.Context.partial_cotangent``)."""

    out: Any
    source: Any
    axes: tuple[str, ...]
    span: Span | None
    where: str = ""


@dataclass(frozen=True, slots=True)
class _Collective:
    out: Any
    source: Any
    #: axes whose cotangent the backward sums (copy, all-gather), and the statement
    sums: tuple[str, ...]
    statement: Any
    #: mesh axes splitting the value the statement reads (each rank holds another piece)
    split: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, eq=False)
class _Factor:
    """A backward that summed copies of a cotangent already complete over ``axis``: the
    gradients it reaches are ``|axis|`` times their share. The plan is right only where a
    gradient statement averages over ``axis`` afterwards (CLIP's loss on embeddings gathered
    over dp: ``all-gather``'s reduce-scatter, then DDP's average; open_clip and
    ``torch.distributed.nn.all_gather`` do exactly this); anywhere else it is TVP406 at the
    collective."""

    axis: str
    statement: Any


@dataclass
class GradientTracker:
    sizes: Mapping[str, int]
    record: list[Any] = field(default_factory=list)
    params: dict[Any, str] = field(default_factory=dict)
    split: dict[str, set[str]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    #: (code, span, reason) -> parameters, for one finding per wrong statement
    _grouped: dict[tuple[str, Any, str, str | None], list[str]] = field(default_factory=dict)
    _headers: Mapping[str, Any] = field(default_factory=dict)
    _scale_checked: bool = True
    #: tied parameters held on several pp ranks: parameter -> (how many, the
    #: `pipeline-stage` statement that put its last use on another stage)
    copies: dict[str, tuple[int, Span | None]] = field(default_factory=dict)
    #: every value's factors from backwards that summed complete copies (``_Factor``s)
    _factors: dict[Any, tuple[_Factor, ...]] = field(default_factory=dict)
    #: factors reported (at their collective) or cancelled by an average, at every parameter
    #: they reached
    _reported: set[_Factor] = field(default_factory=set)
    _cancelled: set[_Factor] = field(default_factory=set)

    # -- during the forward walk ----------------------------------------------------------

    def parameter(self, node: Any, name: str, layout: TLayout) -> None:
        self.params[node] = name
        self.split[name] = {a for a in layout.shard_axes() if self.sizes.get(a, 1) > 1}

    def op(self, out: Any, name: str, operands: Sequence[tuple[Any, Any, bool]], layout: Any,
           span: Span | None, where: str = "") -> None:
        self.record.append(_Op(out, name, tuple(operands), layout, span, where))

    def collective(self, out: Any, source: Any, sums: tuple[str, ...], statement: Any,
                   split: frozenset[str] = frozenset()) -> None:
        self.record.append(_Collective(out, source, sums, statement, split))

    def algorithm_input(self, out: Any, source: Any, axes: tuple[str, ...],
                        span: Span | None, where: str = "") -> None:
        """The algorithm computing ``out`` reads ``source``; its backward gives ``source``
        the output's cotangent (linearly) made partial over ``axes``."""
        self.record.append(_AlgorithmInput(out, source, axes, span, where))

    def pipeline_copies(self, copies: Mapping[str, tuple[int, Span | None]]) -> None:
        """Parameters used on several pp ranks (a tied embedding and output head): each rank
        holds a copy and computes the share of the gradient of its own uses, so the gradient
        is partial over the pipeline axis, over that many copies (docs/semantics.md §5.4)."""
        self.copies = dict(copies)

    def _group_size(self, param: str, axis: str) -> int:
        """The ranks a statement over ``axis`` combines for ``param``: over the pipeline axis
        only the pp ranks holding a copy of it (the embedding group)."""
        if axis == PIPELINE_AXIS and param in self.copies:
            return self.copies[param][0]
        return self.sizes[axis]

    # -- after it ------------------------------------------------------------------------

    def _real(self, axes: Any) -> set[str]:
        return {a for a in axes if self.sizes.get(a, 1) > 1 and a != MICROBATCH_AXIS}

    def backward(self) -> dict[Any, Partial]:
        """The cotangent's partial axes of every recorded value."""
        cot: dict[Any, Partial] = {}
        factors = self._factors
        for item in reversed(self.record):
            mine = cot.get(item.out, {})
            carried = factors.get(item.out, ())
            if isinstance(item, _Collective):
                summed = set(item.sums)
                # each summed axis must hold a partial sum (over axes of size 1 the sum is
                # the identity, never a finding)
                extra = [a for a in item.sums if a in self._real(summed) and a not in mine]
                pieces = [a for a in extra if a in item.split]
                complete = [a for a in extra if a not in item.split]
                shown = f"the backward of `{item.statement.kind} {item.statement.target}`"
                if pieces:
                    self.findings.append(Finding(
                        codes_lower.COLLECTIVE_MISMATCH, f"{shown} sums over "
                        f"{', '.join(pieces)} the gradients of different pieces (the value is "
                        f"split over {', '.join(pieces)}: each rank holds other elements)",
                        item.statement.origin, str(item.statement.target)))
                elif complete:  # decided at the parameters it reaches (``_Factor``)
                    carried = carried + tuple(_Factor(a, item.statement) for a in complete)
                passed = {a: s for a, s in mine.items() if a not in summed}
                _merge(cot, item.source, passed)
                self._carry(item.source, carried)
                continue
            if isinstance(item, _AlgorithmInput):
                contribution = dict(mine)
                for axis in self._real(item.axes):
                    contribution.setdefault(axis, (item.span, item.where))
                _merge(cot, item.source, contribution)
                self._carry(item.source, carried)
                continue
            if item.name in STOPS_GRADIENT:
                continue  # no cotangent reaches the operand
            out = item.layout if isinstance(item.layout, TLayout) else None
            for index, (value, lay, floating) in enumerate(item.operands):
                if not floating or (isinstance(lay, TLayout) and lay.const):
                    continue
                contribution = dict(mine)  # a backward is linear in the output's cotangent
                self._carry(value, carried)
                if not isinstance(lay, TLayout):  # a multi-output parent (getitem)
                    _merge(cot, value, contribution)
                    continue
                covered = covered_dims(item.name, index, lay, out) if out is not None else None
                if covered is not None and out is not None and not lay.partial:
                    shared = {a for d in range(out.rank) if d not in covered
                              for a in self._real(out.dim_axes(d))}
                    for axis in shared - lay.shard_axes():
                        contribution.setdefault(axis, (item.span, item.where))
                _merge(cot, value, contribution)
        return cot

    def _carry(self, value: Any, carried: tuple[_Factor, ...]) -> None:
        """``value``'s cotangent receives a contribution scaled by ``carried``. Two
        contributions scaled differently make a sum no average undoes: the factors that are
        not common to both are reported at their collectives (TVP406)."""
        if value not in self._factors:
            self._factors[value] = carried
            return
        known = self._factors[value]
        if sorted(known, key=id) == sorted(carried, key=id):
            return
        common = tuple(f for f in known if f in carried)
        for factor in set(known) ^ set(carried):
            self._report(factor)
        self._factors[value] = common

    def _report(self, factor: _Factor) -> None:
        if factor in self._reported:
            return
        self._reported.add(factor)
        statement = factor.statement
        self.findings.append(Finding(
            codes_lower.COLLECTIVE_MISMATCH, f"the backward of `{statement.kind} "
            f"{statement.target}` sums a gradient that is already complete over "
            f"{factor.axis}: it multiplies it by {self.sizes[factor.axis]}",
            statement.origin, str(statement.target), _unsummed_backward(statement)))

    def finish(self, statements: Sequence[tuple[Any, tuple[str, ...]]], data_axes: set[str],
               loss_scale: Fraction, microbatches: int,
               headers: Mapping[str, Any] | None = None,
               loss_mode: str = "local-mean", counted: tuple[str, ...] = (),
               loss_axes: tuple[str, ...] | None = None) -> None:
        """``headers``: the plan origins of ``loss-scale`` and ``microbatches`` (where a
        loss-scale mismatch is reported when the reductions are not at fault). ``loss_mode``
        and ``counted``: the loss reduction (Rule 4.5) and a ``token-mean``'s counted axes
        (the microbatches count too); a ``sum`` loss's scale is not checked here.
        ``loss_axes``: the axes the loss is split over where it is normalised. A data axis
        gathered before the loss (a sequence split undone before a pooling) leaves every
        rank of it the same local loss, whose gradient shares add up: it is not counted
        among the data ranks of §4.7."""
        self._headers = headers or {}
        if loss_axes is not None:
            data_axes = data_axes & set(loss_axes)
        self._token_mean = counted if loss_mode == "token-mean" else None
        cot = self.backward()
        used = {value for item in self.record if isinstance(item, _Op)
                for value, _, _ in item.operands}
        # a parameter an algorithm reads and declares partial (row-parallel-linear's bias
        # under sequence parallelism)
        used |= {item.source for item in self.record if isinstance(item, _AlgorithmInput)}
        # A backward that sums over a data axis (an all-gather of a sequence split over a data
        # axis) already adds different data blocks' gradients: the scale accounting of §4.7
        # then depends on the activations, and is not checked here.
        # So does one whose backward gathers the pieces of a data axis (the all-gather
        # backward of a `scatter` of a sequence split over a data axis: every rank's
        # gradient then reads every block's cotangent).
        self._scale_checked = loss_mode != "sum" and not any(
            isinstance(item, _Collective) and (set(item.sums) | _gathers(item)) & data_axes
            for item in self.record)
        missing: dict[tuple[str, tuple[Span | None, str]], list[str]] = {}
        checked: set[str] = set()
        for node, param in self.params.items():
            if node not in used or param in checked:  # used only inside parallel
                continue                               # algorithms: not seen here
            checked.add(param)
            # a tied parameter is one capture input per use: its gradient sums them all
            partial: Partial = {}
            nodes = [other for other, name in self.params.items() if name == param]
            for other in nodes:
                _merge_into(partial, cot.get(other, {}))
            for other in nodes[1:]:  # uses scaled differently: reported, the common kept
                self._carry(nodes[0], self._factors.get(other, ()))
            scaled = self._factors.get(nodes[0], ())
            if param in self.copies:
                partial.setdefault(PIPELINE_AXIS, (self.copies[param][1], "(pipeline)"))
            applied = [(st, tuple(a for a in st.axes if self.sizes.get(a, 1) > 1))
                       for st, names in statements if param in names]
            reduced = {a for _, axes in applied for a in axes}
            for axis, cause in partial.items():
                if axis not in reduced:
                    missing.setdefault((axis, cause), []).append(param)
            self._check_statements(param, set(partial), applied, data_axes, loss_scale,
                                   microbatches, scaled)
        for (axis, (span, where)), params in missing.items():
            shown = ", ".join(f"`{p}`" for p in params[:3])
            more = f" and {len(params) - 3} more" if len(params) > 3 else ""
            if axis == PIPELINE_AXIS:
                self.findings.append(_unsummed_copies(params, shown + more, span))
                continue
            self.findings.append(Finding(
                codes_lower.MISSING_COLLECTIVE,
                f"the gradients of {shown}{more} are partial over {axis} "
                f"(in `{where}` a complete value meets one split over {axis} by this "
                f"statement, so each rank's gradient is a share) and nothing reduces them: no "
                f"`copy`/`all-gather` over {axis} on the way back and no gradient statement "
                f"over {axis}", span, params[0],
                help=f"if the split feeds a column-parallel layer, add `copy <layer>.in over "
                     f"{axis}`; for a replicated parameter, `all-reduce grad(...) over "
                     f"{axis}`"))
        # a factor no average undid at some parameter, or that reached none: at its statement
        for factors in self._factors.values():
            for factor in factors:
                if factor not in self._cancelled:
                    self._report(factor)
        for (code, span, reason, help), params in self._grouped.items():
            shown = ", ".join(f"`{p}`" for p in params[:3])
            more = f" and {len(params) - 3} more" if len(params) > 3 else ""
            self.findings.append(Finding(code, reason.format(params=shown + more), span,
                                         params[0], help))

    def _check_statements(self, param: str, partial: set[str], applied: list[Any],
                          data_axes: set[str], loss_scale: Fraction, microbatches: int,
                          scaled: tuple[_Factor, ...] = ()) -> None:
        """``scaled``: the factors of backwards that summed complete copies on the way to
        the parameter's gradient; an average over the factor's axis undoes it (and is then
        no division of a partial sum), else the factor is reported at its collective."""
        factor = Fraction(1)
        pending = list(scaled)
        # the statements apply in order: an axis a statement reduced is complete for the
        # next one (a repeated all-reduce sums complete copies)
        remaining = set(partial)
        reducer = None  # the statement that reduced the data axes (a scale mismatch's place)
        #: sums of copies already complete over an axis (statement, axis): each multiplies
        #: the gradient by the axis size, which the loss scale may undo (§4.7 counts it)
        copies: list[tuple[Any, str]] = []
        for st, axes in applied:
            op = st.op or "sum"
            before = set(remaining)
            remaining -= set(axes)
            if reducer is None and set(axes) & before & data_axes:
                reducer = st.origin
            if op not in ("sum", "avg"):
                self._group(codes_lower.COLLECTIVE_MISMATCH, st.origin, f"op={op} does not "
                            "synchronise the gradients of {params}: the gradients of the "
                            "copies and pieces add up (op=sum, or op=avg over data ranks)",
                            param)
                continue
            for axis in axes:
                if self.sizes.get(axis) == 1:
                    continue  # one copy, one slice: the reduction is the identity
                if axis == PIPELINE_AXIS:  # only tied parameters get here (the lowering checked)
                    if axis not in before and op == "sum":
                        self._group(codes_lower.COLLECTIVE_MISMATCH, st.origin, "the "
                                    f"gradients of {{params}} are already summed over {axis}: "
                                    "summing their copies again multiplies them by "
                                    f"{self._group_size(param, axis)}", param)
                    continue
                if axis in self.split.get(param, set()):
                    self._group(codes_lower.COLLECTIVE_MISMATCH, st.origin, "the gradients of "
                                f"{{params}} are split over {axis}: reducing them adds the "
                                "gradients of different slices", param)
                elif axis not in before and op == "sum":
                    copies.append((st, axis))
                    factor *= self.sizes[axis]
            if op == "avg":
                undone = []  # axes whose average undoes a backward's factor (``_Factor``)
                for axis in axes:
                    match = next((f for f in pending if f.axis == axis), None)
                    if match is not None and axis in before:
                        pending.remove(match)
                        self._cancelled.add(match)
                        undone.append(axis)
                tensor_axes = [a for a in axes if a in before and a not in data_axes and
                               a not in undone]
                if tensor_axes:
                    divisor = math.prod(self._group_size(param, a) for a in tensor_axes)
                    self._group(codes_lower.COLLECTIVE_MISMATCH, st.origin, "the gradients of "
                                f"{{params}} are partial sums over {', '.join(tensor_axes)}: "
                                f"op=avg divides them by {divisor}", param)
                # an average over an axis where the gradient is already complete averages
                # equal copies: it divides nothing; one that undoes a backward's factor
                # divides what that factor multiplied
                factor /= math.prod(self._group_size(param, a) for a in axes
                                    if a in before and a not in undone)
        data = sorted(a for a in partial if a in data_axes)
        reduced = {a for _, axes in applied for a in axes}
        decidable = set(data) <= reduced and self._scale_checked
        if pending and decidable and loss_scale * microbatches != 1:
            # a backward's sum of complete copies no average undid, divided back by the loss
            # scale (a loss computed whole on every rank after an all-gather, `loss-scale
            # 1/sp`): right where the whole §4.7 product, with its factor, is 1
            multiplied = factor * math.prod(self.sizes[f.axis] for f in pending)
            if self._product(multiplied, data, loss_scale, microbatches) == 1:
                factor = multiplied
                self._cancelled.update(pending)
                pending = []
        for left in pending:  # multiplied, and no average undoes it: at its collective
            self._report(left)
        if copies and (not decidable or loss_scale * microbatches == 1):
            # the scale is not decidable from the statements (or the data reduction is
            # missing), or it only undoes the microbatch sum: a sum of complete copies is a
            # fault of its own, and the rest is checked without its factor
            for st, axis in copies:
                self._group(codes_lower.COLLECTIVE_MISMATCH, st.origin, "the gradients of "
                            f"{{params}} are already complete over {axis}: summing their "
                            f"copies multiplies them by {self.sizes[axis]}", param)
                factor /= self.sizes[axis]
            copies = []
        if not decidable:
            return  # reported as missing, or not decidable from the statements
        summed = "".join(f"; summing their copies already complete over {axis} multiplies "
                         f"them by {self.sizes[axis]}" for _, axis in copies)
        if self._token_mean is not None:
            # Rule 4.5: already divided by the count over these axes and the microbatches
            counted = self._token_mean
            rest = [a for a in data if a not in counted]
            ranks = math.prod(self.sizes[a] for a in rest)
            total = self._product(factor, data, loss_scale, microbatches)
            if total != 1:
                self._group(codes_lower.LOSS_SCALE_MISMATCH,
                            applied[-1][0].origin if applied else None,
                            f"the gradients of {{params}} come out {total} times the spec's: "
                            f"the loss is divided by the step's token count over "
                            f"({', '.join(counted) or 'the microbatches'}), so the "
                            f"reduction's factor {factor} x loss-scale {loss_scale} x {ranks} "
                            f"data ranks outside the count ({', '.join(rest) or 'none'}) must "
                            f"be 1 (docs/semantics.md Rule 4.5){summed}", param,
                            "with `loss-reduction token-mean` sum the gradients over the "
                            "counted axes (`op=sum`) and state no `loss-scale`")
            return
        ranks = math.prod(self.sizes[a] for a in data)
        total = self._product(factor, data, loss_scale, microbatches)
        if total != 1:
            origin, help = self._scale_at_fault(applied, factor * ranks, loss_scale,
                                                microbatches, reducer)
            self._group(codes_lower.LOSS_SCALE_MISMATCH,
                        origin, f"the gradients of {{params}} come out "
                        f"{total} times the spec's: the reduction's factor {factor} x "
                        f"loss-scale {loss_scale} x {microbatches} microbatches x {ranks} data "
                        f"ranks ({', '.join(data)}) is not 1 (docs/semantics.md §4.7)"
                        f"{summed}", param, help)

    def _product(self, factor: Fraction, data: list[str], loss_scale: Fraction,
                 microbatches: int) -> Fraction:
        """The §4.7 product of a reduction's ``factor`` (Rule 4.5 for a token-mean loss)."""
        if self._token_mean is not None:
            rest = [a for a in data if a not in self._token_mean]
            return factor * loss_scale * math.prod(self.sizes[a] for a in rest)
        return factor * loss_scale * microbatches * math.prod(self.sizes[a] for a in data)

    def _scale_at_fault(self, applied: list[Any], reduction: Fraction, loss_scale: Fraction,
                        microbatches: int, reducer: Any = None) -> tuple[Any, str | None]:
        """Where a §4.7 mismatch is reported. The reductions are at fault when the loss scale
        already undoes the microbatch sum (``loss-scale x microbatches = 1``): the
        last gradient statement. Else, when the reductions average over the data ranks
        (their factor x data ranks = 1), the loss scale is: its statement, or, when there is
        none, the ``microbatches`` statement it should follow. Else both deviate: the
        reductions, whose line the user changes most often. The reductions' place is the
        statement that reduced the data axes (``reducer``; a later average over them divides
        complete gradients by nothing), else the last gradient statement."""
        statement = reducer or (applied[-1][0].origin if applied else None)
        if loss_scale * microbatches == 1 or reduction != 1:
            return statement, None
        needed = Fraction(1, microbatches)
        stated = self._headers.get("loss-scale")
        if stated is not None:
            return stated, f"the step needs `loss-scale {needed}` (1/microbatches) with these " \
                "reductions"
        where = self._headers.get("microbatches") or statement
        return where, "there is no `loss-scale` statement: the microbatches' gradients are " \
            "summed; add `loss-scale 1/microbatches`"

    def _group(self, code: Code, span: Any, reason: str, param: str,
               help: str | None = None) -> None:
        params = self._grouped.setdefault((code, span, reason, help), [])
        if param not in params:
            params.append(param)


def _merge(cot: dict[Any, Partial], node: Any, contribution: Partial) -> None:
    _merge_into(cot.setdefault(node, {}), contribution)


def _merge_into(target: Partial, contribution: Partial) -> None:
    for axis, span in contribution.items():
        target.setdefault(axis, span)


def _unsummed_copies(params: Sequence[str], shown: str, span: Span | None) -> Finding:
    """TVP410 for a tied parameter whose copies' gradients are never summed (§5.4)."""
    return Finding(
        codes_lower.MISSING_COLLECTIVE,
        f"the gradients of {shown} are partial over {PIPELINE_AXIS}: the parameter is used on "
        f"several pipeline stages (tied), this statement puts a use of it on another stage "
        "than the first, each stage's copy gets only the gradient of its own uses, and no "
        f"`all-reduce grad(...) over {PIPELINE_AXIS}` adds them: the copies are updated "
        "differently and drift apart", span, params[0],
        help=f"add `all-reduce grad({params[0]}) over {PIPELINE_AXIS}` (Megatron's "
             "embedding-group all-reduce of the tied word embeddings)")


def _unsummed_backward(statement: Any) -> str | None:
    """The help of a backward that sums a complete gradient: which ``backward`` to write
    (``ir.collectives``: each collective's backward for a complete cotangent)."""
    alt = COLLECTIVES[statement.kind].complete_backward
    if alt is None:
        return None
    kind, why = alt
    if statement.kind == "copy":
        return (f"{why}, so the gradient of `copy {statement.target}` is complete on every "
                f"rank: remove the `copy`, or write `backward {kind}`")
    return f"write `backward {kind}` on this statement ({why})"
