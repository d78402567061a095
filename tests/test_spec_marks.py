"""Marked points in the reference step's IR (issue 8, item 2).

The simulation and the checker read the reference's values at marked points (``X.in``,
``X.in#k``, ``X.out``) from the reference IR itself: the spec is traced with those modules
marked (``spec/marks.py``) and each point is an output ``point:<point>``. These tests hold the
traced values to eager torch (forward hooks, ``simulate.torch_step``), in both tracing modes
(one flat graph; blocks traced once and called per layer), and check that marks do not stop
identical layers from sharing one graph.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from trainverify_dsl.simulate.run import random_inputs
from trainverify_dsl.simulate.torch_step import ReferenceDisagrees, check_reference, torch_step
from trainverify_dsl.spec.load import load_model, model_input_specs
from trainverify_dsl.spec.trace import trace_training_step

LLAMA = "stdlib/models/llama.py:Llama"
#: block boundaries, points inside blocks (one layer's and another's), a second argument
#: (``in#1``: RoPE's table), outside the blocks before and after them
POINTS = ["embed.out", "layers.0.in", "layers.0.attention.in", "layers.0.attention.in#1",
          "layers.0.attention.wo.in", "layers.1.feed_forward.w2.out", "layers.1.out",
          "norm.out", "output.in"]


@pytest.fixture(scope="module")
def llama() -> tuple:
    fake = load_model(LLAMA, "llama_tiny")
    real = load_model(LLAMA, "llama_tiny", fake=False)
    return fake, real, dict(model_input_specs(fake, 4, 8))


@pytest.mark.parametrize("reuse", [False, True], ids=["flat", "blocks"])
def test_points_are_outputs_equal_to_eager_torch(llama: tuple, reuse: bool) -> None:
    fake, real, specs = llama
    spec = trace_training_step(fake, specs, reuse=reuse, points=POINTS)
    values = random_inputs(spec.program.inputs, real, np.random.default_rng(3))
    want = spec.evaluate(values)
    assert sorted(k for k in want if k.startswith("point:")) == sorted(f"point:{p}" for p in POINTS)
    eager = torch_step(real, values, list(specs), None, POINTS)
    for point in POINTS:
        got, expected = want[f"point:{point}"], eager[f"point:{point}"]
        assert got.shape == expected.shape, point
        scale = max(float(np.max(np.abs(expected))), 1e-12)
        assert float(np.max(np.abs(got - expected))) / scale < 1e-12, point
    # the rest of the step is what it was without marks
    plain = trace_training_step(fake, specs, reuse=reuse).evaluate(values)
    assert set(plain) == {k for k in want if not k.startswith("point:")}
    for name, value in plain.items():
        assert np.array_equal(value, want[name]), name


def test_marks_keep_identical_layers_in_one_graph(llama: tuple) -> None:
    fake, _, specs = llama
    plain = trace_training_step(fake, specs)
    every_layer = [f"layers.{i}.attention.wo.out" for i in range(2)] + ["layers.0.in",
                                                                         "layers.1.in"]
    marked = trace_training_step(fake, specs, points=every_layer)
    assert len(marked.program.graphs) == len(plain.program.graphs)
    assert marked.groups == plain.groups
    # a point in one layer only: that layer has a graph of its own
    one = trace_training_step(fake, specs, points=["layers.1.attention.wo.out"])
    assert len(one.program.graphs) == len(plain.program.graphs) + 2


class _Twice(nn.Module):
    """A module called twice (the same norm applied two times) and one never called."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.tanh(self.lin(x))).pow(2).mean()

    def input_specs(self, batch: int, seq: int) -> dict:
        return {"x": ((batch, 4), torch.float32)}


def test_a_module_called_twice_keeps_its_last_call_and_an_unreached_point_has_none() -> None:
    torch.manual_seed(0)
    model = _Twice()
    spec = trace_training_step(model, {"x": ((3, 4), torch.float32)}, reuse=False,
                               points=["lin.in", "lin.out", "unused.out"])
    values = random_inputs(spec.program.inputs, model, np.random.default_rng(0))
    want = spec.evaluate(values)
    assert "point:unused.out" not in want
    eager = torch_step(model, values, ["x"], None, ["lin.in", "lin.out"])
    for point in ("lin.in", "lin.out"):
        assert np.allclose(want[f"point:{point}"], eager[f"point:{point}"], rtol=1e-12), point
    assert not np.allclose(want["point:lin.in"], values["x"])  # the second call's input


def test_a_wrong_value_at_a_point_is_a_wrong_reference(llama: tuple) -> None:
    fake, real, specs = llama
    spec = trace_training_step(fake, specs, reuse=False, points=["layers.1.attention.wo.in"])
    values = random_inputs(spec.program.inputs, real, np.random.default_rng(5))
    want = spec.evaluate(values)
    data = list(specs)
    assert check_reference(want, real, values, data, None, 1e-9, 1e-6) == 1 + 1 + len(
        list(real.parameters()))
    wrong = dict(want)
    wrong["point:layers.1.attention.wo.in"] = want["point:layers.1.attention.wo.in"] * (1 + 1e-6)
    with pytest.raises(ReferenceDisagrees, match="wo.in"):
        check_reference(wrong, real, values, data, None, 1e-9, 1e-6)
