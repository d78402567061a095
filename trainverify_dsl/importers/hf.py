"""Hugging Face ``base_model_tp_plan`` / ``base_model_pp_plan`` -> a plan.

Input: a JSON file (a ``config.json``-like object holding ``base_model_tp_plan`` and/or
``base_model_pp_plan`` -- and the model-level ``_tp_plan``/``_pp_plan`` with ``lm_head`` --
or a bare tp plan ``{"layers.*.self_attn.q_proj": "colwise", ...}``), or a Python
configuration file (``configuration_llama.py``), whose class-level plan literals are read
without running it.

Keys name modules the way transformers matches them: relative to the base model (a
``model.`` prefix is accepted), with every layer number written ``*``. A key naming a layer by
its number never matches in transformers (it replaces numbers by ``*`` before looking up) and
is refused; so is a key naming a parameter (``.weight``): transformers 4 installs the style's
hooks on its module, transformers 5 only shards the parameter.

Each style has one transcription (``STYLES``, docs/importers.md gives the table with the
transformers classes it follows). Styles whose meaning differs between transformers releases
(``sequence_parallel``, ``colwise``/``rowwise`` on an embedding) or that the language cannot
state (``gather``: an in-place all-reduce of ``outputs[0]``, for a module returning one tensor
its first batch row) are refused with the reason.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainverify_dsl.importers import patterns
from trainverify_dsl.importers.common import (
    PIPELINE,
    TENSOR,
    ImportOptions,
    MeshRoles,
    Refusals,
    Refused,
    check_batch,
    data_parallel,
    even_division,
    plan_name,
)
from trainverify_dsl.importers.emit import Line, PlanDraft, pipeline_stages
from trainverify_dsl.importers.models import (
    CONTAINER,
    EMBEDDING,
    LINEAR,
    Module,
    ReferenceModel,
)
from trainverify_dsl.importers.source import (
    Node,
    is_python,
    quoted,
    read_class_attributes,
    read_json,
    read_text,
)
from trainverify_dsl.plan.messages import did_you_mean
from trainverify_dsl.report import codes_import as codes
from trainverify_dsl.report.diagnostics import Code

#: Keys of a config that hold plans (the config's and the model class's).
TP_KEYS = ("base_model_tp_plan", "_tp_plan", "tp_plan")
PP_KEYS = ("base_model_pp_plan", "_pp_plan", "pp_plan")


@dataclass(frozen=True, slots=True)
class NameMap:
    """Hugging Face module names of one architecture -> the reference model's."""

    model_type: str
    top: dict[str, str]
    layer: dict[str, str]
    #: config.json size keys -> configs.json keys, checked when present
    sizes: dict[str, str]


LLAMA_NAMES = NameMap(
    "llama",
    top={"embed_tokens": "embed", "norm": "norm", "lm_head": "output"},
    layer={"": "", "self_attn": "attention", "self_attn.q_proj": "attention.wq",
           "self_attn.k_proj": "attention.wk", "self_attn.v_proj": "attention.wv",
           "self_attn.o_proj": "attention.wo", "mlp": "feed_forward",
           "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
           "mlp.down_proj": "feed_forward.w2", "input_layernorm": "attention_norm",
           "post_attention_layernorm": "ffn_norm"},
    sizes={"num_hidden_layers": "n_layers", "hidden_size": "hidden",
           "intermediate_size": "ffn_hidden", "num_attention_heads": "n_heads",
           "num_key_value_heads": "n_kv_heads", "vocab_size": "vocab_size"},
)
NAME_MAPS = {"Llama": LLAMA_NAMES}


def _llama_rope_scaling(c: dict[str, object]) -> object:
    if c.get("rope_scaling_factor") is None:
        return None
    return {"rope_type": "llama3", "factor": c["rope_scaling_factor"],
            "low_freq_factor": c["rope_low_freq_factor"],
            "high_freq_factor": c["rope_high_freq_factor"],
            "original_max_position_embeddings": c["rope_original_max_seq_len"]}


#: config.json keys that change what the model computes, with the value the reference model
#: has (from its config's fields): a file stating another value describes another model,
#: and a plan imported from it would be checked against the wrong one.
MEANING: dict[str, dict[str, Callable[[dict[str, object]], object]]] = {
    "Llama": {
        "attention_bias": lambda c: False,
        "mlp_bias": lambda c: False,
        "hidden_act": lambda c: "silu",
        "head_dim": lambda c: int(c["hidden"]) // int(c["n_heads"]),  # type: ignore[call-overload]
        "rope_theta": lambda c: c["rope_theta"],
        "rms_norm_eps": lambda c: c["norm_eps"],
        "attention_dropout": lambda c: 0.0,
        "rope_scaling": _llama_rope_scaling,
    },
}


