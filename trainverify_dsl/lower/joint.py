"""A stage's local forward -> its joint forward+backward IR graph.

AOTAutograd differentiates the local forward (local shapes, fake tensors), so every ordinary
op has torch's own backward and only ``tvp.collective`` carries a backward we wrote (the
plan's stated one). The joint graph is then imported into the shared IR with the spec's
importer. Names of the IR graph's inputs and outputs:

- inputs: parameters, buffers and model inputs by spec name; ``coord.<axis>`` (the rank's
  coordinate); ``recv.<id>`` (a boundary value from an earlier stage); ``seed`` (the cotangent
  of the local loss: the plan's loss scale, docs/semantics.md §4.3); ``cotangent.<id>`` (the
  cotangent of a value sent to a later stage, coming back from it);
- outputs: ``loss``, ``send.<id>``, ``lineage.<point>`` (the value at a marked point, for
  simulation; its cotangent input ``cotangent.lineage.<point>`` is zero), ``grad(<parameter>)``
  and ``grad(recv.<id>)``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from trainverify_dsl.ir.graph import Graph
from trainverify_dsl.lower.capture import CONSTANT_PREFIX
from trainverify_dsl.lower.lowering import Lowered, Slot, StageProgram
from trainverify_dsl.spec.fx_import import import_joint
from trainverify_dsl.spec.fx_key import KeyMemo, graph_key, relabel
from trainverify_dsl.spec.trace import decompositions as shared_decompositions

_KIND = {"param": "param", "buffer": "buffer", "data": "data", "coord": "data",
         "recv": "activation", "denominator": "data"}


def input_name(slot: Slot) -> str:
    if slot.kind == "coord":
        return f"coord.{slot.spec}"
    if slot.kind == "recv":
        return f"recv.{slot.spec}"
    return slot.spec


def output_name(slot: Slot) -> str:
    if slot.kind == "loss":
        return slot.kind
    if slot.kind == "count":  # `loss.count`, `loss.count.1`: `count`, `count.1`
        return slot.name.removeprefix("loss.")
    return f"lineage.{slot.spec}" if slot.kind == "lineage" else f"send.{slot.spec}"


def _differentiable(slot: Slot, value: torch.Tensor) -> bool:
    return slot.kind in ("param", "recv") and value.is_floating_point()


#: A stage's canonical key (``spec.fx_key``) -> (its forward, its joint graph module), for
#: every lowering of the process (a search loop lowers many plans of one model).
JOINTS = KeyMemo(256)


def stage_joints(lowered: Lowered) -> list[Graph]:
    """The joint graph of every stage. Stages whose local forwards are the same program (one
    block per stage, tens of identical blocks; the same block in another plan of the model)
    are differentiated once: the others import the same joint graph under their own names
    and module paths (``spec/fx_key.py``)."""
    return [stage_joint(lowered, st, memo=True) for st in lowered.stages]


def _constants_as_attributes(joint: torch.fx.GraphModule, forward: torch.fx.GraphModule
                             ) -> None:
    """Tensors the forward builds (a mask written in place: a lifted constant of the
    capture, ``CONSTANT_PREFIX``) are lifted by AOTAutograd into buffer inputs of the
    joint; they are constants of the stage, read back as attributes so that the importer
    makes them literals (as it does for the spec's)."""
    graph = joint.graph
    anchor = next((n for n in graph.nodes if n.op != "placeholder"), None)
    for node in list(graph.nodes):
        desc = node.meta.get("desc")
        target = str(getattr(desc, "target", ""))
        if node.op != "placeholder" or type(desc).__name__ != "BufferAOTInput" or \
                not target.startswith(CONSTANT_PREFIX):
            continue
        joint.register_buffer(target, getattr(forward, target))
        with graph.inserting_before(anchor):
            attribute = graph.get_attr(target)
        attribute.meta.update(node.meta)
        node.replace_all_uses_with(attribute)
        graph.erase_node(node)
    joint.recompile()


def stage_joint(lowered: Lowered, stage: StageProgram, memo: bool = False) -> Graph:
    """The IR graph of one stage's local forward and backward (``memo``: reuse and record
    joints in ``JOINTS``, by the canonical key of their stage's forward)."""
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors
    from torch._subclasses.fake_tensor import FakeTensorMode

    placeholders = [n for n in stage.gm.graph.nodes if n.op == "placeholder"]
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    args: list[torch.Tensor] = []
    with mode:
        for slot, node in zip(stage.inputs, placeholders, strict=True):
            val = node.meta["val"]
            fake = torch.empty(tuple(val.shape), dtype=val.dtype)
            if _differentiable(slot, val):
                fake.requires_grad_(True)
            args.append(fake)
    in_names = [input_name(s) for s in stage.inputs]
    in_kinds = [_KIND[s.kind] for s in stage.inputs]
    out_names = [output_name(s) for s in stage.outputs]

    def name_input(desc: Any) -> tuple[str | None, str]:
        kind = type(desc).__name__
        if kind == "PlainAOTInput":
            return in_names[desc.idx], in_kinds[desc.idx]
        if kind == "TangentAOTInput":
            out = out_names[desc.output.idx]
            return ("seed" if out == "loss" else f"cotangent.{out.removeprefix('send.')}",
                    "tangent")
        raise ValueError(f"unexpected joint input {desc!r}")

    def name_output(desc: Any) -> str | None:
        kind = type(desc).__name__
        if kind == "PlainAOTOutput":
            return out_names[desc.idx]
        if kind == "GradAOTOutput" and type(desc.grad_of).__name__ == "PlainAOTInput":
            return f"grad({in_names[desc.grad_of.idx]})"
        return None

    kinds = tuple((s.kind, a.requires_grad) for s, a in zip(stage.inputs, args, strict=True))
    key = graph_key(stage.gm, kinds, tuple(s.kind for s in stage.outputs)) if memo else None
    known = JOINTS.get(key)
    if known is not None:
        forward, gm = known
        graph = relabel(import_joint(gm, name_input, name_output), forward, stage.gm)
        if graph is not None:
            return graph
    decompositions = shared_decompositions()
    with contextlib.ExitStack() as stack, mode:
        joint = aot_export_joint_with_descriptors(stack, stage.gm, tuple(args),
                                                  decompositions=decompositions)
        gm = joint.graph_module
    _constants_as_attributes(gm, stage.gm)
    JOINTS.put(key, (stage.gm, gm))
    return import_joint(gm, name_input, name_output)
