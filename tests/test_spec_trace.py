"""The traced IR reproduces torch's loss and every parameter gradient (float64, rtol 1e-10),
flat and with block reuse; tracing failures are diagnostics."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_spec_support import (
    MLP,
    TinyLM,
    check_spec,
    ir_inputs,
    random_inputs,
    torch_reference,
)
from torch import nn

from trainverify_dsl.ir import inline
from trainverify_dsl.spec.errors import SpecError
from trainverify_dsl.spec.trace import trace_training_step

LM_SPECS = {"tokens": ((2, 8), torch.int64), "targets": ((2, 8), torch.int64)}


def build(cls, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    return cls(**kwargs).double()


def run_case(model: nn.Module, specs: dict, high: int, reuse: bool, seed: int = 0):
    args = random_inputs(specs, high, seed)
    spec = trace_training_step(model, specs, reuse=reuse)
    check_spec(spec, ir_inputs(model, specs, args), torch_reference(model, specs, args))
    return spec


@pytest.mark.parametrize("reuse", [False, True], ids=["flat", "reuse"])
@pytest.mark.parametrize("kwargs", [{}, {"moe": True}, {"tied": True}],
                         ids=["dense", "moe", "tied"])
def test_tiny_lm_matches_torch(kwargs: dict, reuse: bool) -> None:
    spec = run_case(build(TinyLM, **kwargs), LM_SPECS, 32, reuse)
    if reuse:
        assert spec.block_list == "layers"
        layers = sorted(i for g in spec.groups for i in g.layers)
        assert layers == [0, 1, 2]
        # dense: one block graph for all three layers; moe: layer 0 differs from 1 and 2
        assert len(spec.groups) == (2 if kwargs.get("moe") else 1)
    else:
        assert spec.groups == ()


class Scaled(nn.Module):
    """A block whose computation depends on its layer index."""

    def __init__(self, layer_id: int, hidden: object = None) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.layer_id = layer_id if hidden is None else 0
        self.hidden = hidden  # a list attribute: block_key must describe it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        factor = self.layer_id + 1 if self.hidden is None else self.hidden[0]
        return x + torch.tanh(self.fc(x)) * factor


class ScaledStack(nn.Module):
    def __init__(self, hidden: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            Scaled(i, [i + 1] if hidden else None) for i in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.pow(2).sum()


def test_block_key_separates_layers_by_simple_attributes() -> None:
    specs = {"x": ((2, 4), torch.float64)}
    spec = run_case(build(ScaledStack), specs, 1, reuse=True)
    assert len(spec.groups) == 3


def test_exact_reuse_groups_by_traced_graphs() -> None:
    specs = {"x": ((2, 4), torch.float64)}
    model = build(ScaledStack, hidden=True)
    args = random_inputs(specs, 1)
    exact = trace_training_step(model, specs, exact_reuse=True)
    assert len(exact.groups) == 3
    check_spec(exact, ir_inputs(model, specs, args), torch_reference(model, specs, args))
    keyed = trace_training_step(model, specs)
    assert len(keyed.groups) == 3  # the list attribute is part of block_key
    check_spec(keyed, ir_inputs(model, specs, args), torch_reference(model, specs, args))
    same = trace_training_step(build(TinyLM, layers=2), LM_SPECS, exact_reuse=True)
    assert len(same.groups) == 1


class Closured(nn.Module):
    """Layers that differ only through a closure: opaque to block_key."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = lambda x: torch.tanh(x) * scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


