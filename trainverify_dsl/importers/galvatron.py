"""A Galvatron hybrid-parallel strategy (its ``galvatron_config_*.json``) -> a plan.

The JSON gives, per transformer layer, the tensor-parallel degree (``tp_sizes_enc``), whether
its groups are consecutive ranks (``tp_consecutive_flags``), the data-parallel type
(``dp_types_enc``: 0 the ``default_dp_type``, 1 ZeRO-3), Ulysses sequence parallelism
(``use_sp``), context parallelism (``cp_sizes_enc``) and activation checkpointing
(``checkpoint``); and globally the pipeline (``pp_deg``, ``pp_division``, ``pipeline_type``,
``chunks``), the batch (``global_bsz``) and the vocabulary modules (``vtp``, ``vsp``,
``embed_sdp``). It does not give the device count (``--world-size``), the sequence length,
the model, whether Megatron sequence parallelism was switched on (Galvatron's
``--sequence-parallel`` training flag) or the optimizer: those are options.

Galvatron's layers are Megatron-style (fused qkv column parallel, split by heads, the same as
wq/wk/wv column parallel; the output projection row parallel; the MLP column then row), so
the layer template uses stdlib/megatron.tvp. One plan has one mesh: degrees that differ
between layers are refused, and so is a vocabulary degree other than the layers' (Galvatron
then moves activations between two strategies). Checkpointing recomputes the same values
and has no statement; it is noted in the plan's header.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainverify_dsl.importers.common import (
    DATA,
    PIPELINE,
    TENSOR,
    ImportOptions,
    Refusals,
    Refused,
    check_batch,
    plan_name,
)
from trainverify_dsl.importers.emit import Line, PlanDraft, pipeline_stages
from trainverify_dsl.importers.models import ReferenceConfig
from trainverify_dsl.importers.source import Node, Unreadable, quoted, read_json, read_text
from trainverify_dsl.plan.messages import did_you_mean
from trainverify_dsl.report import codes_import as codes
from trainverify_dsl.report.span import Span

SCHEDULES = {"gpipe": "gpipe", "pipedream_flush": "1f1b"}
DP_TYPES = ("ddp", "zero2", "zero3")
#: Per-layer keys, and the value that means "off" where the importer refuses anything else.
PER_LAYER = ("tp_sizes_enc", "tp_consecutive_flags", "dp_types_enc", "use_sp", "checkpoint",
             "cp_sizes_enc")


@dataclass(frozen=True, slots=True)
class Strategy:
    """The strategy after reading and checking, one value per setting."""

    pp: int
    tp: int
    dp: int
    consecutive: bool
    dp_type: str
    division: tuple[int, ...]
    microbatches: int
    schedule: str | None
    batch: int
    vocab_parallel: bool
    checkpointed: tuple[int, ...]


def import_galvatron(path: str, options: ImportOptions, refusals: Refusals) -> PlanDraft:
    config = _read(path, refusals)
    reader = _Reader(config, options.config, refusals)
    strategy = reader.strategy(options)
    if refusals:
        raise Refused()
    assert strategy is not None
    mesh = _mesh(strategy)
    if options.mesh is not None and tuple(options.mesh) != mesh:
        raise refusals.stop(codes.INCONSISTENT_DEGREES, "--mesh "
                            + ",".join(f"{a}={n}" for a, n in options.mesh)
                            + " is not the strategy's mesh "
                            + ",".join(f"{a}={n}" for a, n in mesh), config)
    return _draft(path, options, strategy, mesh, refusals)


def _read(path: str, refusals: Refusals) -> Node:
    try:
        root = read_json(read_text(path), path)
    except Unreadable as error:
        refusals.items.append(error.diagnostic)
        raise Refused() from None
    if not root.is_object:
        raise refusals.stop(codes.MALFORMED_IMPORT, "expected a JSON object", root)
    return root


def _mesh(s: Strategy) -> tuple[tuple[str, int], ...]:
    """Pipeline stages are the outermost blocks of ranks; inside a stage, consecutive
    tensor-parallel groups put tp innermost."""
    inner = ((DATA, s.dp), (TENSOR, s.tp)) if s.consecutive else ((TENSOR, s.tp), (DATA, s.dp))
    axes = tuple((a, n) for a, n in ((PIPELINE, s.pp),) + inner if n > 1)
    return axes or ((DATA, 1),)


class _Reader:
    """Typed access to the JSON's keys, every problem a refusal at the key."""

    def __init__(self, root: Node, config: ReferenceConfig, refusals: Refusals) -> None:
        self.root = root
        self.config = config
        self.refusals = refusals

    def strategy(self, options: ImportOptions) -> Strategy | None:
        layers = {key: self.per_layer(key) for key in PER_LAYER}
        pp = self.integer("pp_deg")
        batch = self.integer("global_bsz")
        chunks = self.integer("chunks")
        if self.refusals:
            return None
        # integer() returns None only after a refusal
        assert pp is not None and batch is not None and chunks is not None
        tp = self.uniform("tp_sizes_enc", layers["tp_sizes_enc"], "tensor-parallel degree")
        consecutive = self.uniform("tp_consecutive_flags", layers["tp_consecutive_flags"],
                                   "tensor-parallel group order") if tp and tp > 1 else 1
        self.refuse_set("use_sp", layers["use_sp"], 0, codes.UNSUPPORTED_IMPORT,
                        "Ulysses sequence parallelism is not imported yet")
        self.refuse_set("cp_sizes_enc", layers["cp_sizes_enc"], 1, codes.UNSUPPORTED_IMPORT,
                        "context parallelism is not imported yet")
        dp_type = self.dp_type(layers["dp_types_enc"])
        vocab = self.vocabulary(tp or 1, options)
        schedule = self.schedule(pp, chunks)
        division = self.division(pp)
        self.options_agree(options, chunks, schedule, division)
        dp = self.data_parallel(options, pp, tp or 1)
        if self.refusals or None in (tp, consecutive, dp_type, vocab, division, dp):
            return None
        assert tp is not None and dp is not None and division is not None
        self.batch(options, batch, dp, chunks)
        checkpointed = tuple(i for i, f in enumerate(layers["checkpoint"] or ()) if f)
        return Strategy(pp, tp, dp, consecutive == 1 or tp == 1, dp_type or "ddp", division,
                        chunks, schedule, batch, bool(vocab), checkpointed)

    # ---------------------------------------------------------------- values

    def node(self, key: str) -> Node | None:
        return self.root.get(key)

    def missing(self, key: str) -> None:
        start = self.root.span
        self.refusals.add(codes.MALFORMED_IMPORT, f"the strategy has no {key}",
                          Span.point(start.file, start.line, start.col),
                          help=f"Galvatron's JSON states {key}; add it")

    def integer(self, key: str, optional: bool = False) -> int | None:
        node = self.node(key)
        if node is None:
            if not optional:
                self.missing(key)
            return None
        if isinstance(node.value, bool) or not isinstance(node.value, int) or node.value < 1:
            self.refusals.add(codes.MALFORMED_IMPORT, f"{key} must be a positive integer, "
                              f"not {quoted(json_text(node.value))}", node)
            return None
        return node.value

    def per_layer(self, key: str) -> tuple[int, ...] | None:
        """A comma-separated string with one integer per layer."""
        node = self.node(key)
        if node is None:
            if key in ("tp_sizes_enc", "tp_consecutive_flags", "dp_types_enc"):
                self.missing(key)
            return None
        values = _integers(node.value)
        if values is None:
            self.refusals.add(codes.MALFORMED_IMPORT, f"{key} must be a string of "
                              "comma-separated integers, one per layer", node)
            return None
        if len(values) != self.config.n_layers:
            self.refusals.add(codes.INCONSISTENT_DEGREES, f"{key} has {len(values)} entries, "
                              f"but {self.config.name} has {self.config.n_layers} layers", node)
            return None
        return values

    def uniform(self, key: str, values: tuple[int, ...] | None, what: str) -> int | None:
        if values is None:
            return None
        if len(set(values)) > 1:
            self.refusals.add(codes.INEXPRESSIBLE_PLAN, f"{key} gives the layers different "
                              f"{what}s ({_runs(values)}); a plan has one mesh, so every "
                              "layer uses the same degree and group order", self.node(key))
            return None
        if key == "tp_sizes_enc" and values[0] < 1:
            self.refusals.add(codes.MALFORMED_IMPORT, f"{key}: a degree must be positive",
                              self.node(key))
            return None
        return values[0]

    def refuse_set(self, key: str, values: tuple[int, ...] | None, off: int, code,
                   why: str) -> None:
        if values is not None and any(v != off for v in values):
            self.refusals.add(code, f"{key} is set for {_layers(values, off)}: {why}",
                              self.node(key))

    def dp_type(self, per_layer: tuple[int, ...] | None) -> str | None:
        node = self.node("default_dp_type")
        if node is None:
            self.missing("default_dp_type")
            return None
        if node.value not in DP_TYPES:
            hint = did_you_mean(str(node.value), DP_TYPES)
            self.refusals.add(codes.UNKNOWN_STYLE, f"unknown default_dp_type "
                              f"{quoted(str(node.value))}" + (f"; {hint}" if hint else ""),
                              node)
            return None
        zero3 = node.value == "zero3" or (per_layer is not None and any(per_layer))
        if zero3:
            where = node if node.value == "zero3" else self.node("dp_types_enc")
            self.refusals.add(codes.INEXPRESSIBLE_PLAN, "ZeRO-3 shards the parameters "
                              "between uses and gathers them for each; the plan language "
                              "has no statement for gathering parameters", where)
            return None
        return str(node.value)

    def vocabulary(self, tp: int, options: ImportOptions) -> bool | None:
        """``True``: the embedding and output head are vocab-parallel over tp."""
        vtp = self.integer("vtp")
        for key, why in (("vsp", "Ulysses sequence parallelism of the vocabulary modules"),
                         ("embed_sdp", "ZeRO-3 of the embedding")):
            node = self.node(key)
            if node is not None and node.value not in (0, False, None):
                self.refusals.add(codes.UNSUPPORTED_IMPORT, f"{key} is set: {why} is not "
                                  "imported", node)
        if vtp is None:
            return None
        if vtp not in (1, tp) or (vtp == 1 and tp > 1):
            self.refusals.add(codes.UNSUPPORTED_IMPORT, f"vtp {vtp} with layers at tensor "
                              f"degree {tp}: Galvatron moves the activations between the "
                              "vocabulary strategy and the layers' one, which is not "
                              "imported; only vtp equal to the layers' degree is", self.node("vtp"))
            return None
        if options.sequence_parallel and self.config.model.cls != "Llama" and tp > 1:
            self.refusals.add(codes.UNSUPPORTED_IMPORT, "Megatron sequence parallelism is "
                              f"transcribed for Llama only, not {self.config.model.cls}")
            return None
        return vtp > 1

    def options_agree(self, options: ImportOptions, chunks: int, schedule: str | None,
                      division: tuple[int, ...] | None) -> None:
        """Command-line options the strategy states itself must say the same (the strategy
        is what Galvatron ran; an option silently overridden would be a plan not asked
        for); ``--loss-parallel`` is not Galvatron's."""
        given = [("chunks", options.microbatches, chunks, "--microbatches"),
                 ("pipeline_type", options.schedule, schedule or "none (one microbatch)",
                  "--schedule"),
                 ("pp_division", options.pp_division, division, "--pp-division")]
        for key, option, stated, flag in given:
            if option is not None and stated is not None and option != stated:
                shown = ",".join(map(str, option)) if isinstance(option, tuple) else option
                value = ",".join(map(str, stated)) if isinstance(stated, tuple) else stated
                self.refusals.add(codes.INCONSISTENT_DEGREES, f"{key} gives {value} but "
                                  f"{flag} is {shown}", self.node(key) or self.root,
                                  help=f"drop {flag}: the strategy file states it")
        if options.loss_parallel is not None:
            self.refusals.add(codes.INCONSISTENT_DEGREES, "--loss-parallel is an option of "
                              "torchtitan plans, not of Galvatron strategies", self.root)

    def schedule(self, pp: int, chunks: int) -> str | None:
        node = self.node("pipeline_type")
        if node is None:
            if pp > 1 and chunks > 1:
                self.missing("pipeline_type")
            return None
        schedule = SCHEDULES.get(str(node.value))
        if schedule is None:
            self.refusals.add(codes.UNKNOWN_STYLE, f"unknown pipeline_type "
                              f"{quoted(str(node.value))}; expected "
                              + " or ".join(SCHEDULES), node)
        return schedule if chunks > 1 else None

    def division(self, pp: int) -> tuple[int, ...] | None:
        node = self.node("pp_division")
        layers = self.config.n_layers
        if node is None:
            if pp == 1:
                return (layers,)
            self.missing("pp_division")
            return None
        values = _integers(node.value)
        if values is None:
            self.refusals.add(codes.MALFORMED_IMPORT, "pp_division must be a string of "
                              "comma-separated layer counts", node)
            return None
        if len(values) != pp or sum(values) != layers:
            self.refusals.add(codes.INCONSISTENT_DEGREES, f"pp_division {node.value} does not "
                              f"give pp_deg={pp} stages covering the {layers} layers", node)
            return None
        return values

    def data_parallel(self, options: ImportOptions, pp: int, tp: int) -> int | None:
        world = options.world_size
        if world is None and options.mesh is not None:
            world = 1
            for _, size in options.mesh:
                world *= size
        if world is None:
            raise self.refusals.stop(codes.MALFORMED_IMPORT, "the device count is not in the "
                                     "strategy", help="pass --world-size N (or --mesh)")
        if world % (pp * tp):
            self.refusals.add(codes.INCONSISTENT_DEGREES, f"{world} devices do not split into "
                              f"pp_deg={pp} stages of tensor-parallel groups of {tp}",
                              self.node("pp_deg"))
            return None
        return world // (pp * tp)

    def batch(self, options: ImportOptions, batch: int, dp: int, chunks: int) -> None:
        node = self.node("global_bsz")
        if options.batch is not None and options.batch != batch:
            self.refusals.add(codes.INCONSISTENT_DEGREES, f"global_bsz is {batch} but --batch "
                              f"is {options.batch}", node)
        elif chunks < 1:
            self.refusals.add(codes.MALFORMED_IMPORT, "chunks must be positive",
                              self.node("chunks"))
        else:
            try:
                check_batch(options, self.refusals, batch, dp, chunks, node)
            except Refused:
                pass


