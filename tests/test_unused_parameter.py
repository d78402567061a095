"""A parameter the loss does not use (an unused pooler): torch gives it no gradient and its
optimizers skip it, so the step neither reports nor updates it (session 19, outside report:
the eager checks set its gradient to zeros, so simulate ended in "no verdict", check in an
error and run-distributed in a difference on a correct plan)."""

from __future__ import annotations

from pathlib import Path

from trainverify_dsl import api
from trainverify_dsl.oracle import run_distributed

MODEL = '''import torch
from torch import nn


class WithPooler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.pooler = nn.Linear(8, 8)  # built, never called

    def input_specs(self, batch, seq):
        return {"inp": ((batch, seq), torch.int64), "tgt": ((batch, seq), torch.int64)}

    def forward(self, inp, tgt):
        lg = self.head(torch.tanh(self.emb(inp)))
        return -torch.log_softmax(lg, -1).gather(-1, tgt.unsqueeze(-1)).mean()
'''

PLAN = '''plan pooler
spec "pooler.py:WithPooler" batch 4 seq 4
spec-optimizer OPT
mesh dp=2
split inp [dp, -]
split tgt [dp, -]
all-reduce grad(params) over dp op=avg
optimizer OPT
'''


def test_an_unused_parameter_is_neither_reported_nor_updated(tmp_path: Path) -> None:
    (tmp_path / "pooler.py").write_text(MODEL)
    for opt in ("sgd lr=0.1 weight-decay=0.1", "adamw lr=0.01"):
        path = tmp_path / "pooler.tvp"
        path.write_text(PLAN.replace("OPT", opt))
        result = api.simulate_file(path)
        assert result.agrees
        verdict = api.check_file(path, cache=False)
        assert verdict.verdict == "verified", verdict.reason
        assert run_distributed(path).agrees
