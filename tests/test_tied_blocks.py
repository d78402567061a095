"""A weight shared between blocks of the layer list (cross-layer sharing, as ALBERT's) is
traced as one model, not block by block.

Found by an outside user: `blocks[3].lin.weight = blocks[0].lin.weight` was TVP308 ("not
defined yet") from `tvp spec`, `tvp simulate` and `tvp check`, while lint and the oracle took
the plan: block 3 reused block 0's graph under its own parameter name, which the model does
not have, and its gradient belongs to block 0's parameter.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl.api import check_file, simulate_file

MODEL = '''import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.lin = nn.Linear(h, h)

    def forward(self, x):
        return x + torch.relu(self.lin(x))


class TiedNet(nn.Module):
    def __init__(self, d: int = 4, hid: int = 8, n_blocks: int = 4):
        super().__init__()
        self.d = d
        self.proj = nn.Linear(d, hid, bias=False)
        self.blocks = nn.ModuleList([Block(hid) for _ in range(n_blocks)])
        self.blocks[n_blocks - 1].lin.weight = self.blocks[0].lin.weight
        self.head = nn.Linear(hid, d, bias=False)

    def input_specs(self, batch, seq):
        dt = torch.get_default_dtype()
        return {"inp": ((batch, self.d), dt), "lbl": ((batch, self.d), dt)}

    def forward(self, inp, lbl):
        h = self.proj(inp)
        for b in self.blocks:
            h = b(h)
        err = self.head(h) - lbl
        return (err * err).mean()
'''


def plan(tmp_path: Path, group: str) -> Path:
    (tmp_path / "tied.py").write_text(MODEL)
    path = tmp_path / "tied.tvp"
    path.write_text('plan tied\nspec "tied.py:TiedNet" batch 8 seq 1\n'
                    "spec-optimizer adam lr=0.01\nmesh pp=2, rows=2\n"
                    "microbatches 2 schedule 1f1b\nloss-scale 1/microbatches\n"
                    "split inp [rows, -]\nsplit lbl [rows, -]\n"
                    "pipeline-stage 0: proj, blocks[0:2]\n"
                    "pipeline-stage 1: blocks[2:4], head, loss\n"
                    f"{group}all-reduce grad(params) over rows op=avg\n"
                    "optimizer adam lr=0.01\n")
    return path


def test_a_weight_tied_across_blocks_and_stages_is_verified(tmp_path: Path) -> None:
    path = plan(tmp_path, "all-reduce grad(blocks.0.lin.weight) over pp\n")
    assert simulate_file(path).agrees
    verdict = check_file(path, cache=False)
    assert verdict.verdict == "verified", verdict.reason


def test_without_the_group_sum_the_copies_drift(tmp_path: Path) -> None:
    from trainverify_dsl.api import SimulationSetupError, layout_diagnostics

    path = plan(tmp_path, "")
    assert [d.code.id for d in layout_diagnostics(path)] == ["TVP410"]
    with pytest.raises(SimulationSetupError, match="partial over pp"):
        simulate_file(path)
