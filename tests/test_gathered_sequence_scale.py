"""A sequence split over a data axis, gathered for a module and scattered again, or gathered
before a loss every rank computes whole (docs/semantics.md §4.7): correct plans the layout
pass rejected with TVP411 (and TVP406) while gloo agreed.

- Gathered and scattered again: every rank's gradient of the gathering module reads every
  block's cotangent (the scatter's all-gather backward), so the §4.7 product depends on the
  activations and is left to the simulation, as for a backward that sums over a data axis.
- Gathered before a whole loss: the all-gather's reduce-scatter backward sums `sp` complete
  copies; `loss-scale 1/sp` divides them back. Without the loss scale it stays TVP406.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl import api
from trainverify_dsl.api import simulate_file
from trainverify_dsl.oracle import run_distributed

MODEL = '''import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, d=4, hidden=8):
        super().__init__()
        self.d = d
        self.enc = nn.Linear(d, hidden)
        self.head = nn.Linear(hidden, d)

    def input_specs(self, batch, seq):
        dt = torch.get_default_dtype()
        return {"x0": ((batch, seq, self.d), dt), "y": ((batch, {Y}self.d), dt)}

    def forward(self, x0, y):
        h = torch.tanh(self.enc(x0))
        e = self.head({POOL}) - y
        return (e * e).mean()
'''
HEAD = 'plan t\nspec "model.py:Net" batch 2 seq 4\nspec-optimizer sgd lr=0.1\nmesh sp=2\n'
PER_TOKEN = (HEAD + "loss-scale 1/sp\nsplit x0 [-, sp, -]\nsplit y [-, sp, -]\n"
             "all-gather enc.in over sp dim=1 backward scatter\nscatter enc.out over sp dim=1\n"
             "all-reduce grad(head.*) over sp\noptimizer sgd lr=0.1\n")
POOLED = (HEAD + "loss-scale 1/sp\nsplit x0 [-, sp, -]\nall-gather enc.out over sp dim=1\n"
          "all-reduce grad(params) over sp\noptimizer sgd lr=0.1\n")


def write(tmp_path: Path, plan: str, pooled: bool) -> Path:
    model = MODEL.replace("{Y}", "" if pooled else "seq, ").replace(
        "{POOL}", "h.mean(1)" if pooled else "h")
    (tmp_path / "model.py").write_text(model)
    path = tmp_path / "p.tvp"
    path.write_text(plan)
    return path


def errors(path: Path) -> list[tuple[str, int]]:
    return [(d.code.id, d.span.line) for d in api.layout_diagnostics(path)
            if d.severity == "error"]


@pytest.mark.parametrize(("plan", "pooled"), [(PER_TOKEN, False), (POOLED, True)],
                         ids=["gathered-and-scattered", "gathered-before-the-loss"])
def test_the_correct_plan_lints_clean_and_agrees(tmp_path: Path, plan: str,
                                                 pooled: bool) -> None:
    path = write(tmp_path, plan, pooled)
    assert errors(path) == []
    assert simulate_file(path).agrees
    assert run_distributed(path, timeout=120).agrees


def test_without_the_loss_scale_the_sum_of_copies_is_still_tvp406(tmp_path: Path) -> None:
    path = write(tmp_path, POOLED.replace("loss-scale 1/sp\n", ""), True)
    assert ("TVP406", 6) in errors(path)
    with pytest.raises(api.SimulationSetupError):  # the layout pass stops the simulation
        simulate_file(path)


def test_the_wrong_twin_differs(tmp_path: Path) -> None:
    """The per-token plan with the gradients averaged and no loss scale: `enc` gets the mean
    of the blocks' gradients where the spec has their sum over a mean loss."""
    wrong = PER_TOKEN.replace("loss-scale 1/sp\n", "").replace(
        "all-reduce grad(head.*) over sp", "all-reduce grad(head.*) over sp op=avg")
    assert not simulate_file(write(tmp_path, wrong, False)).agrees