def _plain_node(node: Node) -> object:
    if isinstance(node.value, dict):
        return {k: _plain_node(v) for k, v in node.value.items()}
    if isinstance(node.value, tuple):
        return [_plain_node(v) for v in node.value]
    return node.value


def _same_meaning(stated: object, expected: object) -> bool:
    """Whether a config.json value states the reference's: numbers by value, and a
    ``rope_scaling`` object by the keys the reference has (``type`` is the older name of
    ``rope_type``)."""
    if isinstance(expected, dict):
        if not isinstance(stated, dict):
            return False
        stated = {("rope_type" if k == "type" else k): v for k, v in stated.items()}
        return all(_same_meaning(stated.get(k), v) for k, v in expected.items())
    if isinstance(expected, (int, float)) and not isinstance(expected, bool) and \
            isinstance(stated, (int, float)) and not isinstance(stated, bool):
        return float(stated) == float(expected)
    return stated == expected


@dataclass(frozen=True, slots=True)
class Target:
    """A module a key names: its reference table entry and its path in the plan."""

    module: Module
    path: str  # ``l.attention.wq`` (in a layer) or ``embed``
    in_layer: bool


@dataclass(frozen=True, slots=True)
class Context:
    target: Target
    axis: str
    feature_dim: int
    note: str


Builder = Callable[[Context], tuple[Line, ...]]


@dataclass(frozen=True, slots=True)
class Style:
    """One style string: its transcription per module kind, or why it is refused."""

    meaning: str
    builders: dict[str, Builder]
    refusal: tuple[Code, str] | None = None


def _colwise(c: Context) -> tuple[Line, ...]:
    return patterns.column_parallel(c.target.path, c.target.module.has_bias, c.axis, c.note)


def _colwise_gather(c: Context) -> tuple[Line, ...]:
    m = c.target.path
    return _colwise(c) + (Line(f"all-gather {m}.out over {c.axis} dim={c.feature_dim} "
                               "backward scatter", c.note),)


def _rowwise(c: Context) -> tuple[Line, ...]:
    return patterns.row_parallel(c.target.path, c.target.module.has_bias, c.axis, c.note)


def _rowwise_split(c: Context) -> tuple[Line, ...]:
    return (Line(f"scatter {c.target.path}.in over {c.axis} dim={c.feature_dim}", c.note),) \
        + _rowwise(c)


def _local_colwise(c: Context) -> tuple[Line, ...]:
    return patterns.split_rows(c.target.path, c.target.module.has_bias, c.axis, c.note)


def _local_rowwise(c: Context) -> tuple[Line, ...]:
    return patterns.split_columns(c.target.path, c.axis, c.note)


def _embedding_rowwise(c: Context) -> tuple[Line, ...]:
    return patterns.vocab_parallel_embedding(c.target.path, c.axis, None, c.note)


def _grad_all_reduce(c: Context) -> tuple[Line, ...]:
    return patterns.gradient_all_reduce(c.target.path, c.target.module.params, c.axis, c.note)


def _replicate(c: Context) -> tuple[Line, ...]:
    return patterns.replicated(c.target.path, c.target.module.params, c.axis, c.note)


def _all_reduce(c: Context) -> tuple[Line, ...]:
    return (Line(f"all-reduce {c.target.path}.out over {c.axis}", c.note),)


_WITH_PARAMS = ("norm", LINEAR, EMBEDDING)
_VERSIONED = ("its meaning differs between transformers releases: 4.x {v4}, 5.x {v5}; a "
              "style string cannot say which")
_MOE = "an expert-parallel or MLA style: the reference model has no such module"