class ClosuredStack(nn.Module):
    def __init__(self, hook_on: int | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Closured(1.0 if hook_on is not None else i + 1.0)
                                    for i in range(3))
        if hook_on is not None:
            self.layers[hook_on].register_forward_hook(lambda m, a, out: out * 3.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.pow(2).sum()


@pytest.mark.parametrize("hook_on", [None, 1])
def test_reuse_is_exact_for_closures_and_hooks(hook_on: int | None) -> None:
    """Closures and per-instance hooks escape any attribute key: such blocks are traced one
    by one and grouped by their traced graphs, so the numbers stay right."""
    specs = {"x": ((2, 4), torch.float64)}
    model = build(ClosuredStack, hook_on=hook_on)
    args = random_inputs(specs, 1)
    spec = trace_training_step(model, specs)
    assert len(spec.groups) == (3 if hook_on is None else 2)
    check_spec(spec, ir_inputs(model, specs, args), torch_reference(model, specs, args))


def test_mlp_with_layer_norm_matches_torch() -> None:
    specs = {"x": ((5, 6), torch.float64), "target": ((5,), torch.int64)}
    spec = run_case(build(MLP), specs, 3, reuse=True)
    assert any("no nn.ModuleList" in note for note in spec.notes)


class BatchNormed(nn.Module):
    """Batch statistics (``track_running_stats=False``): decomposed into arithmetic for both
    programs (``spec.trace.decompositions``); the IR has no batch-norm op."""

    def __init__(self, two_d: bool = False) -> None:
        super().__init__()
        self.two_d = two_d
        self.fc1 = nn.Linear(6, 8)
        self.bn = (nn.BatchNorm2d if two_d else nn.BatchNorm1d)(8, track_running_stats=False)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.two_d:  # [b, c, 1, 1]: statistics over the batch and both spatial dims
            h = self.bn(h[:, :, None, None])[:, :, 0, 0]
        else:
            h = self.bn(h)
        return F.cross_entropy(self.fc2(torch.tanh(h)), target)


@pytest.mark.parametrize("two_d", [False, True], ids=["1d", "2d"])
def test_batch_norm_without_running_statistics_matches_torch(two_d: bool) -> None:
    specs = {"x": ((5, 6), torch.float64), "target": ((5,), torch.int64)}
    run_case(build(BatchNormed, two_d=two_d), specs, 3, reuse=True)


class FrozenBatchNorm(BatchNormed):
    """A batch norm kept in eval mode (running statistics read, never written: a frozen
    backbone's), ``_native_batch_norm_legit_no_training``."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(8)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
        self.bn.eval()


def test_batch_norm_in_eval_mode_matches_torch() -> None:
    specs = {"x": ((5, 6), torch.float64), "target": ((5,), torch.int64)}
    model = build(FrozenBatchNorm)
    model.bn.eval()  # (build() may not keep the mode: set it again)
    run_case(model, specs, 3, reuse=True)


def test_block_reuse_shares_graphs_and_expands_to_flat_size() -> None:
    model = build(TinyLM, layers=4)
    spec = trace_training_step(model, LM_SPECS)
    table = dict(spec.program.graphs)
    block_calls = [c for c in spec.program.calls if c.graph.startswith("block0")]
    assert len(block_calls) == 8  # forward and backward of four layers
    assert spec.program.unique_node_count < spec.program.expanded_node_count
    assert len(inline(spec.program).nodes) == spec.program.expanded_node_count
    assert {c.prefix for c in block_calls} == {f"layers.{i}" for i in range(4)}
    assert "block0.fwd" in table and "block0.bwd" in table


@pytest.fixture(scope="module")
def tiny_traces() -> tuple[nn.Module, dict]:
    """One TinyLM traced with and without block reuse, shared by the tests below."""
    model = build(TinyLM)
    return model, {reuse: trace_training_step(model, LM_SPECS, reuse=reuse)
                   for reuse in (False, True)}


def test_different_inputs_change_the_result(tiny_traces) -> None:
    """The comparison can fail: the IR evaluated on other data differs from torch's."""
    model, traces = tiny_traces
    spec = traces[True]
    args = random_inputs(LM_SPECS, 32, seed=1)
    other = random_inputs(LM_SPECS, 32, seed=2)
    with pytest.raises(AssertionError):
        check_spec(spec, ir_inputs(model, LM_SPECS, other),
                   torch_reference(model, LM_SPECS, args))


def test_module_paths_on_forward_and_backward_nodes(tiny_traces) -> None:
    _, traces = tiny_traces
    for reuse in (False, True):
        flat = traces[reuse].flat()
        seen = {(n.origin.phase, n.origin.module) for n in flat.nodes}
        assert ("forward", "layers.1.attn.wq") in seen
        assert ("backward", "layers.1.attn.wq") in seen
        assert ("backward", "emb") in seen


def test_parameters_are_named_by_torch_path(tiny_traces) -> None:
    model, traces = tiny_traces
    spec = traces[True]
    assert [p.name for p in spec.params] == [n for n, _ in model.named_parameters()]
    outputs = dict(spec.program.outputs)
    assert "loss" in outputs
    assert all(f"grad({n})" in outputs for n, _ in model.named_parameters())


def test_tracing_allocates_no_real_weights() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = TinyLM(vocab=50_000, dim=64, heads=4, layers=2)
    spec = trace_training_step(model, LM_SPECS)
    assert spec.param_count == sum(p.numel() for p in model.parameters())


class Floors(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.floor(self.inner(x)) * x).sum()


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y[y > 0].sum()


def test_unsupported_op_is_a_diagnostic_naming_op_and_module() -> None:
    with pytest.raises(SpecError) as caught:
        trace_training_step(Floors(), {"x": ((2, 4), torch.float32)})
    diagnostic = caught.value.diagnostics[0]
    assert diagnostic.code.id == "TVP304"
    assert "aten.floor" in diagnostic.message
    assert diagnostic.span.file.endswith("test_spec_trace.py")
    source = open(diagnostic.span.file, encoding="utf-8").read().splitlines()
    assert "torch.floor" in source[diagnostic.span.line - 1]


def test_data_dependent_shape_is_a_diagnostic() -> None:
    with pytest.raises(SpecError) as caught:
        trace_training_step(Masked(), {"x": ((2, 4), torch.float32)})
    assert caught.value.diagnostics[0].code.id == "TVP305"


def test_bad_input_spec_is_a_diagnostic() -> None:
    with pytest.raises(SpecError) as caught:
        trace_training_step(MLP(), {"x": ((0, 6), torch.float32), "target": ((5,), torch.int64)})
    assert caught.value.diagnostics[0].code.id == "TVP307"


class PairBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.tanh(self.fc(x))
        return x + y, y.pow(2).mean()


class PairStack(nn.Module):
    """Blocks return (hidden, auxiliary loss): no cut is possible, the flat trace is used."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(PairBlock() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        aux = x.new_zeros(())
        for layer in self.layers:
            x, extra = layer(x)
            aux = aux + extra
        return x.pow(2).sum() + aux


def test_blocks_returning_tuples_fall_back_to_a_flat_trace() -> None:
    specs = {"x": ((2, 4), torch.float64)}
    spec = run_case(build(PairStack), specs, 1, reuse=True)
    assert spec.groups == () and any("block reuse off" in n for n in spec.notes)


def test_user_model_file_by_path(tmp_path) -> None:
    from trainverify_dsl.spec.load import ModelAccess, load_model

    (tmp_path / "mine.py").write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self, width=3):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(width, 1)\n"
        "    def forward(self, x):\n"
        "        return self.fc(x).sum()\n", encoding="utf-8")
    beside = ModelAccess(base=tmp_path)  # as for a plan in tmp_path
    model = load_model("mine.py:Net", access=beside, width=5)
    spec = trace_training_step(model, {"x": ((2, 5), torch.float32)})
    assert spec.param_count == 6
    (tmp_path / "broken.py").write_text("def oops(:\n", encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_model(f"{tmp_path / 'broken.py'}:Net", access=beside)
    assert caught.value.diagnostics[0].code.id == "TVP303"
