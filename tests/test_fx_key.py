"""Identical blocks are decomposed and differentiated once (``spec/fx_key.py``): the key is
exact (equal keys for equal programs, different keys for any difference of op, argument,
shape or constant value), and the graphs reused under it are the graphs a fresh trace gives,
names and module paths included."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_spec_support import check_spec, ir_inputs, random_inputs, torch_reference
from torch import nn

from trainverify_dsl.spec.fx_key import graph_key
from trainverify_dsl.spec.trace import _export, _export_key, trace_training_step

ROOT = Path(__file__).resolve().parents[1]


class Block(nn.Module):
    def __init__(self, width: int = 4, scale: float = 2.0, constant: tuple = (1.0, 2.0),
                 offset: float = 0.5) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.scale = scale
        self.constant = list(constant)
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = torch.tensor(self.constant, dtype=x.dtype)  # real constants in the graph
        d = torch.tensor(self.offset, dtype=x.dtype)  # 0-d
        return x + torch.tanh(self.fc(x)) * self.scale + c.sum() + d


def _key(block: nn.Module, width: int = 4) -> tuple | None:
    block = block.double()
    return _export_key(_export(block, (torch.zeros(2, width, dtype=torch.float64),)))


def test_equal_blocks_have_equal_keys_and_any_difference_separates_them() -> None:
    base = _key(Block())
    assert base is not None
    assert _key(Block()) == base  # another instance, other parameter values
    assert _key(Block(scale=3.0)) != base  # a scalar argument
    assert _key(Block(constant=(1.0, 3.0))) != base  # a constant's values
    assert _key(Block(offset=0.25)) != base  # a 0-d constant's value
    assert _key(Block(width=6), width=6) != base  # shapes


def test_a_graph_the_key_cannot_describe_has_none() -> None:
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))  # call_module nodes
    assert graph_key(gm) is None


class Scaled(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x)) * self.scale


class Stack(nn.Module):
    """Blocks equal but for a scalar: exact tracing must keep them apart."""

    def __init__(self, scales: list[float]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Scaled(s) for s in scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.pow(2).sum()


@pytest.mark.parametrize("scales,groups", [([2.0, 2.0, 2.0, 2.0], 1), ([2.0, 3.0, 2.0, 3.0], 2)])
def test_exact_tracing_reuses_only_equal_exports(
        scales: list[float], groups: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainverify_dsl.spec import trace

    differentiated: list[object] = []
    original = trace._differentiate

    def counted(*args: object) -> object:
        differentiated.append(args)
        return original(*args)

    monkeypatch.setattr(trace, "_differentiate", counted)
    torch.manual_seed(0)
    model = Stack(scales).double()
    specs = {"x": ((2, 4), torch.float64)}
    args = random_inputs(specs, 1)
    spec = trace_training_step(model, specs, exact_reuse=True)
    assert len(spec.groups) == groups
    assert len(differentiated) == groups + 1  # each distinct block once, and the outer model
    check_spec(spec, ir_inputs(model, specs, args), torch_reference(model, specs, args))


def test_reused_graphs_equal_fresh_ones_within_a_plan_and_across_plans(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4-block plan checked as `tvp check` lowers it (one stage per block) reuses its middle
    blocks' joints; a one-line edit of it (another learning rate), lowered next in the same
    process, differentiates no block stage and only the reference's outer model; and its
    programs equal a fresh trace's, every node's origin (module path, user frame) included."""
    import torch._functorch.aot_autograd as aot

    from trainverify_dsl import api
    from trainverify_dsl.lower import joint
    from trainverify_dsl.spec import trace

    text = (ROOT / "plans" / "llama_tiny_tp.tvp").read_text(encoding="utf-8")
    text = text.replace("batch 4 seq 8", "batch 4 seq 8 n_layers 4")
    text = text.replace('"stdlib/', f'"{ROOT}/stdlib/')
    first, second = tmp_path / "first.tvp", tmp_path / "second.tvp"
    first.write_text(text, encoding="utf-8")
    edited = text.replace("optimizer sgd lr=0.01", "optimizer sgd lr=0.02")
    assert edited != text
    second.write_text(edited, encoding="utf-8")

    def build(path: Path) -> api.Programs:
        return api.build_programs(path, blocks=True, allow_model_outside_root=True)

    def origins(graph: object) -> list[tuple[str, str, str, str]]:
        return [(n.origin.module, n.origin.stack, n.origin.phase, n.origin.source)
                for n in graph.nodes]

    hits: list[bool] = []
    relabel = joint.relabel

    def counted_relabel(*args: object) -> object:
        out = relabel(*args)
        hits.append(out is not None)
        return out

    monkeypatch.setattr(joint, "relabel", counted_relabel)
    built = build(first)
    assert built.segmented and len(built.program.stages) == 4
    assert hits and all(hits)  # the middle blocks' joints were reused

    calls: list[object] = []
    export_joint = aot.aot_export_joint_with_descriptors

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args[1])
        return export_joint(*args, **kwargs)

    monkeypatch.setattr(aot, "aot_export_joint_with_descriptors", counted)
    warm = build(second)
    assert len(calls) == 1  # the reference's outer model only: no block, no plan stage

    trace.BLOCKS.clear()
    joint.JOINTS.clear()
    monkeypatch.setattr(joint, "graph_key", lambda *args: None)
    monkeypatch.setattr(trace, "_export_key", lambda exported: None)
    fresh = build(second)
    assert warm.program == fresh.program
    for a, b in zip(warm.program.stages, fresh.program.stages, strict=True):
        assert [i.name for i in a.graph.inputs] == [i.name for i in b.graph.inputs]
        assert origins(a.graph) == origins(b.graph)
    assert warm.spec.program == fresh.spec.program
    for (name_a, a), (name_b, b) in zip(warm.spec.program.graphs, fresh.spec.program.graphs,
                                        strict=True):
        assert name_a == name_b and origins(a) == origins(b)