#: Style name -> transcription, after transformers' ParallelInterface (4.5x and 5.x).
STYLES: dict[str, Style] = {
    "colwise": Style("ColwiseParallel: weight rows split, input replicated (backward "
                     "all-reduce), output split on the last dimension", {LINEAR: _colwise}),
    "colwise_rep": Style("ColwiseParallel(output_layouts=Replicate()): colwise, output "
                         "all-gathered (backward: keep the local block)",
                         {LINEAR: _colwise_gather}),
    "colwise_gather_output": Style("the 5.x name of colwise_rep", {LINEAR: _colwise_gather}),
    "rowwise": Style("RowwiseParallel: weight columns split, input split on the last "
                     "dimension, partial output all-reduced (bias added once)",
                     {LINEAR: _rowwise}),
    "rowwise_rep": Style("RowwiseParallel(input_layouts=Replicate()): the replicated input "
                         "is scattered first", {LINEAR: _rowwise_split}),
    "rowwise_split_input": Style("the 5.x name of rowwise_rep", {LINEAR: _rowwise_split}),
    "local_colwise": Style("ColwiseParallel(use_dtensor=False), 4.x: the weight is split "
                           "like colwise, no hook runs: no collective at all",
                           {LINEAR: _local_colwise}),
    "local_rowwise": Style("RowwiseParallel(use_dtensor=False), 4.x: the weight is split "
                           "like rowwise, no hook runs: the output stays partial and a "
                           "bias is added on every rank", {LINEAR: _local_rowwise}),
    "embedding_rowwise": Style("RowwiseParallel on an embedding, 5.x: vocabulary rows split, "
                               "local lookup, partial output all-reduced",
                               {EMBEDDING: _embedding_rowwise}),
    "replicated_with_grad_allreduce": Style(
        "parameters replicated, their gradients all-reduced",
        dict.fromkeys(_WITH_PARAMS, _grad_all_reduce)),
    "replicate": Style("ReplicateParallel, 4.x: parameters replicated, no collective",
                       dict.fromkeys(_WITH_PARAMS, _replicate)),
    "all_reduce": Style("AllReduceParallel, 5.x: the module's partial output all-reduced",
                        dict.fromkeys(_WITH_PARAMS + (CONTAINER,), _all_reduce)),
    "gather": Style("GatherParallel, 4.x", {}, (
        codes.INEXPRESSIBLE_PLAN,
        "GatherParallel all-reduces `outputs[0]` in place; for a module returning one tensor "
        "(as every reference module does) that is its first batch row only, which no "
        "statement can say")),
    "sequence_parallel": Style("SequenceParallel", {}, (
        codes.INEXPRESSIBLE_PLAN,
        _VERSIONED.format(v4="scatters the input along the sequence and all-gathers the "
                             "output", v5="takes the local input as a sequence shard and "
                                          "keeps the output local"))),
    "local": Style("IsolatedParallel", {}, (
        codes.UNSUPPORTED_IMPORT, "IsolatedParallel runs a module on local tensors with "
                                  "module-specific code; there is no general transcription")),
    "isolated": Style("IsolatedParallel", {}, (codes.UNSUPPORTED_IMPORT, "as 'local'")),
    **{name: Style("packed weights", {}, (
        codes.INEXPRESSIBLE_PLAN, "it splits a fused weight ([gate; up]) in interleaved "
                                  "halves; the reference model's projections are separate "
                                  "modules")) for name in ("packed_colwise", "packed_rowwise",
                                                           "local_packed_rowwise")},
    **{name: Style("MoE / MLA", {}, (codes.UNSUPPORTED_IMPORT, _MOE))
       for name in ("ep_router", "grouped_gemm", "moe_tp_experts", "megamoe_router",
                    "megamoe_experts", "moe_identity_expert", "mla_kv_a_proj")},
}
_VERSIONED_ON_EMBEDDING = {
    "colwise": _VERSIONED.format(v4="splits the vocabulary rows", v5="splits the hidden "
                                 "columns"),
    "rowwise": _VERSIONED.format(v4="splits the hidden columns", v5="splits the vocabulary "
                                 "rows (use embedding_rowwise)"),
}


@dataclass(frozen=True, slots=True)
class HfPlans:
    """The plans found in the file, each with the node it was read from."""

    tp: list[tuple[str, Node]]
    pp: Node | None
    config: Node | None