def json_text(value: object) -> str:
    import json

    return json.dumps(value) if not isinstance(value, str) else value


def _integers(value: object) -> tuple[int, ...] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if not isinstance(value, str):
        return None
    try:
        return tuple(int(part) for part in value.split(","))
    except ValueError:
        return None


def _runs(values: tuple[int, ...]) -> str:
    """``2 for layers 0-1, 4 for layers 2-3``."""
    runs: list[list[int]] = []
    for index, value in enumerate(values):
        if runs and values[runs[-1][0]] == value:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ", ".join(f"{values[a]} for layer{'s' if b > a else ''} "
                     f"{a}{f'-{b}' if b > a else ''}" for a, b in runs)


def _layers(values: tuple[int, ...], off: int) -> str:
    chosen = [i for i, v in enumerate(values) if v != off]
    return f"layer{'s' if len(chosen) > 1 else ''} " + ", ".join(map(str, chosen))


# ---------------------------------------------------------------- the plan


def _draft(path: str, options: ImportOptions, s: Strategy, mesh: tuple[tuple[str, int], ...],
           refusals: Refusals) -> PlanDraft:
    model = options.config.model
    sp = options.sequence_parallel and s.tp > 1
    layer = _layer_lines(model.cls, s.tp, sp)
    before, after = _vocabulary_lines(model.cls, s, sp)
    gradients, shard = _gradient_lines(s)
    comments = [f"Imported by `tvp import galvatron` from {Path(path).name}.",
                f"Galvatron strategy: pp={s.pp}, tp={s.tp} "
                f"({'consecutive' if s.consecutive else 'strided'}), dp={s.dp} ({s.dp_type}), "
                f"vocabulary {'tensor parallel' if s.vocab_parallel else 'replicated'}"
                + (", Megatron sequence parallel" if sp else "") + "."]
    if s.checkpointed:
        comments.append(f"Activation checkpointing on {_layers_text(s.checkpointed)}: "
                        "recomputation gives the same values, no statement.")
    return PlanDraft(
        name=plan_name(options, Path(path).stem), comments=tuple(comments),
        config=options.config, batch=s.batch, seq=options.seq, mesh=mesh,
        optimizer=options.optimizer, optimizer_shard=shard if options.optimizer else (),
        microbatches=s.microbatches, schedule=s.schedule,
        batch_axes=(DATA,) if s.dp > 1 else (),
        stages=pipeline_stages(options.config, s.division) if s.pp > 1 else (),
        before=before, layers=(layer,) * options.config.n_layers, after=after,
        gradients=gradients)


