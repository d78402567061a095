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
from trainverify_dsl.spec.trace import _export, export_key, trace_training_step

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
    return export_key(_export(block, (torch.zeros(2, width, dtype=torch.float64),)))


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
    trace.BLOCKS.clear()  # (the process's memos: another test may have traced these)
    trace.OUTERS.clear()
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
    from trainverify_dsl.lower import capture, joint
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
    # the embedding, the 4 blocks and the head each a stage (lower/bind.py segment_stages)
    assert built.segmented and len(built.program.stages) == 6
    assert hits and all(hits)  # the middle blocks' joints were reused

    calls: list[object] = []
    export_joint = aot.aot_export_joint_with_descriptors

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args[1])
        return export_joint(*args, **kwargs)

    monkeypatch.setattr(aot, "aot_export_joint_with_descriptors", counted)
    warm = build(second)
    assert not calls  # no block, no plan stage, not the reference's outer model either

    trace.BLOCKS.clear()
    trace.OUTERS.clear()
    joint.JOINTS.clear()
    capture.DECOMPOSED.clear()
    monkeypatch.setattr(joint, "graph_key", lambda *args: None)
    monkeypatch.setattr(trace, "export_key", lambda exported, where=False: None)
    monkeypatch.setattr(capture, "export_key", lambda exported, where=False: None)
    fresh = build(second)
    assert warm.program == fresh.program
    for a, b in zip(warm.program.stages, fresh.program.stages, strict=True):
        assert [i.name for i in a.graph.inputs] == [i.name for i in b.graph.inputs]
        assert origins(a.graph) == origins(b.graph)
    assert warm.spec.program == fresh.spec.program
    for (name_a, a), (name_b, b) in zip(warm.spec.program.graphs, fresh.spec.program.graphs,
                                        strict=True):
        assert name_a == name_b and origins(a) == origins(b)


def test_a_capture_met_again_is_not_decomposed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """``lower/capture.py`` keeps decomposed captures by the exact key of their export: the
    same model at the same size with the same marks is decomposed once (``tvp check``
    lowers a plan twice to report a difference; a search loop lowers many plans of one
    model), and the program lowered from the remembered capture is the fresh one's."""
    from trainverify_dsl.api import prepare
    from trainverify_dsl.ir.parallel import format_parallel
    from trainverify_dsl.lower import capture
    from trainverify_dsl.lower.lowering import lower
    from trainverify_dsl.lower.program import parallel_program

    capture.DECOMPOSED.clear()
    calls: list[int] = []
    original = torch.export.ExportedProgram.run_decompositions

    def counted(self: torch.export.ExportedProgram, *args: object, **kwargs: object) -> object:
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counted)
    programs = []
    for _ in range(2):  # a fresh fake model each time, as each command builds its own
        setup = prepare(ROOT / "plans" / "llama_tiny_tp.tvp")
        programs.append(format_parallel(parallel_program(
            lower(setup.plan, setup.fake_model, setup.fake_inputs))))
    assert len(calls) == 1
    assert programs[0] == programs[1]
    # another mark is another export: decomposed afresh
    lower(setup.plan, setup.fake_model, setup.fake_inputs, frozenset({"layers.0"}))
    assert len(calls) == 2


def test_the_capture_key_holds_module_paths_and_stack_traces() -> None:
    """The lowering reads each node's module (which stage it is on) and stack trace (the
    model line of a finding): two exports alike in graph and frames but not in those are
    never one capture."""
    from trainverify_dsl.lower.capture import _capture_key

    exported = _export(Block().double(), (torch.zeros(2, 4, dtype=torch.float64),))
    key = _capture_key(exported)
    assert key is not None and key == _capture_key(exported)
    node = next(n for n in exported.graph.nodes if n.op == "call_function")
    stack = node.meta["nn_module_stack"]
    node.meta["nn_module_stack"] = {k: (f"{v[0]}.renamed", v[1]) for k, v in stack.items()}
    moved = _capture_key(exported)
    assert moved is not None and moved != key
    node.meta["nn_module_stack"] = stack
    assert _capture_key(exported) == key
    node.meta["stack_trace"] = (node.meta.get("stack_trace") or "") + "\n  another line"
    assert _capture_key(exported) != key
