"""An nnScaler AutoDist plan (``PipelineSearchOutput`` / ``PipelineParallelDesc`` JSON) -> a
plan, where its operator partitions map onto module parameters.

The plan JSON holds, per pipeline stage (``spmd_descs``), the stage's devices (``mesh_desc``:
nodes x GPUs) and for every operator of nnScaler's traced graph its partition
(``partition_descs``: ``[cid, [[[input, dim], num], ...]]``, outermost first; ``[-1, -1]``
replicates). Operators are named only by ``cid``, so the importer also needs the graph's
operator table (``--ops``): a JSON object ``{"<cid>": {"signature": "torch.nn.functional.
linear", "module": "layers.0.attention.wq"}, ...}`` (the signature and the innermost module of
each ``IRFwOperation``; ``"reads_batch": false`` marks an operator whose inputs are
parameters or buffers only). Module paths are the reference model's (nnScaler traced it).

What maps (docs/importers.md): the batch split of every operator (data parallelism), and
the Megatron pattern of tensor parallelism, i.e. inside an attention or feed-forward block
the input linears split by weight rows (``[1, 0]``), the output linear by weight columns
(``[1, 1]`` or ``[0, last]``), the operators between them split over the same devices, and
everything else replicated over them. nnScaler's adapters are then exactly Megatron's
collectives (copy before, all-reduce after). The importer checks the partition counts and
which input is split, not the dimension an operator between the linears is split along: the
plan does not say what that dimension means for the operator. Any other partition is
refused: nnScaler would insert adapters the importer does not transcribe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from trainverify_dsl.importers import patterns
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
from trainverify_dsl.importers.models import Module, ReferenceModel
from trainverify_dsl.importers.source import Node, Unreadable, quoted, read_json, read_text
from trainverify_dsl.report import codes_import as codes

LINEAR_OP = "torch.nn.functional.linear"
EMBEDDING_OP = "torch.nn.functional.embedding"

#: Per model: the blocks of a layer where tensor parallelism is Megatron's pattern,
#: (container, input linears, output linear).
REGIONS = {
    "Llama": (("attention", ("attention.wq", "attention.wk", "attention.wv"), "attention.wo"),
              ("feed_forward", ("feed_forward.w1", "feed_forward.w3"), "feed_forward.w2")),
    "GPT2": (("attention", ("attention.wq", "attention.wk", "attention.wv"), "attention.wo"),
             ("feed_forward", ("feed_forward.w1",), "feed_forward.w2")),
}


@dataclass(frozen=True, slots=True)
class Op:
    cid: int
    signature: str
    #: layer index, or ``None`` for a module outside the layers
    layer: int | None
    #: path in the layer (``attention.wq``, ``""`` the layer) or below the model
    path: str
    module: Module | None
    reads_batch: bool

    @property
    def name(self) -> str:
        where = f"layers.{self.layer}.{self.path}".rstrip(".") if self.layer is not None \
            else self.path or "the model"
        return f"op {self.cid} ({self.signature.rsplit('.', 1)[-1]} in {where})"


@dataclass(frozen=True, slots=True)
class Part:
    """One entry of a partition: its role and how many pieces."""

    role: str  # batch | rows | columns | replicate | other
    num: int


@dataclass(frozen=True, slots=True)
class Placed:
    op: Op
    parts: tuple[Part, ...]
    node: Node


def import_nnscaler(path: str, options: ImportOptions, refusals: Refusals) -> PlanDraft:
    model = options.config.model
    ops = _read_ops(options.ops, options, refusals)
    stages = _read_stages(path, refusals)
    placed = [[_place(cid, desc, ops, model, refusals) for cid, desc in stage[1]]
              for stage in stages]
    if refusals:
        raise Refused()
    devices = [stage[0] for stage in stages]
    degrees = [_degrees(stage, n, refusals) for stage, n in zip(placed, devices, strict=True)]
    if refusals:
        raise Refused()
    if len(set(degrees)) > 1:
        raise refusals.stop(codes.INEXPRESSIBLE_PLAN, "the pipeline stages use different "
                            f"(dp, tp) {sorted(set(degrees))}; a plan's mesh gives every "
                            "stage the same devices")
    dp, tp = degrees[0]
    layers, dp_outer = _transcribe([p for stage in placed for p in stage], model, options,
                                   dp, tp, refusals)
    division = _division(placed, options, refusals)
    if refusals:
        raise Refused()
    mesh = _mesh(len(stages), dp, tp, dp_outer)
    microbatches = options.microbatches or 1
    check_batch(options, refusals, options.batch or 0, dp, microbatches)
    return PlanDraft(
        name=plan_name(options, Path(path).stem),
        comments=(f"Imported by `tvp import nnscaler` from {Path(path).name} "
                  f"(operators: {Path(options.ops or '').name}).",
                  "Assumed, not in the plan: the operators between a split linear pair are "
                  "split along the features the linears split."),
        config=options.config, batch=options.batch or 0, seq=options.seq, mesh=mesh,
        optimizer=options.optimizer, microbatches=microbatches, schedule=options.schedule,
        batch_axes=(DATA,) if dp > 1 else (),
        stages=pipeline_stages(options.config, division) if len(stages) > 1 else (),
        layers=layers,
        gradients=(Line(f"all-reduce grad(params) over {DATA} op=avg",
                        "nnScaler's reducer: gradients averaged"),) if dp > 1 else ())


# ---------------------------------------------------------------- reading


def _json(path: str, refusals: Refusals) -> Node:
    try:
        return read_json(read_text(path), path)
    except Unreadable as error:
        refusals.items.append(error.diagnostic)
        raise Refused() from None


def _read_ops(path: str | None, options: ImportOptions, refusals: Refusals) -> dict[int, Op]:
    if path is None:
        raise refusals.stop(codes.MALFORMED_IMPORT, "the operator table is required: the "
                            "plan names operators by cid only", help="pass --ops OPS.json")
    root = _json(path, refusals)
    if not root.is_object:
        raise refusals.stop(codes.MALFORMED_IMPORT, "the operator table must be a JSON object "
                            "from cid to {signature, module}", root)
    ops: dict[int, Op] = {}
    for key, node in root.items():
        op = _op(key, node, options.config.model, refusals)
        if op is not None:
            ops[op.cid] = op
    if refusals:
        raise Refused()
    return ops


def _op(key: str, node: Node, model: ReferenceModel, refusals: Refusals) -> Op | None:
    signature, module = node.get("signature"), node.get("module")
    reads = node.get("reads_batch")
    if not key.isdigit() or not isinstance(signature and signature.value, str) or \
            not isinstance(module and module.value, str) or \
            (reads is not None and not isinstance(reads.value, bool)):
        refusals.add(codes.MALFORMED_IMPORT, f"operator {quoted(key)} must be a cid mapped to "
                     '{"signature": str, "module": str[, "reads_batch": bool]}', node)
        return None
    assert signature is not None and module is not None
    layer, relative, table = _module(str(module.value), model)
    if table is None and relative is not None and relative != "":
        refusals.add(codes.UNMAPPED_MODULE, f"operator {key}: the module "
                     f"{quoted(str(module.value))} is not a module of the reference model "
                     f"{model.cls}", module)
        return None
    return Op(int(key), str(signature.value), layer, relative or "", table,
              bool(reads.value) if reads is not None else True)


def _module(path: str, model: ReferenceModel) -> tuple[int | None, str | None, Module | None]:
    """``(layer, path in the layer or model, table entry)``; the entry is ``None`` for the
    model itself (``""``) and for names the table lacks."""
    prefix = f"{model.layer_list}."
    if model.layer_list and path.startswith(prefix):
        index, _, relative = path.removeprefix(prefix).partition(".")
        if index.isdigit():
            return int(index), relative, model.in_layer(relative)
    return None, path, model.top(path)


def _read_stages(path: str, refusals: Refusals) -> list[tuple[int, list[tuple[Node, Node]]]]:
    root = _json(path, refusals)
    desc = root.get("desc") or root
    spmd = desc.get("spmd_descs")
    if spmd is None or not isinstance(spmd.value, tuple) or not spmd.value:
        raise refusals.stop(codes.MALFORMED_IMPORT, "expected an AutoDist plan: an object with "
                            "spmd_descs (or desc.spmd_descs), one per pipeline stage", root)
    stages = []
    for stage in spmd.value:
        mesh, descs = stage.get("mesh_desc"), stage.get("partition_descs")
        devices = _mesh_devices(mesh)
        if devices is None or descs is None or not isinstance(descs.value, tuple):
            raise refusals.stop(codes.MALFORMED_IMPORT, "a stage needs mesh_desc [nodes, gpus] "
                                "and partition_descs", stage)
        stages.append((devices, [_pair(entry, refusals) for entry in descs.value]))
    total = _mesh_devices(desc.get("mesh_desc"))
    if total is not None and total != sum(n for n, _ in stages):
        refusals.add(codes.INCONSISTENT_DEGREES, f"the plan's mesh_desc has {total} devices, "
                     f"its stages {sum(n for n, _ in stages)}", desc.get("mesh_desc"))
    return stages


def _mesh_devices(node: Node | None) -> int | None:
    if node is None or not isinstance(node.value, tuple) or len(node.value) != 2:
        return None
    sizes = [n.value for n in node.value]
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
        return None
    return int(sizes[0]) * int(sizes[1])


def _pair(entry: Node, refusals: Refusals) -> tuple[Node, Node]:
    if not isinstance(entry.value, tuple) or len(entry.value) != 2:
        raise refusals.stop(codes.MALFORMED_IMPORT, "a partition_descs entry is [cid, desc]",
                            entry)
    return entry.value[0], entry.value[1]


# ---------------------------------------------------------------- partitions


def _place(cid: Node, desc: Node, ops: dict[int, Op], model: ReferenceModel,
           refusals: Refusals) -> Placed | None:
    op = ops.get(cid.value) if isinstance(cid.value, int) else None  # type: ignore[arg-type]
    if op is None:
        refusals.add(codes.MALFORMED_IMPORT, f"operator {quoted(str(cid.value))} is not in the "
                     "operator table", cid)
        return None
    parts = []
    for entry in desc.value if isinstance(desc.value, tuple) else (None,):
        part = _part(entry, op, model)
        if part is None:
            refusals.add(codes.MALFORMED_IMPORT, f"{op.name}: a partition is a list of "
                         "[[input, dim], pieces]", desc)
            return None
        parts.append(part)
    return Placed(op, tuple(p for p in parts if p.num > 1), desc)


def _part(entry: Node | None, op: Op, model: ReferenceModel) -> Part | None:
    value = entry.value if entry is not None else None
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0].value, tuple)
            and len(value[0].value) == 2):
        return None
    index, dim = (n.value for n in value[0].value)
    num = value[1].value
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (index, dim, num)) \
            or num < 1:  # type: ignore[operator]
        return None
    return Part(_role(op, int(index), int(dim), model), int(num))  # type: ignore[arg-type]


def _role(op: Op, index: int, dim: int, model: ReferenceModel) -> str:
    if (index, dim) == (-1, -1):
        return "replicate"
    if (index, dim) == (0, 0):
        return "batch"
    if op.signature == LINEAR_OP:
        if (index, dim) in ((1, 0), (2, 0)):
            return "rows"
        if (index, dim) in ((1, 1), (0, model.activation_rank - 1), (0, -1)):
            return "columns"
    return "other"


def _degrees(stage: list[Placed | None], devices: int, refusals: Refusals) -> tuple[int, int]:
    """(dp, tp) of a stage: tp from the split linears, dp the rest of its devices."""
    placed = [p for p in stage if p is not None]
    splits = {part.num for p in placed for part in p.parts if part.role in ("rows", "columns")}
    if len(splits) > 1:
        raise refusals.stop(codes.INEXPRESSIBLE_PLAN, f"linears are split {sorted(splits)} "
                            "ways in one stage; a plan has one tensor-parallel degree")
    tp = splits.pop() if splits else 1
    if devices % tp:
        raise refusals.stop(codes.INCONSISTENT_DEGREES, f"a stage of {devices} devices with "
                            f"linears split {tp} ways")
    for p in placed:
        pieces = math.prod(part.num for part in p.parts)
        if pieces != devices:
            refusals.add(codes.INCONSISTENT_DEGREES, f"{p.op.name} is partitioned into "
                         f"{pieces} pieces on a stage of {devices} devices", p.node)
    return devices // tp, tp


@dataclass(frozen=True, slots=True)
class Classified:
    placed: Placed
    #: over tp: rows | columns (linears), other (split some other way), replicate
    role: str
    #: the data-parallel part comes before the tensor-parallel one (``None``: only one)
    dp_first: bool | None

    @property
    def op(self) -> Op:
        return self.placed.op


def _classify(p: Placed, dp: int, tp: int) -> Classified | None:
    """Its data-parallel part (a batch split over dp, or a replica if the op reads no batch)
    and its tensor-parallel part (one split or replica over tp); ``None`` for anything else."""
    parts = list(p.parts)
    if not p.op.reads_batch and all(q.role == "replicate" for q in parts):
        return Classified(p, "replicate", None)
    dp_index = None
    if dp > 1:
        dp_index = next((i for i, q in enumerate(parts) if q.num == dp and (
            q.role == "batch" or (q.role == "replicate" and not p.op.reads_batch))), None)
        if dp_index is None:
            return None
        del parts[dp_index]
    if not parts:
        return Classified(p, "replicate", None)
    if tp == 1 or len(parts) != 1 or parts[0].num != tp or parts[0].role == "batch":
        return None
    if p.op.signature == EMBEDDING_OP and parts[0].role != "replicate":
        return None
    return Classified(p, parts[0].role, None if dp_index is None else dp_index == 0)


def _mesh(stages: int, dp: int, tp: int, dp_outer: bool) -> tuple[tuple[str, int], ...]:
    inner = ((DATA, dp), (TENSOR, tp)) if dp_outer else ((TENSOR, tp), (DATA, dp))
    axes = tuple((a, n) for a, n in ((PIPELINE, stages),) + inner if n > 1)
    return axes or ((DATA, 1),)


# ---------------------------------------------------------------- transcription


def _transcribe(placed: list[Placed | None], model: ReferenceModel, options: ImportOptions,
                dp: int, tp: int, refusals: Refusals) -> tuple[tuple[tuple[Line, ...], ...],
                                                              bool]:
    """Lines of each layer, and whether the data-parallel partition is the outer one."""
    by_layer: dict[int | None, list[Classified]] = {}
    for p in placed:
        if p is None:
            continue
        c = _classify(p, dp, tp)
        if c is None:
            refusals.add(codes.UNSUPPORTED_IMPORT, f"{p.op.name} is partitioned "
                         + (", ".join(f"{q.role} x{q.num}" for q in p.parts) or "not at all")
                         + f"; with dp={dp} and tp={tp} the importer reads a batch split over "
                         "dp and, over tp, a linear's rows or columns, a split between them, "
                         "or a replica", p.node)
            continue
        by_layer.setdefault(p.op.layer, []).append(c)
    orders = {c.dp_first for cs in by_layer.values() for c in cs if c.dp_first is not None}
    if len(orders) > 1:
        refusals.add(codes.INEXPRESSIBLE_PLAN, "operators order their data- and tensor-"
                     "parallel partitions differently; one mesh has one order")
    layers = tuple(_layer_lines(by_layer.get(i, []), model, tp, refusals)
                   for i in range(options.config.n_layers))
    _check_outside(by_layer.get(None, []), refusals)
    return layers, orders.pop() if len(orders) == 1 else True


def _layer_lines(ops: list[Classified], model: ReferenceModel, tp: int,
                 refusals: Refusals) -> tuple[Line, ...]:
    lines: list[Line] = []
    claimed: set[int] = set()
    for container, inputs, output in REGIONS.get(model.cls, ()):
        linears = {c.op.path: c for c in ops if c.op.signature == LINEAR_OP
                   and c.op.path in inputs + (output,)}
        between = [c for c in ops if c.op.path == container and c.op.signature != LINEAR_OP]
        claimed |= {c.op.cid for c in list(linears.values()) + between}
        lines += _region(container, inputs, output, linears, between, tp, refusals)
    _check_outside([c for c in ops if c.op.cid not in claimed], refusals)
    return tuple(lines)


def _region(container: str, inputs: tuple[str, ...], output: str,
            linears: dict[str, Classified], between: list[Classified], tp: int,
            refusals: Refusals) -> list[Line]:
    """Megatron's pattern, or all replicated; a refusal names the ops that fit neither."""
    split = tp > 1 and all(linears[i].role == "rows" for i in inputs if i in linears) and \
        all(i in linears for i in inputs + (output,)) and linears[output].role == "columns"
    expected = "other" if split else "replicate"
    odd = [c for c in between if c.role != expected and c.op.reads_batch]
    if not split:
        odd += [c for c in linears.values() if c.role != "replicate"]
    for c in odd:
        refusals.add(codes.UNSUPPORTED_IMPORT, f"{c.op.name} is {_said(c.role)} over tp; in "
                     f"{container} the importer reads Megatron's pattern ("
                     f"{', '.join(i.rsplit('.', 1)[-1] for i in inputs)} split by rows, "
                     f"{output.rsplit('.', 1)[-1]} by columns, the operators between them "
                     "split) or a replicated block", c.placed.node)
    if not split or odd:
        return []
    out = linears[output].op
    if out.module is not None and out.module.has_bias:
        refusals.add(codes.UNSUPPORTED_IMPORT, f"{out.name}: a column-split linear with a "
                     "bias (how nnScaler splits the bias's value is not in the plan)",
                     linears[output].placed.node)
        return []
    lines: list[Line] = []
    for path in inputs:
        op = linears[path].op
        lines += patterns.column_parallel(f"l.{path}", bool(op.module and op.module.has_bias),
                                          TENSOR, "nnScaler: linear split by weight rows")
    return lines + list(patterns.row_parallel(f"l.{output}", False, TENSOR,
                                              "nnScaler: linear split by weight columns"))


