"""The shared emitter: a ``PlanDraft`` (what an importer understood) -> canonical plan text.

An importer fills a draft with plain statement lines: the header settings, the statements
before, inside and after the layers, the gradient synchronisation. Statements of one layer
are written once per layer, relative to the loop variable ``l`` (``apply column_parallel(
l.attention.wq, tp)``); the emitter groups layers whose statements are identical into one
*kind*, writes one template per kind and one ``for`` loop per kind over its layer ranges:

    template llama_layer(l):
        apply column_parallel(l.attention.wq, tp)  # layers.*.self_attn.q_proj: colwise
        ...

    for l in layers:
        apply llama_layer(l)

Each line may carry a note, written as a trailing comment: the foreign key or setting it
came from. The text is then put in canonical form by the project's formatter and linted
(``plan.resolve_plan_file``, no torch): a draft that does not format or lint clean is an
importer bug, reported by the caller as an internal error, never written.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from trainverify_dsl.importers.models import ReferenceConfig
from trainverify_dsl.report.diagnostics import Diagnostic, Severity

#: Longest note kept in a comment (a foreign key can be long).
NOTE_LIMIT = 90
STDLIB_TEMPLATES = "stdlib/megatron.tvp"
#: Width of the header comment's text (after "# "), within the project's 100 columns.
COMMENT_WIDTH = 96


@dataclass(frozen=True, slots=True)
class Line:
    """One statement (``text``) and where it came from (``note``)."""

    text: str
    note: str = ""


@dataclass(frozen=True, slots=True)
class PlanDraft:
    name: str
    #: comment lines for the top of the file (source, assumptions)
    comments: tuple[str, ...]
    config: ReferenceConfig
    batch: int
    seq: int
    #: (axis, size), outermost first
    mesh: tuple[tuple[str, int], ...]
    #: ``sgd lr=0.01``: the plan's optimizer and the reference step's recipe
    optimizer: str | None = None
    optimizer_shard: tuple[str, ...] = ()
    microbatches: int = 1
    schedule: str | None = None
    #: axes the model inputs are split over along the batch
    batch_axes: tuple[str, ...] = ()
    #: modules of each pipeline stage (``embed``, ``layers[0:2]``); empty: no pipeline
    stages: tuple[tuple[str, ...], ...] = ()
    before: tuple[Line, ...] = ()
    #: one tuple per layer, statements about ``l``
    layers: tuple[tuple[Line, ...], ...] = ()
    after: tuple[Line, ...] = ()
    gradients: tuple[Line, ...] = ()


@dataclass(frozen=True, slots=True)
class Emitted:
    """The canonical text, or ``None`` with the diagnostics that stopped it."""

    text: str | None
    problems: tuple[Diagnostic, ...]
    #: the unformatted text, for the internal-error report
    draft_text: str


def emit(draft: PlanDraft, display: str) -> Emitted:
    """Write, format and lint ``draft``; ``display`` names the plan in diagnostics."""
    from trainverify_dsl.parse import format_source, parse_source
    from trainverify_dsl.plan import resolve_plan_file

    raw = plan_text(draft)
    formatted = format_source(raw, display)
    if formatted.text is None:
        return Emitted(None, formatted.diagnostics, raw)
    parsed = parse_source(formatted.text, display)
    assert parsed.plan_file is not None
    resolved = resolve_plan_file(parsed.plan_file)
    errors = tuple(d for d in resolved.diagnostics if d.severity is Severity.ERROR)
    return Emitted(None if errors else formatted.text, errors, raw)


def plan_text(draft: PlanDraft) -> str:
    sections = [_header(draft), _inputs(draft), _stages(draft), _lines(draft.before),
                _layers(draft), _lines(draft.after), _lines(draft.gradients),
                _optimizer(draft)]
    return "\n\n".join(s for s in sections if s) + "\n"


def _header(draft: PlanDraft) -> str:
    model = draft.config.model
    lines = [f"# {line}" for c in draft.comments
             for line in textwrap.wrap(_comment(c, limit=None), COMMENT_WIDTH)] or []
    lines += [f"plan {draft.name}",
              f'spec "{model.spec}" config {draft.config.name} batch {draft.batch} '
              f"seq {draft.seq}"]
    if draft.optimizer:
        lines.append(f"spec-optimizer {draft.optimizer}")
    lines.append("mesh " + ", ".join(f"{axis}={size}" for axis, size in draft.mesh))
    if draft.microbatches > 1:
        schedule = f" schedule {draft.schedule}" if draft.schedule else ""
        lines.append(f"microbatches {draft.microbatches}{schedule}")
        lines.append("loss-scale 1/microbatches")
    if _uses_templates(draft):
        lines.append(f'use "{STDLIB_TEMPLATES}"')
    return "\n".join(lines)


def _uses_templates(draft: PlanDraft) -> bool:
    every = draft.before + draft.after + tuple(x for layer in draft.layers for x in layer)
    return any(line.text.startswith("apply ") for line in every)


def _inputs(draft: PlanDraft) -> str:
    """Every model input of the reference models is [batch, ...] with two dimensions."""
    if not draft.batch_axes:
        return ""
    axes = draft.batch_axes[0] if len(draft.batch_axes) == 1 else \
        "(" + ", ".join(draft.batch_axes) + ")"
    return "\n".join(f"split {name} [{axes}, -]" for name in draft.config.model.inputs)


def _stages(draft: PlanDraft) -> str:
    return "\n".join(f"pipeline-stage {index}: " + ", ".join(modules)
                     for index, modules in enumerate(draft.stages))


def _lines(lines: tuple[Line, ...], indent: str = "") -> str:
    return "\n".join(indent + line.text + (f"  # {_comment(line.note)}" if line.note else "")
                     for line in lines)


def _optimizer(draft: PlanDraft) -> str:
    if not draft.optimizer:
        return ""
    shard = " shard over " + ", ".join(draft.optimizer_shard) if draft.optimizer_shard else ""
    return f"optimizer {draft.optimizer}{shard}"


def _layers(draft: PlanDraft) -> str:
    """One template per kind of layer and one loop per kind."""
    kinds: dict[tuple[Line, ...], list[int]] = {}
    for index, statements in enumerate(draft.layers):
        if statements:
            kinds.setdefault(statements, []).append(index)
    prefix = draft.config.model.cls.lower() + "_layer"
    blocks = []
    for number, (statements, indices) in enumerate(kinds.items(), start=1):
        name = prefix if len(kinds) == 1 else f"{prefix}_{number}"
        ranges = _ranges(indices, len(draft.layers), draft.config.model.layer_list or "layers")
        blocks.append(f"template {name}(l):\n{_lines(statements, '    ')}\n\n"
                      f"for l in {ranges}:\n    apply {name}(l)")
    return "\n\n".join(blocks)


def _ranges(indices: list[int], count: int, layer_list: str) -> str:
    """``layers`` for all of them, else maximal runs as slices: ``layers[0:2], layers[3:4]``."""
    if indices == list(range(count)):
        return layer_list
    runs: list[tuple[int, int]] = []
    for index in indices:
        if runs and runs[-1][1] == index:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return ", ".join(f"{layer_list}[{start}:{end}]" for start, end in runs)


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")


def _comment(text: str, limit: int | None = NOTE_LIMIT) -> str:
    """Text for a comment: control characters escaped, cut to ``limit`` characters."""
    clean = _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return clean if limit is None or len(clean) <= limit else clean[:limit - 1] + "…"


def pipeline_stages(config: ReferenceConfig, division: tuple[int, ...]) -> tuple[
        tuple[str, ...], ...]:
    """Stage module lists for layer counts ``division`` (one per stage, summing to the layer
    count): the modules before the layers on the first stage, those after and the loss on the
    last."""
    model = config.model
    stages: list[list[str]] = []
    start = 0
    for count in division:
        stage = [f"{model.layer_list}[{start}:{start + count}]"] if count else []
        stages.append(stage)
        start += count
    stages[0][:0] = [m.path for m in model.before]
    stages[-1] += [m.path for m in model.after] + ["loss"]
    return tuple(tuple(s) for s in stages)