def import_hf(path: str, options: ImportOptions, refusals: Refusals) -> PlanDraft:
    model = options.config.model
    names = NAME_MAPS.get(model.cls)
    if names is None:
        raise refusals.stop(codes.UNSUPPORTED_IMPORT, f"no Hugging Face module names are "
                            f"known for the reference model {model.cls}")
    plans = _read_plans(path, refusals)
    if plans.config is not None:
        _check_config(plans.config, names, options, refusals)
    mesh = MeshRoles(options.mesh or ())
    targets = _tp_targets(plans.tp, names, model, refusals)
    if targets and mesh.tp == 1:
        refusals.add(codes.INCONSISTENT_DEGREES, "the file has a tensor-parallel plan but "
                     "the mesh has no tp axis", plans.tp[0][1],
                     help="give the tensor-parallel degree with --mesh, e.g. --mesh tp=2")
    before, layer, after = _transcribe(targets, model, refusals)
    stages = _stages(plans.pp, names, model, mesh, options, refusals)
    if refusals:
        raise Refused()
    batch_axes, gradients = data_parallel(mesh)
    check_batch(options, refusals, options.batch or 0,
                math.prod(mesh.size(a) for a in batch_axes), options.microbatches or 1)
    return PlanDraft(
        name=plan_name(options, _stem(path)),
        comments=(f"Imported by `tvp import hf` from {_name(path)}.",
                  "Transformers' tensor-parallel styles, transcribed as docs/importers.md "
                  "says."),
        config=options.config, batch=options.batch or 0, seq=options.seq,
        mesh=mesh.axes, optimizer=options.optimizer,
        microbatches=options.microbatches or 1, schedule=options.schedule,
        batch_axes=batch_axes, stages=stages, before=before,
        layers=(layer,) * options.config.n_layers if model.layer_list else (),
        after=after, gradients=gradients)


def _stem(path: str) -> str:
    return Path(path).stem


def _name(path: str) -> str:
    return Path(path).name


# ---------------------------------------------------------------- reading


def _read_plans(path: str, refusals: Refusals) -> HfPlans:
    from trainverify_dsl.importers.source import Unreadable

    try:
        text = read_text(path)
        if is_python(path):
            found = read_class_attributes(text, path, frozenset(TP_KEYS + PP_KEYS))
            return _plans_of(found, None, refusals, path)
        root = read_json(text, path)
    except Unreadable as error:
        refusals.items.append(error.diagnostic)
        raise Refused() from None
    if not root.is_object:
        raise refusals.stop(codes.MALFORMED_IMPORT, "expected a JSON object: a tp plan or a "
                            "config holding base_model_tp_plan", root)
    holders = {key: node for key, node in root.items() if key in TP_KEYS + PP_KEYS}
    if holders:
        return _plans_of(holders, root, refusals, path)
    return HfPlans(list(root.items()), None, None)


def _plans_of(found: dict[str, Node], config: Node | None, refusals: Refusals,
              path: str) -> HfPlans:
    tp: list[tuple[str, Node]] = []
    pp: Node | None = None
    for key, node in found.items():
        if node.value is None:
            continue
        if not node.is_object:
            raise refusals.stop(codes.MALFORMED_IMPORT, f"{key} must be a dict", node)
        if key in TP_KEYS:
            tp += list(node.items())
        elif pp is not None:
            refusals.add(codes.MALFORMED_IMPORT, f"a second pipeline plan ({key})", node)
        else:
            pp = node
    if not tp and pp is None:
        raise refusals.stop(codes.MALFORMED_IMPORT, f"{path} holds no tp or pp plan")
    return HfPlans(tp, pp, config)


def _show(value: object) -> str:
    """A value as JSON writes it (``true``, ``null``)."""
    return json.dumps(value, sort_keys=False)


def _check_config(config: Node, names: NameMap, options: ImportOptions,
                  refusals: Refusals) -> None:
    """Sizes the config states must be the reference config's."""
    model_type = config.get("model_type")
    if model_type is not None and model_type.value != names.model_type:
        refusals.add(codes.INCONSISTENT_DEGREES, f"model_type {quoted(str(model_type.value))} "
                     f"is not the reference model's ({names.model_type})", model_type)
    tied = config.get("tie_word_embeddings")
    if tied is not None and tied.value is True:
        refusals.add(codes.INCONSISTENT_DEGREES, "tie_word_embeddings is true, but the "
                     "reference model's output head is untied", tied)
    for key, ours in names.sizes.items():
        node = config.get(key)
        expected = options.config.n_layers if ours == "n_layers" else \
            options.config.sizes.get(ours)
        if node is not None and node.value is not None and (
                isinstance(node.value, bool) or not isinstance(node.value, int)):
            refusals.add(codes.MALFORMED_IMPORT, f"{key} is {json.dumps(node.value)}, not a "
                         "whole number", node)
        elif node is not None and node.value is not None and node.value != expected:
            refusals.add(codes.INCONSISTENT_DEGREES, f"{key} is {node.value}, but the config "
                         f"{options.config.name} has {ours} {expected}", node,
                         help="pick the --config whose sizes are the file's")
    reference = {**options.config.sizes, "n_layers": options.config.n_layers}
    for key, meaning in MEANING.get(options.config.model.cls, {}).items():
        node = config.get(key)
        if node is None:
            continue
        try:
            expected = meaning(reference)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue  # the reference config does not say: nothing to compare
        if not _same_meaning(_plain_node(node), expected):
            refusals.add(codes.INCONSISTENT_DEGREES, f"{key} is {_show(_plain_node(node))}, "
                         f"but the reference model {options.config.name} has "
                         f"{_show(expected)}: the file "
                         "describes another model", node,
                         help="the plan would be checked against the reference model; "
                              "import a config of that model")


