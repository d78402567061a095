"""A penalty on the parameters added to the loss (``mse + λ·Σw²``): every rank computes it
whole, so it is no loss over the batch (docs/semantics.md §4.3, "Several normalisers") and
enters the average of the local losses once (§4.2 item 5). The data-parallel plan that
averages gradients is correct — a real DDP run computes exactly the spec's gradient — and
the plans that count the penalty more than once are still found."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from trainverify_dsl.api import layout_diagnostics, simulate_file

MODELS = textwrap.dedent('''\
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Penalised(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 8)
            self.fc2 = nn.Linear(8, 4)

        def input_specs(self, batch, seq):
            return {"x": ((batch, 4), torch.float32), "target": ((batch, 4), torch.float32)}

        def forward(self, x, target):
            err = self.fc2(F.relu(self.fc1(x))) - target
            return (err * err).mean() + 0.01 * (self.fc1.weight ** 2).sum()


    class PenaltyFirst(Penalised):
        def forward(self, x, target):
            err = self.fc2(F.relu(self.fc1(x))) - target
            return (self.fc2.weight ** 2).mean() * 0.5 - (err * err).mean()


    class PenaltyOnActivations(Penalised):
        def forward(self, x, target):  # reads the data: a sum over the batch
            h = self.fc1(x)
            err = self.fc2(F.relu(h)) - target
            return (err * err).mean() + 0.01 * (h ** 2).sum()
''')

PLAN = """plan penalty
spec "models.py:{model}" batch 8 seq 1
spec-optimizer sgd lr=0.1
mesh dp=2
microbatches 2
loss-scale {scale}
split x [dp, -]
split target [dp, -]
all-reduce grad(params) over dp op={op}
optimizer sgd lr=0.1
"""


def _plan(tmp_path: Path, model: str, op: str = "avg", scale: str = "1/microbatches") -> Path:
    (tmp_path / "models.py").write_text(MODELS, encoding="utf-8")
    path = tmp_path / f"{model}_{op}.tvp"
    path.write_text(PLAN.format(model=model, op=op, scale=scale), encoding="utf-8")
    return path


def _codes(path: Path) -> list[str]:
    return [d.code.id for d in layout_diagnostics(path, allow_model_outside_root=True)]


@pytest.mark.parametrize("model", ["Penalised", "PenaltyFirst"])
def test_a_penalty_on_the_parameters_agrees_under_data_parallelism(tmp_path: Path,
                                                                   model: str) -> None:
    path = _plan(tmp_path, model)
    assert _codes(path) == []
    result = simulate_file(path, allow_model_outside_root=True)
    assert result.agrees, result.first


@pytest.mark.parametrize("op,scale,code", [("sum", "1/microbatches", "TVP411"),
                                           ("avg", "1", "TVP411")])
def test_a_penalty_counted_more_than_once_is_still_found(tmp_path: Path, op: str, scale: str,
                                                         code: str) -> None:
    path = _plan(tmp_path, "Penalised", op, scale)
    assert code in _codes(path)
    result = simulate_file(path, stop_on_errors=False, allow_model_outside_root=True)
    assert not result.agrees


def test_a_sum_over_activations_is_still_a_sum_over_the_batch(tmp_path: Path) -> None:
    path = _plan(tmp_path, "PenaltyOnActivations")
    assert "TVP414" in _codes(path)