def _layers_text(indices: tuple[int, ...]) -> str:
    """``layers 0-15, 20``."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and runs[-1][1] == index - 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return f"layer{'s' if len(indices) > 1 else ''} " + ", ".join(
        f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _layer_lines(cls: str, tp: int, sp: bool) -> tuple[Line, ...]:
    if tp == 1:
        return ()
    note = f"tp_sizes_enc: {tp}"
    if cls == "Llama":
        if sp:
            return (Line(f"apply llama_block_sp(l, {TENSOR})", note + ", sequence parallel"),)
        return (Line(f"apply attention_parallel(l.attention, {TENSOR})", note),
                Line(f"apply swiglu_parallel(l.feed_forward, {TENSOR})", note))
    return (Line(f"apply attention_parallel_bias(l.attention, {TENSOR})", note),
            Line(f"apply mlp_parallel_bias(l.feed_forward, {TENSOR})", note))


def _vocabulary_lines(cls: str, s: Strategy, sp: bool) -> tuple[tuple[Line, ...],
                                                                tuple[Line, ...]]:
    if not s.vocab_parallel:
        return (), ()
    note = f"vtp: {s.tp}"
    if sp:
        return ((Line(f"apply vocab_parallel_embedding_sp(embed, {TENSOR})", note),),
                (Line(f"apply sp_norm(norm, {TENSOR})", "sequence parallel"),
                 Line(f"apply vocab_parallel_output_sp(output, {TENSOR})", note)))
    return ((Line(f"apply vocab_parallel_embedding(embed, {TENSOR})", note),),
            (Line(f"apply vocab_parallel_output(output, {TENSOR})", note),))


def _gradient_lines(s: Strategy) -> tuple[tuple[Line, ...], tuple[str, ...]]:
    """DDP all-reduces the averaged gradients; ZeRO-2 reduce-scatters them and shards the
    optimizer over dp."""
    if s.dp == 1:
        return (), ()
    if s.dp_type == "zero2":
        return (Line(f"reduce-scatter grad(params) over {DATA} dim=0 op=avg",
                     "default_dp_type: zero2"),), (DATA,)
    return (Line(f"all-reduce grad(params) over {DATA} op=avg", "default_dp_type: ddp"),), ()