# ---------------------------------------------------------------- tensor parallel


def _tp_targets(entries: list[tuple[str, Node]], names: NameMap, model: ReferenceModel,
                refusals: Refusals) -> list[tuple[Target, str, Node, str]]:
    """``(target, style, node, key)`` for every key that maps; refusals for the others."""
    found: list[tuple[Target, str, Node, str]] = []
    seen: dict[str, str] = {}
    for key, node in entries:
        if not isinstance(node.value, str):
            refusals.add(codes.MALFORMED_IMPORT, f"the style of {quoted(key)} must be a "
                         "string", node)
            continue
        target = _target(key, node, names, model, refusals)
        if target is None:
            continue
        if target.path in seen:
            refusals.add(codes.MALFORMED_IMPORT, f"{quoted(key)} names the same module as "
                         f"{quoted(seen[target.path])}", node.key_or_value_span)
            continue
        seen[target.path] = key
        found.append((target, node.value, node, key))
    return found


def _target(key: str, node: Node, names: NameMap, model: ReferenceModel,
            refusals: Refusals) -> Target | None:
    name = key.removeprefix("model.")
    if name.startswith("layers."):
        head, _, rest = name.removeprefix("layers.").partition(".")
        if head.isdigit():
            refusals.add(codes.INEXPRESSIBLE_PLAN, f"{quoted(key)} names layer {head} by its "
                         "number; transformers replaces layer numbers by '*' before looking a "
                         "module up, so this rule never applies", node.key_or_value_span,
                         help=f"write layers.*.{rest}" if rest else None)
            return None
        if head == "*":
            return _mapped(key, rest, names.layer, model.in_layer, True, node, refusals)
    return _mapped(key, name, names.top, model.top, False, node, refusals)


def _mapped(key: str, name: str, table: dict[str, str], lookup: Callable[[str], Module | None],
            in_layer: bool, node: Node, refusals: Refusals) -> Target | None:
    ours = table.get(name)
    if ours is None:
        stem, _, leaf = name.rpartition(".")
        if leaf in ("weight", "bias") and stem in table:
            refusals.add(codes.INEXPRESSIBLE_PLAN, f"{quoted(key)} names a parameter; "
                         "transformers 4.x installs the style's hooks on its module, 5.x "
                         "only shards the parameter", node.key_or_value_span,
                         help=f"name the module: {quoted(key.rsplit('.', 1)[0])}")
            return None
        known = [f"layers.*.{n}" if in_layer else n for n in table if n]
        hint = did_you_mean(key, known)
        refusals.add(codes.UNMAPPED_MODULE, f"no module of the reference model corresponds "
                     f"to {quoted(key)}" + (f"; {hint}" if hint else ""),
                     node.key_or_value_span, notes=["the mapped names are: " + ", ".join(known)])
        return None
    module = lookup(ours)
    assert module is not None, ours
    path = ("l." + ours if ours else "l") if in_layer else ours
    return Target(module, path, in_layer)


def _transcribe(targets: list[tuple[Target, str, Node, str]], model: ReferenceModel,
                refusals: Refusals) -> tuple[tuple[Line, ...], tuple[Line, ...],
                                             tuple[Line, ...]]:
    """Lines before, inside and after the layers, in the reference model's module order."""
    by_path = {t.path: (t, style, node, key) for t, style, node, key in targets}
    order = [m.path for m in model.before] + \
        [("l." + m.path if m.path else "l") for m in model.layer] + [m.path for m in model.after]
    groups: dict[str, list[Line]] = {"before": [], "layer": [], "after": []}
    for path in order:
        if path not in by_path:
            continue
        target, style, node, key = by_path[path]
        lines = _style_lines(target, style, node, key, model, refusals)
        where = "layer" if target.in_layer else \
            "before" if model.top(path) in model.before else "after"
        groups[where] += lines
    return tuple(groups["before"]), tuple(groups["layer"]), tuple(groups["after"])


