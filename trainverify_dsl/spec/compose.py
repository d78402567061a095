"""Compose traced pieces into one training-step ``Program``.

The outer model's joint graph is split in three phases (``outer.0`` prefix forward up to the
block inputs, ``outer.1`` head forward and backward from the final block output, ``outer.2``
prefix backward from the gradient at the first block input); each distinct block has a
forward graph (``blockN.fwd``: output plus ``saved.*`` activations) and a backward graph
(``blockN.bwd``). The program calls them in training order: prefix, every layer's forward,
head, every layer's backward in reverse, prefix backward. Tensor names: program inputs and
outputs keep their names (``layers.3.attn.wq.weight``, ``grad(...)``, ``loss``); values
private to a call instance are scoped (``layers.3/saved.17``, ``outer/block_in.1``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainverify_dsl.ir.graph import Graph, GraphInput
from trainverify_dsl.ir.program import Boundary, Call, Program
from trainverify_dsl.spec.marks import POINT


@dataclass(slots=True)
class Pieces:
    """What the tracer produced: the outer phases, block graph pairs, layer -> block graph."""

    outer: list[Graph]
    #: group graph name -> (forward graph, backward graph)
    blocks: dict[str, tuple[Graph, Graph]]
    layer_graph: list[str]
    list_path: str


def step_call(name: str, graph: Graph, scope: str, rename: Mapping[str, str],
              prefix: str = "", label: str = "") -> Call:
    """A call whose inputs/outputs named in ``rename`` map there; ``saved.*`` and cut values
    are scoped; everything else keeps its (program-level) name."""

    def program_name(local: str) -> str:
        if local in rename:
            return rename[local]
        if local.startswith("saved.") or local.startswith("block_") or local.startswith(
                "grad(block_"):
            return f"{scope}/{local}"
        return local

    args = tuple(program_name(g.name) for g in graph.inputs)
    results = tuple(program_name(n) for n in graph.output_names)
    return Call(name, args, results, prefix, label or name)


def block_boundaries(list_path: str, n_blocks: int) -> tuple[Boundary, ...]:
    """The hidden state before each block and after the last, in the names ``compose``
    gives them: the value is the prefix's ``block_in.0`` or a block's ``out``, its cotangent
    the next block's ``grad(in)`` or the head's ``grad(block_out)``."""
    out = []
    for k in range(n_blocks + 1):
        points = ((f"{list_path}.{k - 1}.out",) if k > 0 else ()) + \
            ((f"{list_path}.{k}.in",) if k < n_blocks else ())
        value = "outer/block_in.0" if k == 0 else f"{list_path}.{k - 1}/out"
        cotangent = f"{list_path}.{k}/grad(in)" if k < n_blocks else "outer/grad(block_out)"
        out.append(Boundary(points, value, cotangent))
    return tuple(out)


def _layer_rename(graph: Graph, layer: str, scope: str) -> dict[str, str]:
    rename = {}
    for g in graph.inputs:
        if g.kind in ("param", "buffer"):
            rename[g.name] = f"{layer}.{g.name}"
        elif g.name.startswith("saved."):
            rename[g.name] = f"{scope}/{g.name}"
    for name in graph.output_names:
        if name.startswith(f"{POINT}@"):  # a marked point inside the block (spec/trace.py)
            rename[name] = f"{POINT}{layer}{name[len(POINT) + 1:]}"
        elif name.startswith("grad(") and name not in ("grad(in.0)",):
            rename[name] = f"grad({layer}.{name[5:-1]})"
        elif name.startswith("saved."):
            rename[name] = f"{scope}/{name}"
    return rename


def _extra_inputs(graph: Graph) -> dict[str, str]:
    """Block inputs other than the hidden state come straight from the prefix."""
    return {g.name: f"outer/block_{g.name}" for g in graph.inputs
            if g.name.startswith("in.") and g.name != "in.0"}


def compose(pieces: Pieces, inputs: tuple[GraphInput, ...],
             outputs: list[str]) -> Program:
    graphs: list[tuple[str, Graph]] = [(f"outer.{i}", g) for i, g in enumerate(pieces.outer)]
    for name, (fwd, bwd) in pieces.blocks.items():
        graphs += [(f"{name}.fwd", fwd), (f"{name}.bwd", bwd)]
    calls = [step_call("outer.0", pieces.outer[0], "outer", {}, label="prefix forward")]
    hidden = ["outer/block_in.0"]
    for i, name in enumerate(pieces.layer_graph):
        layer, scope = f"{pieces.list_path}.{i}", f"{pieces.list_path}.{i}"
        fwd = pieces.blocks[name][0]
        rename = _layer_rename(fwd, layer, scope)
        rename.update({"in.0": hidden[-1], "out": f"{scope}/out"})
        rename.update(_extra_inputs(fwd))
        calls.append(step_call(f"{name}.fwd", fwd, scope, rename, layer, f"{layer} forward"))
        hidden.append(f"{scope}/out")
    calls.append(step_call("outer.1", pieces.outer[1], "outer", {"block_out": hidden[-1]},
                       label="head forward and backward"))
    grad = "outer/grad(block_out)"
    for i in reversed(range(len(pieces.layer_graph))):
        name = pieces.layer_graph[i]
        layer = scope = f"{pieces.list_path}.{i}"
        bwd = pieces.blocks[name][1]
        rename = _layer_rename(bwd, layer, scope)
        rename.update({"in.0": hidden[i], "grad(out)": grad, "grad(in.0)": f"{scope}/grad(in)"})
        rename.update(_extra_inputs(bwd))
        calls.append(step_call(f"{name}.bwd", bwd, scope, rename, layer, f"{layer} backward"))
        grad = f"{scope}/grad(in)"
    calls.append(step_call("outer.2", pieces.outer[2], "outer", {"grad(block_in.0)": grad},
                       label="prefix backward"))
    defined = {r for c in calls for r in c.results}
    outs = tuple((o, o) for o in outputs if o in defined)
    return Program(inputs, tuple(graphs), tuple(calls), outs)
