"""`argmax` in a model's step (top-1 routing, a picked class used as a feature): the layout
rule knows the index dimension is removed unless `keepdim` (session 19, outside report: with
`keepdim=False` every command ended in an internal IndexError; run-distributed printed a
traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl import api

MODEL = '''import torch
from torch import nn


class Pick(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)

    def input_specs(self, batch, seq):
        return {"inp": ((batch, seq), torch.int64), "tgt": ((batch, seq), torch.int64)}

    def forward(self, inp, tgt):
        lg = self.head(torch.tanh(self.emb(inp)))
        pick = PICK
        return (lg.pow(2).mean(-1) * (pick == tgt).to(lg.dtype)).mean() + lg.pow(2).mean()
'''

PLAN = '''plan pick
spec "pick.py:Pick" batch 4 seq 4
spec-optimizer sgd lr=0.1
mesh dp=2
split inp [dp, -]
split tgt [dp, -]
all-reduce grad(params) over dp op=avg
optimizer sgd lr=0.1
'''


def plan(tmp_path: Path, pick: str, text: str = PLAN) -> Path:
    (tmp_path / "pick.py").write_text(MODEL.replace("PICK", pick))
    path = tmp_path / "pick.tvp"
    path.write_text(text)
    return path


@pytest.mark.parametrize("pick", ["lg.argmax(dim=-1)", "lg.argmax(-1, keepdim=True)[..., 0]",
                                  "lg.argmax(dim=2)",
                                  # session 20: `torch.max` had no layout rule (TVP403 on a
                                  # correct plan); its values and indices along a dimension
                                  "lg.max(dim=-1).indices", "torch.max(lg, 2)[1]"])
def test_argmax_along_an_unsplit_dimension_agrees(tmp_path: Path, pick: str) -> None:
    path = plan(tmp_path, pick)
    assert api.layout_diagnostics(path) == []
    assert api.simulate_file(path).agrees
    assert api.check_file(path, cache=False).verdict == "verified"


def test_argmax_along_a_split_dimension_is_a_layout_error(tmp_path: Path) -> None:
    path = plan(tmp_path, "lg.argmax(dim=1, keepdim=True)[..., 0]",
                PLAN.replace("split inp [dp, -]", "split inp [-, dp]")
                    .replace("split tgt [dp, -]", "split tgt [-, dp]"))
    assert "TVP403" in [d.code.id for d in api.layout_diagnostics(path)]


@pytest.mark.parametrize("loss", [
    "lg.max(dim=-1).values.mean()",  # the values' backward takes the drawn maximum
    # session 20: one_hot's range checks (`any` over the split batch, asserted) had no
    # layout rule; a check computes no value and is dropped from the plan's forward
    "(torch.nn.functional.one_hot(lg.argmax(-1), 16).to(lg.dtype) * lg).sum(-1).mean()",
    "torch.max(lg, -lg).mean()",  # of two tensors: as maximum
])
def test_torch_max_in_the_loss_is_proven(tmp_path: Path, loss: str) -> None:
    source = MODEL.replace("PICK", "None").replace(
        "return (lg.pow(2).mean(-1) * (pick == tgt).to(lg.dtype)).mean() + lg.pow(2).mean()",
        f"return {loss}")
    (tmp_path / "pick.py").write_text(source)
    path = tmp_path / "pick.tvp"
    path.write_text(PLAN)
    assert api.layout_diagnostics(path) == []
    assert api.simulate_file(path).agrees
    verdict = api.check_file(path, cache=False)
    assert verdict.verdict == "verified", verdict.reason


def test_the_maximum_of_a_split_batch_is_a_partial_maximum(tmp_path: Path) -> None:
    """`lg.max()` over every element of a batch split over dp is each rank's own maximum (as
    `amax`): used as the batch's, without an all-reduce, the layout pass says so."""
    source = MODEL.replace("PICK", "None").replace(
        "return (lg.pow(2).mean(-1) * (pick == tgt).to(lg.dtype)).mean() + lg.pow(2).mean()",
        "return lg.max() + lg.pow(2).mean()")
    (tmp_path / "pick.py").write_text(source)
    path = tmp_path / "pick.tvp"
    path.write_text(PLAN)
    assert "TVP404" in [d.code.id for d in api.layout_diagnostics(path)]