def _said(role: str) -> str:
    return {"rows": "split by weight rows", "columns": "split by weight columns",
            "other": "split", "replicate": "replicated"}[role]


def _check_outside(ops: list[Classified], refusals: Refusals) -> None:
    """Outside the Megatron blocks every operator is replicated over tp."""
    for c in ops:
        if c.role != "replicate":
            refusals.add(codes.UNSUPPORTED_IMPORT, f"{c.op.name} is {_said(c.role)} over tp "
                         "outside an attention or feed-forward block; nnScaler's adapters "
                         "around it are not transcribed", c.placed.node)


def _division(stages: list[list[Placed | None]], options: ImportOptions,
              refusals: Refusals) -> tuple[int, ...]:
    """Layers per stage from the operators' layers: each layer on one stage, in order."""
    spans = []
    for number, stage in enumerate(stages):
        layers = sorted({p.op.layer for p in stage if p is not None and p.op.layer is not None})
        spans.append(layers)
        if layers and layers != list(range(layers[0], layers[-1] + 1)):
            refusals.add(codes.INEXPRESSIBLE_PLAN, f"stage {number} holds layers {layers}, "
                         "not a contiguous range")
    flat = [layer for layers in spans for layer in layers]
    if len(stages) > 1 and (flat != sorted(set(flat)) or len(flat) != options.config.n_layers):
        refusals.add(codes.INEXPRESSIBLE_PLAN, "the stages do not hold each layer once, in "
                     "order: a layer cut between stages has no pipeline-stage statement")
    return tuple(len(layers) for layers in spans)