def _style_lines(target: Target, style_name: str, node: Node, key: str, model: ReferenceModel,
                 refusals: Refusals) -> tuple[Line, ...]:
    style = STYLES.get(style_name)
    if style is None:
        hint = did_you_mean(style_name, STYLES)
        refusals.add(codes.UNKNOWN_STYLE, f"unknown tensor-parallel style {quoted(style_name)}"
                     + (f"; {hint}" if hint else ""), node,
                     notes=["known styles: " + ", ".join(sorted(STYLES))])
        return ()
    if style.refusal is not None:
        code, reason = style.refusal
        refusals.add(code, f"{quoted(key)}: {style_name}: {reason}", node)
        return ()
    kind = target.module.kind
    if kind == EMBEDDING and style_name in _VERSIONED_ON_EMBEDDING:
        refusals.add(codes.INEXPRESSIBLE_PLAN, f"{quoted(key)}: {style_name} on an embedding: "
                     f"{_VERSIONED_ON_EMBEDDING[style_name]}", node)
        return ()
    builder = style.builders.get(kind)
    if builder is None:
        refusals.add(codes.INEXPRESSIBLE_PLAN, f"{quoted(key)}: {style_name} applies to "
                     f"{' or '.join(sorted(style.builders))} modules, and "
                     f"{target.path.removeprefix('l.')} is a {kind}", node)
        return ()
    note = f"{key}: {style_name}"
    return builder(Context(target, TENSOR, model.feature_dim, note))


# ---------------------------------------------------------------- pipeline


def _stages(pp: Node | None, names: NameMap, model: ReferenceModel, mesh: MeshRoles,
            options: ImportOptions, refusals: Refusals) -> tuple[tuple[str, ...], ...]:
    if pp is not None:
        _check_pp_plan(pp, names, model, refusals)
    if not mesh.has(PIPELINE):
        return ()
    if pp is None:
        refusals.add(codes.MALFORMED_IMPORT, "the mesh has a pp axis but the file has no "
                     "base_model_pp_plan", help="remove pp from --mesh, or import a config "
                     "that has a pipeline plan")
        return ()
    division = even_division(options, refusals, mesh.pp, pp)
    return pipeline_stages(options.config, division)


def _check_pp_plan(pp: Node, names: NameMap, model: ReferenceModel, refusals: Refusals) -> None:
    """Every entry is ``[[inputs], [outputs]]`` of a mapped top-level module, in forward
    order, and the layers are among them (they are what is split)."""
    table = {**names.top, "layers": model.layer_list or ""}
    order = [m.path for m in model.before] + [model.layer_list or ""] + \
        [m.path for m in model.after]
    positions: list[tuple[int, str, Node]] = []
    for key, node in pp.items():
        ours = table.get(key.removeprefix("model."))
        if ours is None:
            hint = did_you_mean(key, table)
            refusals.add(codes.UNMAPPED_MODULE, f"no module of the reference model "
                         f"corresponds to the pipeline entry {quoted(key)}"
                         + (f"; {hint}" if hint else ""), node.key_or_value_span)
            continue
        if not _io_lists(node):
            refusals.add(codes.MALFORMED_IMPORT, f"the pipeline entry {quoted(key)} must be "
                         "[[input names], [output names]]", node)
        positions.append((order.index(ours), key, node))
    if [p for p, _, _ in positions] != sorted(p for p, _, _ in positions):
        refusals.add(codes.INEXPRESSIBLE_PLAN, "the pipeline plan lists its modules out of "
                     "forward order", pp)
    if "layers" not in {k.removeprefix("model.") for _, k, _ in positions}:
        refusals.add(codes.MALFORMED_IMPORT, "the pipeline plan does not list the layers",
                     pp)


def _io_lists(node: Node) -> bool:
    value = node.value
    return isinstance(value, tuple) and len(value) == 2 and all(
        isinstance(part.value, tuple) and all(isinstance(n.value, str) for n in part.value)
        for part in value)
