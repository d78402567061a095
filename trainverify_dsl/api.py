"""The drivers: from a plan file to what the commands report. Above ``lower/``, ``simulate/``
and (later) ``check/``; those stages never read a plan file, and nothing after the lowering reads
the ``Plan``.

- ``prepare``: resolve the plan, locate and build its spec model (fake for tracing and
  lowering, real for its buffers) and the input shapes, shrunk when the model is too large to
  run (``trainverify_dsl/shrink.py``);
- ``layout_diagnostics``: the full-size binding and layout pass as diagnostics (``tvp lint
  --spec``);
- ``simulate_file``: ``tvp simulate`` end to end: the layout pass first (any error stops
  here), the shrunk sizes, the plan lowered to its ``ParallelProgram``, the reference step
  traced from the spec with the plan's marked points, both evaluated on the same random values
  (``simulate/``), the reference checked against eager torch, then the named checks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainverify_dsl.ir.layout import MICROBATCH_AXIS
from trainverify_dsl.ir.parallel import ParallelProgram, parallel_problems
from trainverify_dsl.lower.diagnose import to_diagnostic
from trainverify_dsl.lower.findings import LoweringError
from trainverify_dsl.lower.lowering import Lowered, lower
from trainverify_dsl.lower.program import parallel_program
from trainverify_dsl.plan.model import Plan, group_of
from trainverify_dsl.report.codes_run import OVER_BUDGET
from trainverify_dsl.report.diagnostics import Diagnostic, Severity
from trainverify_dsl.report.span import Span
from trainverify_dsl.shrink import (
    CHECKED_MICROBATCHES,
    CHECKED_RANKS,
    fewer_ranks_refusal,
    without_idle_axes,
)
from trainverify_dsl.simulate.budget import Estimate, default_budget, estimate, human
from trainverify_dsl.simulate.run import (
    FLOOR,
    TOLERANCE,
    Roundoff,
    SimulationResult,
    compare_programs,
    final_outputs,
    input_masks,
    input_ranges,
    model_vocab,
    plan_states,
    random_inputs,
    reference_points,
    unheld_masks,
)
from trainverify_dsl.simulate.torch_step import check_reference
from trainverify_dsl.spec import optim


class SimulationSetupError(Exception):
    def __init__(self, diagnostics: list[Diagnostic], message: str = "") -> None:
        super().__init__(message or "; ".join(d.message for d in diagnostics))
        self.diagnostics = diagnostics


@dataclass
class SimulationSetup:
    plan: Plan
    fake_model: torch.nn.Module
    #: built only when asked for (a full-size model would not fit in memory)
    real_model: torch.nn.Module | None
    input_specs: dict[str, Any]
    fake_inputs: dict[str, torch.Tensor]
    #: config overrides and batch/seq used (empty when nothing was shrunk)
    overrides: dict[str, Any]
    #: how to build the real model later (``build_real``): the located model reference and
    #: the keyword arguments the fake model was built with
    model_ref: Any = None
    model_kwargs: dict[str, Any] | None = None

    def build_real(self) -> torch.nn.Module:
        """The real model (float32 weights allocated), built once, after the budget check."""
        from trainverify_dsl.spec.load import load_model

        if self.real_model is None:
            self.real_model = load_model(self.model_ref, fake=False, **(self.model_kwargs or {}))
        return self.real_model


def resolve_plan(path: str | Path, sizes: Mapping[str, int] | None = None) -> Plan:
    """The plan at ``path`` (``sizes``: resolved with these counts in place of its
    statements', ``microbatches`` and mesh axes by name: ``resolve_plan_file``); raises
    ``SimulationSetupError`` when it has errors."""
    from trainverify_dsl.plan import resolve_file

    result = resolve_file(path, sizes=sizes)
    errors = [d for d in result.diagnostics if d.severity is Severity.ERROR]
    if result.plan is None or errors:
        raise SimulationSetupError(errors or list(result.diagnostics),
                                   f"{path}: the plan has errors; run `tvp lint {path}`")
    return result.plan


def prepare(path: str | Path, *, shrink: bool | None = None, real: bool = True,
            allow_model_outside_root: bool = False,
            sizes: Mapping[str, int] | None = None) -> SimulationSetup:
    """Resolve the plan and build its model. The model file is looked up from the plan's
    folder and must lie inside it, the project or the stdlib unless
    ``allow_model_outside_root`` (``spec/load.py``); a refused file is not imported.
    ``shrink``: ``None`` shrinks a model with a width above ``shrink.SMALL`` (or a batch
    above 64), ``True`` always shrinks, ``False`` never does. ``sizes``: as
    ``resolve_plan``'s."""
    from trainverify_dsl.shrink import NOT_CONFIG, needs_shrinking
    from trainverify_dsl.spec.load import model_input_specs

    plan = resolve_plan(path, sizes)
    if plan.spec is None:  # a missing mesh is TVP203, an error resolve_plan raised
        from trainverify_dsl.report.codes_run import NO_SPEC

        raise SimulationSetupError([Diagnostic(
            NO_SPEC, "the plan has no `spec` line: there is no model to compare it with",
            Span(plan.file, 1, 1, 1, 1),
            help='add a line such as `spec "stdlib/models/llama.py:Llama" config llama_tiny '
                 'batch 4 seq 8` after the `plan` header')])
    assert plan.mesh is not None
    settings = {k: _plain(v) for k, v in plan.spec.settings if k not in NOT_CONFIG}
    # located (and refused if outside the allowed roots) before anything imports it
    model_ref = locate_model(plan, Path(path), allow_model_outside_root)
    if shrink is None:
        shrink = needs_shrinking(plan, settings)
    reduction = plan.loss_reduction
    if shrink and reduction is not None and reduction.mode == "sum":
        # the scale is a number about the full-size token count; shrunk widths change the
        # count and would turn a right scale wrong (docs/semantics.md §4.3)
        if needs_shrinking(plan, settings):
            raise SimulationSetupError([], f"{reduction.origin.report_span}: `loss-reduction "
                                           "sum` states a scale for the full-size token "
                                           "count, and this model is too large to run at full "
                                           "size; state `token-mean` instead")
        shrink = False
    overrides, batch, seq = _shrunk(plan, settings, model_ref) if shrink else ({}, None, None)
    batch = batch or plan.spec.batch or 1
    seq = seq or plan.spec.seq or 1
    kwargs = {**settings, **overrides}
    fake = _build_model(plan, model_ref, settings, kwargs, fake=True)
    real_model = _build_model(plan, model_ref, settings, kwargs, fake=False) if real else None
    specs = dict(model_input_specs(fake, batch, seq))
    from trainverify_dsl.spec.trace import fake_mode_of

    mode = fake_mode_of(fake)  # a model without parameters has its own mode
    with mode:
        fake_inputs = {k: torch.zeros(tuple(s), dtype=d) for k, (s, d) in specs.items()}
    used = {**overrides, "batch": batch, "seq": seq} if overrides or \
        (batch, seq) != (plan.spec.batch, plan.spec.seq) else {}
    return SimulationSetup(plan, fake, real_model, specs, fake_inputs, used, model_ref, kwargs)


def _build_model(plan: Plan, model_ref: Any, settings: dict[str, Any], kwargs: dict[str, Any],
                 fake: bool) -> Any:
    """The model of the spec line. When the line sets config fields (``tie_embeddings
    maybe``) and building fails, the error stands at the spec line, where the value was
    written; the model file's location becomes a note."""
    from trainverify_dsl.spec.errors import SpecError
    from trainverify_dsl.spec.load import load_model

    try:
        return load_model(model_ref, fake=fake, **kwargs)
    except SpecError as error:
        assert plan.spec is not None
        if not settings or plan.spec.origin.span is None:
            raise
        written = ", ".join(f"{k} {v}" for k, v in settings.items())
        raise SpecError([replace(d, span=plan.spec.origin.span, notes=d.notes + (
            f"building the model with the spec line's settings ({written})",
            f"reported in {d.span.file}:{d.span.line}" if d.span is not None else
            f"the model is `{plan.spec.model}`")) for d in error.diagnostics]) from None


def locate_model(plan: Plan, path: Path, allow_outside_root: bool) -> Any:
    """The ``ModelRef`` of the plan's ``spec`` line; a reference that names no file, or a
    file outside the allowed roots, is a ``SpecError`` located at that line."""
    from trainverify_dsl.spec.errors import SpecError
    from trainverify_dsl.spec.load import ModelAccess, resolve_ref

    assert plan.spec is not None
    access = ModelAccess(base=path.resolve().parent, allow_outside_root=allow_outside_root)
    try:
        return resolve_ref(plan.spec.model, plan.spec.config, access)
    except SpecError as error:
        span = plan.spec.origin.span
        raise SpecError([replace(d, span=span, notes=d.notes + (
            f"the model reference is `{plan.spec.model}`",)) for d in error.diagnostics]) \
            from None


def _shrunk(plan: Plan, settings: dict[str, Any], model_ref: Any
            ) -> tuple[dict[str, Any], int, int]:
    from trainverify_dsl.shrink import ShrinkError, shrink_plan

    try:
        shrunk = shrink_plan(plan, settings, model_ref)
    except ShrinkError as error:
        assert plan.spec is not None
        raise SimulationSetupError([], f"{plan.spec.origin.span.file}: cannot shrink the "
                                       f"model: {error}; `tvp simulate --no-shrink` runs it "
                                       "at full size") from None
    return shrunk.overrides, shrunk.batch, shrunk.seq


def _plain(value: Any) -> Any:
    from fractions import Fraction

    if isinstance(value, Fraction):
        return int(value) if value.denominator == 1 else float(value)
    return value


# -- the layout pass as diagnostics (tvp lint --spec) ----------------------------------------


def at_spec_line(diagnostics: list[Diagnostic], path: str | Path) -> list[Diagnostic]:
    """Spec diagnostics about what the ``spec`` line names (a model reference ``nope.py:X``,
    a class or config the file lacks, a file that cannot be imported or constructed, bad
    input sizes, a file outside the roots: no line of the model's code) are moved to the
    plan's ``spec`` line, which is what the user edits; those at a line of the model's own
    code stay there."""
    from trainverify_dsl.spec.errors import names_the_reference

    try:
        plan = resolve_plan(path)
    except SimulationSetupError:
        return diagnostics
    if plan.spec is None:
        return diagnostics
    return [replace(d, span=plan.spec.origin.span,
                    notes=d.notes + (f"the model reference is `{d.span.file}`",))
            if names_the_reference(d) else d for d in diagnostics]


def layout_diagnostics(path: str | Path, *, allow_model_outside_root: bool = False,
                       progress: Progress | None = None) -> list[Diagnostic]:
    """Lower the plan at ``path`` (full size, fake tensors) and report its findings. The plan
    must lint clean first (syntax and plan checks); then every problem is a diagnostic.
    ``allow_model_outside_root``: see ``prepare``; ``progress`` hears each phase."""
    return _layout_pass(path, allow_model_outside_root, progress=progress or _quiet)[0]


def _layout_pass(path: str | Path, allow_model_outside_root: bool,
                 setup: SimulationSetup | None = None, progress: Progress | None = None
                 ) -> tuple[list[Diagnostic], Lowered | None]:
    """``layout_diagnostics`` and the full-size lowering it made (``None`` if none);
    ``setup``: the full-size fake model when the caller has built it already."""
    from trainverify_dsl.spec.errors import SpecError

    progress = progress or _quiet
    try:
        if setup is None:
            progress("building the model at full size on fake tensors")
            setup = prepare(path, shrink=False, real=False,
                            allow_model_outside_root=allow_model_outside_root)
    except SimulationSetupError as error:
        return list(error.diagnostics), None
    except SpecError as error:
        return at_spec_line(list(error.diagnostics), path), None
    plan = setup.plan
    fallback = plan.spec.origin.span if plan.spec else Span(str(path), 1, 1, 1, 1)
    progress("lowering every stage at full size (the layout pass)")
    try:
        lowered = lower(plan, setup.fake_model, setup.fake_inputs)
    except LoweringError as error:
        found = [to_diagnostic(f, fallback) for f in error.findings]
        if error.binding is None:
            return found, None
        progress("looking for sizes the model reads as numbers")
        return _size_reads(setup, error.binding, fallback) + found, None
    except SpecError as error:
        return at_spec_line(list(error.diagnostics), path), None
    progress("looking for sizes the model reads as numbers")
    return _size_reads(setup, lowered.binding, fallback) + \
        [to_diagnostic(f, fallback) for f in lowered.findings], lowered


def _size_reads(setup: SimulationSetup, binding: Any, fallback: Span) -> list[Diagnostic]:
    """TVP311 for every number of the model's arithmetic that follows the input sizes
    (``spec/sizes.py``) when the plan splits a dimension that changes with them: the trace
    holds the global size, a rank of a real run its own."""
    from trainverify_dsl.report.codes_spec import FIXED_COUNT_ALONG_SPLIT, SIZE_READ
    from trainverify_dsl.spec.load import model_input_specs
    from trainverify_dsl.spec.sizes import size_reads
    from trainverify_dsl.spec.trace import stack_span

    plan = setup.plan
    assert plan.spec is not None
    model = setup.fake_model
    split = {(name, dim): axes for name, layout in binding.data_layouts.items()
             for dim, axes in layout.dim_axes if axes}
    if plan.microbatches > 1:  # microbatches cut dimension 0 of every batched input (4.1)
        for name in setup.input_specs:
            if name not in binding.unbatched:
                split[(name, 0)] = ("microbatches",) + tuple(split.get((name, 0), ()))
    # a size that changes no split dimension is not traced (nothing to report for it)
    reads = size_reads(model, lambda b, s: model_input_specs(model, b, s),
                       plan.spec.batch or 1, plan.spec.seq or 1,
                       wanted=lambda changed: any(k in split for k in changed))
    found, seen = [], set()
    for read, changed in reads:
        hit = sorted((name, dim, axes) for (name, dim), axes in split.items()
                     if (name, dim) in changed)
        if not hit or (read.op, read.frame, read.value) in seen:
            continue  # (a number following batch and seq both is one finding)
        seen.add((read.op, read.frame, read.value))
        notes = tuple(f"the plan splits dimension {dim} of `{name}` over {', '.join(axes)}"
                      for name, dim, axes in hit)
        if read.fixed:
            found.append(Diagnostic(
                FIXED_COUNT_ALONG_SPLIT, f"`{read.op}` cuts a dimension that grows with the "
                f"inputs into {read.value:g} groups (still {read.value:g} when the inputs "
                "grow): the checked program gives the view its local sizes, but each rank of "
                f"a real run cuts its own rows into {read.value:g} groups, so the step checked "
                "would not be the step run",
                stack_span(read.frame) if read.frame else fallback, notes,
                help="fix the size of a group instead of their number (`view(-1, 4, d)`), "
                     "or do not split that dimension"))
            continue
        found.append(Diagnostic(
            SIZE_READ, f"`{read.op}` computes with {read.value:g}, a size of the inputs read "
            f"in Python (it is {read.doubled:g} when the inputs grow): the trace holds the "
            "global size, but each rank of a split batch or sequence reads its own, so the "
            "step checked would not be the step run",
            stack_span(read.frame) if read.frame else fallback, notes,
            help="compute the normaliser from tensors (`loss.mean()`, a count of the "
                 "labels) instead of `x.shape[0]`, `len(x)` or `x.numel()`"))
    return found


# -- tvp simulate ---------------------------------------------------------------------------


def spec_optimizer(plan: Plan, model: Any = None) -> optim.Recipe | None:
    """The reference step's optimizer: the plan's ``spec-optimizer`` recipe, with its
    parameter groups (§6.5) over ``model``'s parameters, or ``None``."""
    opt = plan.spec_optimizer
    if opt is None:
        return None
    default = optim.optimizer_config(opt.kind, dict(opt.hyper), opt.clip)
    if not plan.spec_param_groups:
        return default
    if model is None:
        raise ValueError("the spec's parameter groups need the model's parameters")
    names = [name for name, _ in model.named_parameters()]
    groups = tuple((frozenset(n for n in names if group_of(plan.spec_param_groups, n) is g),
                    optim.optimizer_config(opt.kind, dict(g.optimizer.hyper), opt.clip))
                   for g in plan.spec_param_groups)
    return optim.Groups(default, groups)


def over_budget(plan: Any, need: Estimate, budget: int, shrunk: bool) -> Diagnostic:
    """TVP501 at the ``mesh`` line, with the estimate and what to do."""
    advice = "raise the budget with --max-memory, or use fewer ranks" if shrunk else \
        "simulate with shrunk widths (the default, without --no-shrink), raise the budget " \
        "with --max-memory, or use fewer ranks"
    advice += "; a model of your own shrinks only the fields its class lists in `WIDTHS` " \
        "(docs/models.md)"
    return Diagnostic(
        OVER_BUDGET, f"simulating this plan would need {need.describe()}, above the budget "
        f"of {human(budget)}", plan.mesh.span,
        ("estimated from the lowered program's types before anything is allocated",), advice)


class ShrinkingLostDivisibility(RuntimeError):
    """The plan lowers at full size but not at its shrunk sizes: a bug of the shrinking rule,
    never a finding about the plan (an internal error, exit 2)."""


#: Called with the name of each phase of a long command as it starts (the CLI shows it on a
#: terminal, ``cli/progress.py``); the drivers never print.
Progress = Callable[[str], None]


def _quiet(phase: str) -> None:
    del phase


def step_values(program: ParallelProgram, reference: Any, model: Any, seed: int = 0,
                few: bool = False) -> dict[str, np.ndarray]:
    """The random inputs both programs run on (``seed``): parameters, optimizer states,
    data, buffers (``simulate.run.random_inputs``, ``few``: its second draw) and the states
    only the plan reads."""
    rng = np.random.default_rng(seed if not few else [seed, 1])
    values = random_inputs(reference.program.inputs, model, rng, reference.program, few)
    plan_states(program, values, rng)
    return values


def count_dependent(program: ParallelProgram) -> bool:
    """Whether the plan divides its loss by the blocks' own token counts or by a fixed number
    where the spec divides by the step's count (TVP415): right only for inputs whose blocks
    count alike, which the first draw may be."""
    return bool(program.loss.local_counts) or program.loss.fixed_count


def _extended(reference: Any, values: Mapping[str, np.ndarray], progress: Progress
              ) -> dict[str, np.ndarray]:
    """The reference step in extended precision (``simulate.run.Roundoff``)."""
    from trainverify_dsl.ir.interp import EXTENDED
    from trainverify_dsl.ir.program import evaluate_program

    progress("evaluating the reference step in extended precision (float64 round-off)")
    return evaluate_program(reference.program, values, EXTENDED)


def second_draw(program: ParallelProgram, reference: Any, reference_opt: Any, model: Any,
                seed: int, progress: Progress = _quiet
                ) -> tuple[dict[str, np.ndarray], SimulationResult] | None:
    """For a plan that ``count_dependent`` and agreed at the first draw: both programs again
    on inputs whose blocks count differently (``COUNT_DRAW``); their values and result
    when they differ there, else ``None``."""
    from trainverify_dsl.simulate.run import COUNT_DRAW

    if not count_dependent(program):
        return None
    progress("drawing again: integer inputs from {0, 1}, so that the blocks count differently")
    values = step_values(program, reference, model, seed, few=True)
    want = final_outputs(reference.evaluate(values))
    if not all(np.all(np.isfinite(np.asarray(v, dtype=float))) for v in want.values()):
        return None  # the spec's own step is undefined there (no token counted at all)
    result = simulate_programs(program, reference, reference_opt, model, seed, progress,
                               values)
    if result.agrees:
        return None
    result.draw = COUNT_DRAW
    return values, result


def simulate_programs(program: ParallelProgram, reference: Any,
                      reference_opt: Any, model: Any, seed: int = 0,
                      progress: Progress = _quiet,
                      values: dict[str, np.ndarray] | None = None) -> SimulationResult:
    """Both programs on the same random values (``values``, else ``step_values`` of
    ``seed``), then the named checks."""
    problems = parallel_problems(program)
    if problems:
        raise AssertionError("invalid parallel program: " + "; ".join(problems[:5]))
    if values is None:
        values = step_values(program, reference, model, seed)
    progress("evaluating the reference step")
    try:
        want = reference.evaluate(values)
    except IndexError:
        vocab = model_vocab(model) or 2
        ranges = input_ranges(reference.program, vocab)
        unheld_mask(unheld_masks(input_masks(model, reference.program, ranges or vocab),
                                 ranges, vocab), model)
        raise
    # the reference IR against eager torch first: a verdict on a wrong reference is no verdict
    progress("checking the reference step against eager torch")
    data = [g.name for g in reference.program.inputs if g.kind == "data"]
    roundoff = Roundoff(want, lambda: _extended(reference, values, progress))
    check_reference(want, model, values, data, reference_opt, TOLERANCE, FLOOR, roundoff)
    progress(f"evaluating the parallel program on {program.world_size:,} ranks and comparing")
    result = compare_programs(program, want, values, reference_opt, roundoff)
    return _masked_loss_hint(result, program, reference, model)


def unheld_mask(found: dict[str, tuple[int, int]], model: Any) -> None:
    """After the step indexed a table out of range: TVP312 (a ``SpecError`` at the ``spec``
    line) when a masked integer input holds a value past the rows it was drawn below
    (``simulate.run.unheld_masks``: ``found``), the model comparing a constant with values
    along a shrunk width."""
    import inspect

    from trainverify_dsl.report.codes_spec import SHRUNK_BELOW_CONSTANT
    from trainverify_dsl.spec.errors import fail

    if not found:
        return
    name, (value, high) = sorted(found.items())[0]
    try:
        where = inspect.getsourcefile(type(model)) or ""
    except TypeError:
        where = ""
    raise fail(SHRUNK_BELOW_CONSTANT,
               f"the model tests `{name}` against {value} and indexes a table with it there, "
               f"but at the widths simulated `{name}` indexes {high} rows: {value} is no row, "
               "so the masked entries cannot be drawn",
               notes=("the widths were shrunk (docs/semantics.md §9); a width a model lists in "
                      "`WIDTHS` must be used only as a size, and a pad label inside the "
                      "vocabulary ties a constant to it",),
               where=where,
               help="drop that width from the model class's `WIDTHS` (it is then kept at "
                    "its size), or run `tvp simulate --no-shrink`")


def _masked_loss_hint(result: SimulationResult, program: ParallelProgram, reference: Any,
                      model: Any) -> SimulationResult:
    """A loss that differs under the default ``local-mean`` while labels are drawn masked
    (the model's ``masked_inputs()``, or torch's ``cross_entropy`` ignoring -100 unasked):
    the reading says why each rank's count is its own, and what states the token mean."""
    from dataclasses import replace as renew

    from trainverify_dsl.simulate.run import input_masks, input_ranges, model_vocab

    first = result.first
    if result.agrees or first is None or first.tensor != "loss" or result.reading is None \
            or program.loss.mode != "local-mean":
        return result
    ranges = input_ranges(reference.program, model_vocab(model) or 2)
    masked = [f"`{name}` at {' and '.join(str(v) for v in values)}" for name, values in
              sorted(input_masks(model, reference.program, ranges).items())]
    masked += [f"`{g.name}` false at some positions" for g in reference.program.inputs
               if g.kind == "data" and g.type.dtype == "bool"]
    if not masked:
        return result
    inputs = ", ".join(masked)
    result.reading = renew(result.reading, text=(
        f"{result.reading.text}; the inputs were drawn masked ({inputs}: masked positions do "
        "not count), so under the default `loss-reduction local-mean` each rank divides by "
        "its own token count: for the step's mean state `loss-reduction token-mean`"))
    return result


@dataclass
class Programs:
    """What ``tvp simulate`` and ``tvp check`` compare: the plan's parallel program and the
    reference step at the (shrunk) sizes, with what was found on the way."""

    setup: SimulationSetup
    program: ParallelProgram
    #: the traced reference step (``spec.trace.SpecTrace``-like: ``program``, ``evaluate``)
    spec: Any
    reference_opt: Any
    #: the full-size layout pass's diagnostics
    findings: list[Diagnostic]
    idle: dict[str, int]
    estimated_bytes: int
    #: the plan's stages were split at every block (``build_programs(blocks=True)``)
    segmented: bool = False
    #: the layout pass's findings and full-size lowering (``build_programs(layout=...)``)
    layout: tuple[list[Diagnostic], Lowered | None] | None = None
    #: the plan's microbatch count, when the programs run fewer (``build_programs(fewer=
    #: True)``, ``shrink.fewer_microbatches``); why they do not, when the plan forbids it
    microbatches_of_plan: int | None = None
    same_microbatches_why: str = ""
    #: the data-parallel axes the programs run at ``shrink.CHECKED_RANKS`` ranks, with the
    #: plan's sizes (``build_programs(ranks=True)``, ``shrink.fewer_ranks``); why not, when
    #: an axis splitting the batch may not be
    ranks_of_plan: dict[str, int] = field(default_factory=dict)
    same_ranks_why: str = ""


def build_programs(path: str | Path, *, shrink: bool | None = None,
                   allow_model_outside_root: bool = False, stop_on_errors: bool = True,
                   max_memory: int | None = None, progress: Progress = _quiet,
                   blocks: bool = False, segment: bool = True,
                   layout: tuple[list[Diagnostic], Lowered | None] | None = None,
                   earlier: Programs | None = None, fewer: bool = False,
                   ranks: bool | None = None, _ranks_why: str = "",
                   _microbatches_why: str = "") -> Programs:
    """The layout pass at full size, then the plan's parallel program and the reference step
    at the shrunk sizes (``simulate_file`` explains the arguments and errors). The reference
    step is traced block by block (one graph per distinct block, every block traced and
    compared: ``exact_reuse``). ``blocks`` (``tvp check``): the plan is lowered with
    every block's boundaries marked (identities), so a value crossing stages between blocks
    is known by its point and the proof can be cut there (``check/stages.py``); with
    ``segment`` each stage is also split into one stage per block, on the same ranks
    (``lower.bind.segment_stages``), where the plan allows it. ``layout``: the layout
    pass's findings and lowering when the caller has them already (``Programs.layout``).
    ``earlier``: a build of the same plan file at the same sizes (``tvp check`` lowers the
    plan again unsegmented to report a difference): its layout pass, setup and idle axes are
    reused, and its reference step too when the new program reads the same marked points.
    ``fewer`` (``tvp check``): the programs run ``shrink.CHECKED_MICROBATCHES`` microbatches
    where the plan's meaning allows (``shrink.fewer_microbatches``; docs/checking.md).
    ``ranks`` (``None``: as ``fewer``): each data-parallel axis runs ``shrink.CHECKED_RANKS``
    ranks where the plan's meaning allows (``shrink.fewer_ranks``, docs/checking.md)."""
    from trainverify_dsl.shrink import work_refusal

    plan = resolve_plan(path)
    refusal = work_refusal(plan)  # from the plan alone: ranks, microbatches
    if refusal is not None:
        raise SimulationSetupError([refusal])
    budget = default_budget() if max_memory is None else max_memory
    full = _refuse_unshrunk(path, budget, allow_model_outside_root) if shrink is False \
        else None
    if earlier is not None:
        layout = earlier.layout
    if layout is None:
        progress("layout pass at full size")
        layout = _layout_pass(path, allow_model_outside_root, full)
    findings, full_size = layout
    errors = [d for d in findings if d.severity is Severity.ERROR]
    if errors and (stop_on_errors or full_size is None and any(
            d.code.id.startswith("TVP3") for d in errors)):
        # a model that cannot be built, traced or found at its full size is not simulated
        # at any size (its errors are the answer, at the spec line or the model's own line)
        raise SimulationSetupError(findings)
    counts: tuple[int | None, str] = (None, _microbatches_why)
    axes: tuple[dict[str, int], str] = ({}, _ranks_why)
    again = functools.partial(build_programs, path, shrink=shrink,
                              allow_model_outside_root=allow_model_outside_root,
                              stop_on_errors=stop_on_errors, max_memory=max_memory,
                              progress=progress, blocks=blocks, segment=segment, layout=layout)
    if earlier is not None:  # its plan is already without its idle axes
        setup, idle = earlier.setup, earlier.idle
        counts = (earlier.microbatches_of_plan, earlier.same_microbatches_why)
        axes = (earlier.ranks_of_plan, earlier.same_ranks_why)
    else:
        if fewer:
            counts = _fewer_microbatches(path, plan)
        if fewer if ranks is None else ranks:
            axes = _fewer_ranks(path, plan, counts[0] is not None)
        sizes = dict.fromkeys(axes[0], CHECKED_RANKS)
        if counts[0] is not None:
            sizes["microbatches"] = CHECKED_MICROBATCHES
        progress("shrinking the model's widths")
        try:
            setup = prepare(path, shrink=shrink, real=False,
                            allow_model_outside_root=allow_model_outside_root, sizes=sizes)
        except SimulationSetupError as error:
            if not sizes:
                raise
            # the full-size plan shrinks (the layout pass ran), the reduced one does not
            return _without_reductions(again, counts, axes, str(error))
        setup.plan, idle = without_idle_axes(setup.plan)
    from trainverify_dsl.spec.fx_import import UnsupportedOps
    from trainverify_dsl.spec.trace import trace_training_step, unsupported_error

    reference_opt = spec_optimizer(setup.plan, setup.fake_model)
    shrunk = bool(setup.overrides)
    # fewer microbatches or ranks than the plan's, chosen here (not an earlier build's sizes)
    reduced = earlier is None and (counts[0] is not None or bool(axes[0]))
    progress("lowering the plan to its parallel program")
    try:
        # at full size and with no idle axis the plan is the one the layout pass lowered
        marked, block_list = _block_modules(setup.fake_model) if blocks else (frozenset(), None)
        lowered = None
        if block_list is not None and segment:  # every block a stage of its own
            try:
                lowered = lower(setup.plan, setup.fake_model, setup.fake_inputs, marked,
                                block_list)
            except LoweringError:
                lowered = None
            if lowered is not None and (not lowered.binding.segmented or
                                        len(lowered.findings) > len(findings)):
                lowered = None
        if lowered is None:
            lowered = full_size if full_size is not None and not shrunk and not idle and \
                not marked else lower(setup.plan, setup.fake_model, setup.fake_inputs, marked)
    except LoweringError as error:
        if errors:  # the full-size plan's own errors say what is wrong, where
            raise SimulationSetupError(findings) from None
        if not shrunk and not reduced:
            raise
        message = "; ".join(f.message for f in error.findings)
        if reduced:  # the reduced sizes lost a divisibility the plan's have
            return _without_reductions(again, counts, axes, message)
        raise ShrinkingLostDivisibility(f"the plan lowers at full size but not at the shrunk "
                                        f"sizes {setup.overrides}: {message}") from None
    if (shrunk or reduced) and len(lowered.findings) > len(findings):
        message = "; ".join(f.message for f in lowered.findings)
        if reduced:
            return _without_reductions(again, counts, axes, message)
        raise ShrinkingLostDivisibility(f"the shrunk plan (sizes {setup.overrides}) has "
                                        f"findings the full-size plan has not: {message}")
    try:
        program = parallel_program(lowered)
    except UnsupportedOps as error:  # an op of the plan's stages with no IR meaning (dropout)
        raise unsupported_error(error) from None
    refusal = fewer_ranks_refusal(program, axes[0]) if axes[0] else None
    if refusal is not None:
        # the argument for fewer ranks needs every rank of the axis to run the same programs
        # and the ranks' gradients summed once: a program that does not runs every rank
        shown = ", ".join(f"`{a}`" for a in axes[0])
        return again(fewer=fewer, ranks=False, _ranks_why=f"{shown}: {refusal}",
                     _microbatches_why=counts[1])
    if counts[0] is not None and _reads_microbatch_index(program):
        # the argument for fewer microbatches needs every microbatch to run the same
        # programs: one that reads its index is run with every microbatch
        return again(fewer=False, ranks=bool(axes[0]), _ranks_why=axes[1],
                     _microbatches_why="a stage program reads the microbatch index")
    points = reference_points(program)
    if earlier is not None and reference_points(earlier.program) == points:
        spec = earlier.spec  # the same model, sizes, optimizer and points
    else:
        progress("tracing the reference step")
        # block by block, every block exported and each distinct one differentiated once
        # (spec/fx_key.py): the same values as one flat trace, a fraction of its cost
        spec = trace_training_step(setup.fake_model, setup.input_specs, reference_opt,
                                   reuse=True, exact_reuse=True, points=points)
    need = estimate(program, [g.type for g in spec.program.inputs], spec.program)
    if need.bytes > budget:
        raise SimulationSetupError([over_budget(setup.plan, need, budget, shrunk)])
    return Programs(setup, program, spec, reference_opt, findings, idle, need.bytes,
                    lowered.binding.segmented, layout, *counts, *axes)


def _without_reductions(again: Callable[..., Programs], counts: tuple[int | None, str],
                        axes: tuple[dict[str, int], str], message: str) -> Programs:
    """The programs built again with every microbatch and rank: the plan shrinks and lowers
    at its own sizes (the layout pass ran) but not with fewer microbatches or ranks (a batch
    of 6 over `dp=3` and 2 microbatches has no room for `dp=2` and 2: no new divisibility
    is made up), so the reductions are not taken and the verdict's notes say why."""
    why = f"the plan does not shrink or lower with them: {message}"
    shown = ", ".join(f"`{a}`" for a in axes[0])
    return again(fewer=False, ranks=False,
                 _ranks_why=f"{shown}: {why}" if axes[0] else axes[1],
                 _microbatches_why=why if counts[0] is not None else counts[1])


def _reads_microbatch_index(program: ParallelProgram) -> bool:
    """Whether a stage program reads the microbatch coordinate (``coord.@mb``)."""
    return any(s.kind == "coord" and s.spec == MICROBATCH_AXIS
               for st in program.stages for s in st.inputs)


def same_block_data(program: ParallelProgram, values: dict[str, np.ndarray],
                    axes: Iterable[str]) -> dict[str, np.ndarray]:
    """``values`` with the integer and boolean data (token ids, labels, masks) of every block
    along ``axes`` (``@mb``, the microbatches, and data-parallel axes run at fewer ranks) the
    first block's, the blocks along other axes untouched: the checker's fewer microbatches
    and ranks prove each block's step for one draw of them (docs/checking.md, "Fewer
    microbatches", "Fewer data-parallel ranks"). Float inputs stay variables of the proof.
    Dimension 0 is cut as its layout says (Rule 4.1: microbatch-major, the data axes next,
    outermost first)."""
    sizes = {**dict(program.mesh), MICROBATCH_AXIS: program.microbatches}
    tiled = set(axes)
    layouts = {s.spec: s.layout for st in program.stages for s in st.inputs
               if s.kind == "data" and s.layout.rank}
    out = dict(values)
    for name, layout in layouts.items():
        value = np.asarray(values.get(name))
        if name not in values or np.issubdtype(value.dtype, np.floating):
            continue
        # dimension 0 as (blocks of each factor's axes..., the factor's rows) per factor
        shape: list[int] = []
        keep: list[int] = []
        for factor in layout.dims[0]:
            blocks = [sizes[a] for a in factor.axes]
            keep += [len(shape) + k for k, a in enumerate(factor.axes) if a in tiled]
            shape += blocks + [factor.size // math.prod(blocks)]
        if math.prod(shape) != value.shape[0]:
            # the proof's argument needs the blocks equal: never a silently weaker proof
            raise ValueError(f"input {name!r}: dimension 0 of {value.shape[0]} rows is not "
                             f"cut into blocks as its layout says ({layout.dims[0]})")
        if keep:
            cut = value.reshape(*shape, *value.shape[1:])
            first = cut[tuple(slice(0, 1) if k in keep else slice(None)
                              for k in range(len(shape)))]
            out[name] = np.broadcast_to(first, cut.shape).reshape(value.shape).copy()
    return out


def _fewer_microbatches(path: str | Path, plan: Plan) -> tuple[int | None, str]:
    """(the plan's count, "") when its programs may run ``CHECKED_MICROBATCHES``
    microbatches; (None, why not) when the plan has more and forbids it; (None, "") when it
    has no more."""
    from trainverify_dsl.shrink import fewer_microbatches

    if plan.microbatches <= CHECKED_MICROBATCHES:
        return None, ""
    try:
        reduced = resolve_plan(path, {"microbatches": CHECKED_MICROBATCHES})
    except SimulationSetupError:
        reduced = None
    why = fewer_microbatches(plan, reduced)
    return (None, why) if why is not None else (plan.microbatches, "")


def _fewer_ranks(path: str | Path, plan: Plan, microbatches: bool
                 ) -> tuple[dict[str, int], str]:
    """({axis: the plan's size}, "") for the data-parallel axes whose programs may run
    ``CHECKED_RANKS`` ranks as far as the plan's statements tell (``shrink.data_axis_refusal``,
    ``shrink.fewer_ranks``; the program is checked after lowering); ({}, why not) when an
    axis splitting an input's batch may not. ``microbatches``: the programs run
    ``CHECKED_MICROBATCHES`` microbatches too."""
    from trainverify_dsl.shrink import data_axis_refusal, fewer_ranks

    if plan.mesh is None:
        return {}, ""
    busy, _ = without_idle_axes(plan)
    # axes splitting the batch: dimension 0 of a one-name target (a model input; which
    # ones are inputs the program tells, ``fewer_ranks_refusal``)
    batch_axes = {a for layout in plan.layouts
                  if not layout.target.grad and len(layout.target.segments) == 1
                  for dim, axes in layout.dim_axes if dim == 0 for a in axes}
    axes: dict[str, int] = {}
    whys = []
    for axis in busy.mesh.axes:
        if axis.size <= CHECKED_RANKS or axis.name not in batch_axes:
            continue
        why = data_axis_refusal(plan, axis.name)
        if why is None:
            axes[axis.name] = axis.size
        else:
            whys.append(f"`{axis.name}`: {why}")
    if axes:
        sizes = dict.fromkeys(axes, CHECKED_RANKS)
        if microbatches:
            sizes["microbatches"] = CHECKED_MICROBATCHES
        try:
            reduced = resolve_plan(path, sizes)
        except SimulationSetupError:
            reduced = None
        why = fewer_ranks(plan, reduced, axes)
        if why is not None:
            whys.append(f"{', '.join(f'`{a}`' for a in axes)}: {why}")
            axes = {}
    return axes, "; ".join(whys)


def _block_modules(model: Any) -> tuple[frozenset[str], str | None]:
    """Every block of the spec's block list (``spec.trace.find_block_list``) and the list's
    path, or none."""
    from trainverify_dsl.spec.trace import find_block_list

    found = find_block_list(model)
    if found is None:
        return frozenset(), None
    path, blocks = found
    return frozenset(f"{path}.{k}" for k in range(len(blocks))), path


def _refuse_unshrunk(path: str | Path, budget: int, allow_model_outside_root: bool
                     ) -> SimulationSetup:
    """At full size the reference step alone holds every parameter and its gradient in
    float64 (16 bytes a parameter): a model whose parameters already exceed the budget that
    way is refused (TVP501) from the fake model, before the full-size layout pass and the
    lowering (a minute for an 8B model) run. Returns the full-size setup for that pass."""
    setup = prepare(path, shrink=False, real=False,
                    allow_model_outside_root=allow_model_outside_root)
    count = sum(p.numel() for p in setup.fake_model.parameters())
    floor = 16 * count
    if floor > budget:
        need = Estimate(setup.plan.mesh.total_devices if setup.plan.mesh else 1, floor,
                        (("parameters and gradients of the reference step alone", floor),))
        diagnostic = over_budget(setup.plan, need, budget, shrunk=False)
        raise SimulationSetupError([replace(
            diagnostic, message=diagnostic.message.replace("would need about",
                                                           "would need at least"),
            notes=(f"{count:,} parameters counted on the fake (meta) model, before the "
                   "layout pass and before anything is allocated",))])
    return setup


def simulate_file(path: str | Path, *, seed: int = 0, shrink: bool | None = None,
                  allow_model_outside_root: bool = False,
                  stop_on_errors: bool = True, max_memory: int | None = None,
                  progress: Progress = _quiet) -> SimulationResult:
    """Raises ``SimulationSetupError`` (with diagnostics when the plan has errors at full
    size, or its estimated memory exceeds ``max_memory`` bytes: TVP501) or ``SpecError``.
    ``shrink``: ``None`` shrinks large models, ``True`` always, ``False`` never
    (``prepare``). ``allow_model_outside_root``: see ``prepare``. ``stop_on_errors=False``
    simulates a plan with full-size errors too (tests measure what a wrong plan computes); its
    ``findings`` then hold the errors. ``max_memory``: the budget in bytes (default: half of
    the machine's memory, ``simulate.budget``). Mesh axes no statement uses run at size 1.
    ``progress`` is told each phase as it starts."""
    built = build_programs(path, shrink=shrink, allow_model_outside_root=allow_model_outside_root,
                           stop_on_errors=stop_on_errors, max_memory=max_memory,
                           progress=progress)
    model = built.setup.build_real()
    result = simulate_programs(built.program, built.spec, built.reference_opt, model, seed,
                               progress)
    if result.agrees:
        again = second_draw(built.program, built.spec, built.reference_opt, model, seed,
                            progress)
        result = again[1] if again is not None else result
    result.sizes = dict(built.setup.overrides)
    result.idle_axes = built.idle
    result.estimated_bytes = built.estimated_bytes
    result.findings = built.findings
    return result


# -- tvp check ---------------------------------------------------------------------------------


def check_pair(built: Programs, values: dict[str, np.ndarray]) -> Any:
    """The ``check.pair.CheckPair`` of built programs: integer inputs known (``values``)."""
    from trainverify_dsl.check.pair import CheckPair
    from trainverify_dsl.ir.types import is_float
    from trainverify_dsl.simulate.run import recipe

    inputs = {g.name: (g.type.shape, g.type.dtype) for g in built.spec.program.inputs}
    for name, value in values.items():
        inputs.setdefault(name, (tuple(np.shape(value)), "f64"))
    known = {name: np.asarray(values[name]) for name, (_, dtype) in inputs.items()
             if not is_float(dtype)}
    witness = {name: np.asarray(values[name]) for name, (_, dtype) in inputs.items()
               if is_float(dtype) and name in values}
    return CheckPair(built.spec.program, built.program,
                     recipe(built.program, built.reference_opt), known, inputs,
                     dict(built.setup.overrides), witness,
                     built.spec.boundaries)


#: ``tvp check``'s default limit on one plan, in seconds (``--time-limit``)
TIME_LIMIT = 600.0


def check_file(path: str | Path, *, seed: int = 0, timeout: float = 60.0,
               allow_model_outside_root: bool = False, max_memory: int | None = None,
               progress: Progress = _quiet, time_limit: float | None = TIME_LIMIT,
               cache: bool = True, cache_dir: str | Path | None = None,
               fewer_microbatches: bool = True, fewer_ranks: bool = True) -> Any:
    """``tvp check``: prove the plan at ``path`` computes the spec's training step. Returns a
    ``check.verdict.Verdict``; never raises for a bad plan (its diagnostics are in the
    verdict). ``timeout``: seconds for each solver call. ``time_limit``: seconds for the
    whole plan (``None``: none); the phases before the proof (layout pass, lowering, numeric
    pre-check) are not interrupted, the proof stops where the limit finds it and the verdict
    is ``inconclusive``. ``cache``: read and write the proof cache (``check/cache.py``) in
    ``cache_dir`` (``None``: its default folder). ``fewer_microbatches``: prove a plan of
    more than two microbatches with two where its meaning allows (docs/checking.md, "Fewer
    microbatches"); ``False`` runs every microbatch. ``fewer_ranks``: likewise a data-parallel
    axis of more than two ranks with two ("Fewer data-parallel ranks")."""
    import time

    from trainverify_dsl.check.verdict import (
        COUNTEREXAMPLE,
        ERROR,
        INCONCLUSIVE,
        VERIFIED,
        Verdict,
        refused,
    )
    from trainverify_dsl.simulate.torch_step import ReferenceDisagrees
    from trainverify_dsl.spec.errors import SpecError

    _check_seed(seed)
    _check_seconds("timeout", timeout, positive=True)
    if time_limit is not None:
        _check_seconds("time_limit", time_limit, positive=False)
    start = time.perf_counter()
    verdict = Verdict(ERROR, str(path))
    built = None
    try:
        # always shrunk: the proof's cost grows with every width (the reduction keeps every
        # split's divisibility; docs/checking.md)
        built = build_programs(path, shrink=True, allow_model_outside_root=allow_model_outside_root,
                               stop_on_errors=False, max_memory=max_memory, progress=progress,
                               blocks=True, fewer=fewer_microbatches, ranks=fewer_ranks)
        verdict.sizes, verdict.idle_axes = dict(built.setup.overrides), dict(built.idle)
        verdict.microbatches = _microbatches_note(built)
        verdict.reduced_axes, verdict.ranks = dict(built.ranks_of_plan), _ranks_note(built)
        verdict.diagnostics = list(built.findings)
        model = built.setup.build_real()
        progress("numeric pre-check: both programs on random values")
        values = step_values(built.program, built.spec, model, seed)
        if built.microbatches_of_plan is not None or built.ranks_of_plan:
            values = same_block_data(built.program, values, [*built.ranks_of_plan] + (
                [MICROBATCH_AXIS] if built.microbatches_of_plan is not None else []))
        result = simulate_programs(built.program, built.spec, built.reference_opt, model,
                                   seed, progress, values)
        again = second_draw(built.program, built.spec, built.reference_opt, model, seed,
                            progress) if result.agrees else None
        few = again is not None
        if few:
            # a difference at any draw of the plan with fewer microbatches is one of the
            # plan's (docs/checking.md): its own draw stands
            values, result = again
        if not result.agrees and built.segmented:
            # a difference is reported on the plan's own stages, never on the split ones
            built = build_programs(path, shrink=True,
                                   allow_model_outside_root=allow_model_outside_root,
                                   stop_on_errors=False, max_memory=max_memory,
                                   progress=progress, blocks=True, segment=False,
                                   earlier=built)
            values = step_values(built.program, built.spec, model, seed, few)
            result = simulate_programs(built.program, built.spec, built.reference_opt, model,
                                       seed, progress, values)
            result.draw = again[1].draw if again is not None else ""
    except SimulationSetupError as error:
        verdict.diagnostics = list(error.diagnostics)
        verdict.reason = str(error) if not error.diagnostics else "the plan has errors"
        if error.diagnostics and all(d.code is OVER_BUDGET for d in error.diagnostics):
            verdict = refused(str(path), error.diagnostics)  # the work, not the meaning
    except SpecError as error:
        verdict.diagnostics = at_spec_line(list(error.diagnostics), path)
        verdict.reason = "the spec model has errors"
    except LoweringError as error:
        fallback = Span(str(path), 1, 1, 1, 1)
        verdict.diagnostics = [to_diagnostic(f, fallback) for f in error.findings]
        verdict.reason = "the plan cannot be lowered"
    except ReferenceDisagrees as error:
        verdict.reason = f"the reference step disagrees with eager torch: {error}"
    else:
        errors = [d for d in built.findings if d.severity is Severity.ERROR]
        if result.agrees and result.roundoff:
            verdict.notes.append(
                f"the numeric pre-check's float64 differences up to {result.roundoff:.3g} are "
                "the reference step's own round-off (docs/lowering.md); the proof is exact")
        if not result.agrees:
            verdict.verdict = COUNTEREXAMPLE
            small = _smaller(built, model, values, result, seed, progress)
            verdict.counterexample = _counterexample(small or result, seed)
            drawn = "inputs drawn from ±1/2, ±1" if small is not None else "random inputs"
            if result.draw:
                drawn += f"; {result.draw}"
            verdict.counterexample.inputs = drawn
            verdict.reason = "numeric evaluation of both programs differs (float64, " \
                             f"seed {seed}, {drawn})"
        elif errors:
            verdict.reason = "the layout pass reports errors; a plan with errors is not " \
                             "proven (numeric evaluation found no difference)"
        else:
            deadline = None if time_limit is None else start + time_limit
            folder = None
            if cache:
                from trainverify_dsl.check.cache import default_dir

                folder = Path(cache_dir) if cache_dir is not None else default_dir()
            _prove(verdict, check_pair(built, values), timeout, progress, deadline, folder)
            if built.segmented and verdict.verdict in (VERIFIED, INCONCLUSIVE):
                verdict.assumptions.append(
                    "stages: the program proven is the plan's with each stage split into one "
                    "stage per block (the same ops on the same ranks, the hidden state passed "
                    "within each rank; lower/bind.py segment_stages); the numeric pre-check "
                    "ran that program")
    if verdict.microbatches and verdict.verdict in (VERIFIED, INCONCLUSIVE, COUNTEREXAMPLE):
        verdict.assumptions.append(verdict.microbatches)
    elif built is not None and built.same_microbatches_why and verdict.verdict != ERROR:
        verdict.notes.append(f"all {built.program.microbatches} microbatches were run: "
                             f"{built.same_microbatches_why}")
    if verdict.ranks and verdict.verdict in (VERIFIED, INCONCLUSIVE, COUNTEREXAMPLE):
        verdict.assumptions.append(verdict.ranks)
    elif built is not None and built.same_ranks_why and verdict.verdict != ERROR:
        verdict.notes.append(f"every data-parallel rank was run: {built.same_ranks_why}")
    verdict.seconds = time.perf_counter() - start
    return verdict


def _microbatches_note(built: Programs) -> str:
    """What the verdict says of the microbatch count it was proven with ("": the plan's)."""
    full = built.microbatches_of_plan
    if full is None:
        return ""
    ran = built.program.microbatches
    return (f"microbatches: proven with {ran} of the plan's {full} microbatches: every "
            f"microbatch runs the same stage programs on its own rows, the gradient "
            f"statements sum them, and the seed times the count is the same at {ran} and "
            f"{full} (docs/checking.md, \"Fewer microbatches\"); the {ran} microbatches "
            f"carry the same drawn token ids, labels and masks, so each microbatch's step is "
            f"proven for those; a counterexample is one of the plan with {ran}")


def _ranks_note(built: Programs) -> str:
    """What the verdict says of the data-parallel axes it was proven with fewer ranks of
    ("": the plan's sizes)."""
    if not built.ranks_of_plan:
        return ""
    shown = ", ".join(f"{a}={CHECKED_RANKS} of the plan's {a}={n}"
                      for a, n in built.ranks_of_plan.items())
    return (f"data-parallel ranks: proven with {shown}: along it every rank runs the same "
            f"stage programs on its own rows, one gradient statement per parameter sums or "
            f"averages the ranks' gradients, a ZeRO shard over it is over it alone, and the seed "
            f"times the ranks and microbatches weighs every row the same at both sizes "
            f"(docs/checking.md, \"Fewer data-parallel ranks\"); every rank's rows carry the "
            f"same drawn token ids, labels and masks, so each block's step is proven for "
            f"those; a counterexample is one of the plan with the fewer ranks")


#: What a plan given as text is called in its verdict and diagnostics.
TEXT_PLAN = "<plan text>"


def check(plan: str | Path, *, base_dir: str | Path | None = None, **options: Any) -> Any:
    """The Python API of ``tvp check`` for tools that check many plans in a loop (an
    auto-parallel search): ``plan`` is a path (a ``Path``, or a ``str`` without a newline)
    or the plan's text (a ``str`` with one). Returns the ``check.verdict.Verdict``; never
    raises for a bad plan. ``options`` are ``check_file``'s. A plan text is written to a
    temporary file, in ``base_dir`` when given (so a ``spec`` path relative to that folder
    resolves) and removed afterwards; its diagnostics and counterexample name
    ``TEXT_PLAN``. An empty string is an (empty) plan text. Invalid options (a ``base_dir``
    that is no directory, a ``seed`` outside 0 to 2**32 - 1, a ``timeout`` that is not a
    positive number of seconds, a negative ``time_limit``) raise ``ValueError`` before any
    work."""
    import contextlib
    import os
    import tempfile

    if base_dir is not None and not Path(base_dir).is_dir():
        raise ValueError(f"base_dir {str(base_dir)!r} is not a directory")
    _check_seed(options.get("seed", 0))
    _check_seconds("timeout", options.get("timeout", 60.0), positive=True)
    if options.get("time_limit") is not None:
        _check_seconds("time_limit", options["time_limit"], positive=False)
    if isinstance(plan, Path) or ("\n" not in plan and plan):
        return check_file(plan, **options)
    place = contextlib.nullcontext(str(base_dir)) if base_dir is not None else \
        tempfile.TemporaryDirectory()
    with place as folder:
        handle, name = tempfile.mkstemp(suffix=".tvp", prefix=".tvp-check-", dir=folder)
        try:
            # a lone surrogate is written as the bytes it stands for: the plan then has an
            # encoding error at its place (TVP109), not a UnicodeEncodeError here
            with os.fdopen(handle, "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(plan)
            verdict = check_file(name, **options)
        finally:
            Path(name).unlink(missing_ok=True)
    return rename_plan(verdict, name, TEXT_PLAN)


def _check_seed(seed: Any) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be a whole number from 0 to 2**32 - 1 (numpy's seeds), "
                         f"got {seed!r}")


def _check_seconds(name: str, value: Any, positive: bool) -> None:
    """``ValueError`` unless ``value`` is a finite number of seconds (``positive``: above
    0, else at least 0), as the command line's ``--timeout`` and ``--time-limit`` take."""
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not number or not math.isfinite(value) or value < 0 or (positive and value == 0):
        kind = "a positive" if positive else "a non-negative"
        raise ValueError(f"{name} must be {kind} number of seconds, got {value!r}")


def rename_plan(verdict: Any, old: str, new: str) -> Any:
    """``verdict`` with every span in file ``old`` moved to file ``new``."""
    def move(span: Any) -> Any:
        return replace(span, file=new) if span is not None and span.file == old else span

    verdict.plan = new if verdict.plan == old else verdict.plan
    verdict.diagnostics = [replace(d, span=move(d.span)) for d in verdict.diagnostics]
    if verdict.counterexample is not None:
        verdict.counterexample = replace(verdict.counterexample,
                                         span=move(verdict.counterexample.span))
    verdict.reason = verdict.reason.replace(old, new)
    return verdict


def _smaller(built: Programs, model: Any, values: dict[str, np.ndarray],
             result: SimulationResult, seed: int, progress: Progress) -> SimulationResult | None:
    """The same difference at small inputs (``simulate.run.small_values``): both programs
    evaluated again there, kept when the first difference is the same tensor on the same rank
    by the same check. Not tried when the step orders computed values (top-k routing, sorts,
    argmax): small values tie, and a tie broken differently is no bug of the plan."""
    from trainverify_dsl.simulate.run import small_values

    graphs = [g for _, g in built.spec.program.graphs] + [st.graph for st in
                                                          built.program.stages]
    if any(node.op.startswith(("topk", "sort")) or node.op == "argmax"
           for graph in graphs for node in graph.nodes):
        return None
    first = result.first
    assert first is not None
    buffers = {g.name for g in built.spec.program.inputs if g.kind == "buffer"}
    small = small_values(values, buffers, np.random.default_rng(seed))
    progress("shrinking the counterexample towards small values")
    try:
        again = simulate_programs(built.program, built.spec, built.reference_opt, model,
                                  seed, progress, small)
    except Exception:  # noqa: BLE001 - the random-valued counterexample stands on its own
        return None
    other = again.first
    if again.agrees or other is None or (other.check, other.tensor, other.rank) != \
            (first.check, first.tensor, first.rank):
        return None
    return again


def _counterexample(result: SimulationResult, seed: int) -> Any:
    from trainverify_dsl.check.verdict import Counterexample

    first = result.first
    assert first is not None
    found = Counterexample(first.check, first.tensor, first.rank, first.rel_error, first.span,
                           first.detail, seed)
    reading = result.reading
    if reading is not None:
        found.reading, found.index = reading.text, reading.index
        found.spec_value, found.rank_values = reading.spec, reading.ranks
    return found


def _prove(verdict: Any, pair: Any, timeout: float, progress: Progress,
           deadline: float | None = None, cache: Path | None = None) -> None:
    from trainverify_dsl.check import cache as proofs
    from trainverify_dsl.check import reduce
    from trainverify_dsl.check.prove import Proof, prove
    from trainverify_dsl.check.verdict import (
        BASE_ASSUMPTIONS,
        ERROR,
        INCONCLUSIVE,
        VERIFIED,
    )

    unreduced = reduce.problem(pair) or _data_counts(pair.program)
    if unreduced is not None:
        verdict.verdict, verdict.reason = INCONCLUSIVE, unreduced
        verdict.assumptions = list(BASE_ASSUMPTIONS) + _assumptions(pair)
        return
    name = proofs.key(pair) if cache is not None else None
    counts = proofs.load(cache, name) if cache is not None and name is not None else None
    if counts is not None:
        proof, verdict.cached = Proof("proven", **counts), True
    else:
        proof = prove(pair, timeout, progress, deadline)
        if cache is not None and name is not None:
            proofs.store(cache, name, proof)
    verdict.assumptions = list(BASE_ASSUMPTIONS) + _assumptions(pair)
    if proof.assumed_orders:
        verdict.assumptions.append(
            f"orderings of computed values ({proof.assumed_orders} top-k routing, sort, "
            "argmax nodes or tests against a maximum, as amax's backward makes) take the "
            "order they have at the drawn values, every ranked value apart there: the proof "
            "holds wherever the routing (the largest entry) is the drawn one, not for every "
            "routing" + ("; a block proven by symmetry is proven under its representative's "
                         "drawn routing, not the one its own drawn values take"
                         if proof.merged_orders else ""))
    verdict.elements, verdict.by_normal_form = proof.elements, proof.by_normal_form
    verdict.by_expansion, verdict.by_solver = proof.by_expansion, proof.by_solver
    verdict.stages_total, verdict.stages_unique = proof.stages, proof.stages - proof.merged
    if proof.uncut:
        verdict.notes.append(proof.uncut)
    if proof.widened:
        verdict.notes.append(proof.widened)
    if proof.symmetry:
        verdict.notes.append(f"symmetry: {proof.symmetry}")
    if proof.status == "proven" and not proof.elements:
        verdict.verdict = INCONCLUSIVE
        verdict.reason = "nothing was compared (no loss, gradient or update to prove)"
    elif proof.status == "proven":
        verdict.verdict, verdict.stages_proven = VERIFIED, proof.stages
        staged = f" in {proof.stages} stages cut at block boundaries" if proof.stages > 1 \
            else ""
        if proof.merged:
            staged += f" ({proof.stages - proof.merged} distinct, the other {proof.merged} " \
                      f"proven by symmetry)"
        verdict.reason = f"{proof.elements:,} elements compared{staged}: " \
                         f"{proof.by_normal_form:,} " \
                         f"equal in normal form, {proof.by_expansion:,} by multiplying out, " \
                         f"{proof.by_solver:,} proven by z3" + \
                         (" (proven before: from the proof cache)" if verdict.cached else "")
    elif proof.status == "unsupported":
        verdict.verdict, verdict.reason = INCONCLUSIVE, proof.reason
    elif proof.status == "failed":  # the numeric checks passed: an internal inconsistency
        verdict.verdict, verdict.reason = ERROR, f"the symbolic checks failed where the " \
                                                 f"numeric ones held: {proof.reason}"
    else:
        verdict.verdict, verdict.reason = INCONCLUSIVE, proof.reason
        verdict.open = proof.open[:50]


def _data_counts(program: Any) -> str | None:
    """Why a loss the spec divides by a token count of the data is never verified under
    ``local-mean`` over split data (each block divides by its own count) or ``sum scale=s``
    (a fixed number): they equal the spec's loss only for inputs whose counts match (those
    drawn did: the numeric pre-check passed), so a proof would hold for the drawn masks
    alone (docs/semantics.md §4.3)."""
    if program.loss.fixed_count:
        return ("the spec's loss divides by a token count of the data, and `loss-reduction sum "
                "scale=...` divides by a fixed number: equal to the spec's loss only for inputs "
                "counting that many tokens, as the drawn inputs do (not every input); state "
                "`loss-reduction token-mean` for the step's count")
    axes = ["the microbatches" if a == MICROBATCH_AXIS else a for a in program.loss.local_counts]
    if not axes:
        return None
    return (f"the spec's loss divides by a token count of the data, and under the default "
            f"`loss-reduction local-mean` the blocks along {' and '.join(axes)} each divide by "
            "their own: equal to the spec's loss only where every block counts the same "
            "tokens, as the drawn inputs do (not every input); state `loss-reduction "
            "token-mean` for the step's count")


def _assumptions(pair: Any) -> list[str]:
    out = []
    from trainverify_dsl.check import reduce

    reduction = reduce.assumption(pair)
    if reduction is not None:
        out.append(reduction)
    if pair.known:
        names = ", ".join(sorted(pair.known))
        out.append(f"integer and boolean inputs take one drawn value each ({names}): the proof "
                   "holds for those token ids, labels and masks, not for every value")
    return out
