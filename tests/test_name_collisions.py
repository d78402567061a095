"""Names that meant something they should not (docs/language.md, "Names in expressions"):

- a module called `grad` is addressed as `grad.weight` (`grad` is a keyword only before `(`);
- a mesh axis called `batch`, `seq` or `microbatches` would mean either the axis's size or the
  step's count in expressions: TVP206 at the axis;
- a model whose `input_specs` lists forward's inputs in another order would pass each input to
  the other's parameter (inputs go by position): TVP307 at the spec line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl import api
from trainverify_dsl.parse.parser import parse_source
from trainverify_dsl.plan.resolve import resolve_file

ROOT = Path(__file__).resolve().parents[1]
MODEL = '''import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.d = d
        self.grad = nn.Linear(d, d, bias=False)
        self.head = nn.Linear(d, d, bias=False)

    def input_specs(self, batch, seq):
        dt = torch.get_default_dtype()
        return {INPUTS}

    def forward(self, x0, target):
        e = self.head(torch.relu(self.grad(x0))) - target
        return (e * e).mean()
'''
IN_ORDER = '{"x0": ((batch, self.d), dt), "target": ((batch, self.d), dt)}'
PLAN = ('plan t\nspec "model.py:Net" batch 8 seq 1\nspec-optimizer sgd lr=0.1\nmesh tp=2\n'
        "split grad.weight [tp, -]\ncopy grad.in over tp\nsplit head.weight [-, tp]\n"
        "all-reduce head.out over tp\noptimizer sgd lr=0.1\n")


def write(tmp_path: Path, plan: str, inputs: str = IN_ORDER) -> Path:
    (tmp_path / "model.py").write_text(MODEL.replace("{INPUTS}", inputs))
    path = tmp_path / "p.tvp"
    path.write_text(plan)
    return path


def test_a_module_called_grad_is_a_path(tmp_path: Path) -> None:
    path = write(tmp_path, PLAN)
    assert [d for d in resolve_file(path).diagnostics if d.severity == "error"] == []
    assert [d for d in api.layout_diagnostics(path) if d.severity == "error"] == []
    assert api.simulate_file(path).agrees
    # and `grad(...)` is still the gradient
    assert parse_source("all-reduce grad (fc1.weight) over dp\n").diagnostics == ()


@pytest.mark.parametrize("axis", ["batch", "seq", "microbatches"])
def test_a_mesh_axis_named_like_a_count_is_tvp206(tmp_path: Path, axis: str) -> None:
    path = tmp_path / "p.tvp"
    path.write_text('plan t\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
                    f"mesh {axis}=2\nsplit x [{axis}, -]\nsplit target [{axis}, -]\n")
    found = [(d.code.id, d.span.line, d.span.col) for d in resolve_file(path).diagnostics
             if d.severity == "error"]
    assert found == [("TVP206", 3, 6)]


def test_inputs_listed_out_of_forward_order_are_tvp307(tmp_path: Path) -> None:
    swapped = '{"target": ((batch, self.d), dt), "x0": ((batch, self.d), dt)}'
    path = write(tmp_path, PLAN, swapped)
    found = [d for d in api.layout_diagnostics(path) if d.severity == "error"]
    assert [(d.code.id, d.span.line) for d in found] == [("TVP307", 2)]
    assert "x0, target" in found[0].message


@pytest.mark.parametrize("rename", ["input", "module"])
def test_the_name_loss_on_an_input_or_a_module_is_tvp315(tmp_path: Path, rename: str) -> None:
    """`loss` is the step's loss in plans and the IR: an input named so read `split loss` as
    a claim on the scalar loss, and the commands that build the model ended in TVP308
    ('loss' defined twice) at no real location; a top-level module named so could not be put
    on a pipeline stage."""
    model = MODEL.replace("{INPUTS}", IN_ORDER)
    if rename == "input":
        model = model.replace('"target"', '"loss"').replace(", target)", ", loss)") \
            .replace("- target", "- loss")
    else:
        model = model.replace("self.head", "self.loss")
    (tmp_path / "model.py").write_text(model)
    path = tmp_path / "p.tvp"
    path.write_text('plan t\nspec "model.py:Net" batch 8 seq 1\nspec-optimizer sgd lr=0.1\n'
                    "mesh dp=2\nsplit x0 [dp, -]\nall-reduce grad(params) over dp op=avg\n"
                    "optimizer sgd lr=0.1\n")
    found = [d for d in api.layout_diagnostics(path) if d.severity == "error"]
    assert [d.code.id for d in found] == ["TVP315"]
    assert "`loss`" in found[0].message
