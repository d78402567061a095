"""A user model's `n_layers` argument is not its module list's length (docs/language.md,
`pipeline-stage`): the lists are checked at the model's real lengths once it is built. Before,
a model building `2 * n_layers` blocks got TVP268 for a correct `blocks[2:4]` from every
command, and one building `n_layers // 2` got TVP245 for a correct plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl import api
from trainverify_dsl.plan.resolve import resolve_file

MODEL = '''import torch
from torch import nn


class Pairs(nn.Module):
    def __init__(self, d=4, n_layers=1):
        super().__init__()
        self.d = d
        self.blocks = nn.ModuleList([nn.Linear(d, d) for _ in range(BLOCKS)])

    def input_specs(self, batch, seq):
        dt = torch.get_default_dtype()
        return {"x": ((batch, self.d), dt), "y": ((batch, self.d), dt)}

    def forward(self, x, y):
        h = x
        for b in self.blocks:
            h = torch.tanh(b(h))
        return ((h - y) ** 2).mean()
'''
PLAN = ('plan n\nspec "model.py:Pairs" batch 8 seq 1 n_layers {n}\nspec-optimizer sgd lr=0.1\n'
        "mesh pp=2\nmicrobatches 2\nloss-scale 1/microbatches\n"
        "pipeline-stage 0: blocks[0:{a}]\npipeline-stage 1: blocks[{a}:{b}], loss\n"
        "optimizer sgd lr=0.1\n")


def write(tmp_path: Path, blocks: str, a: int, b: int) -> Path:
    """``n_layers 2`` for ``2 * n_layers`` blocks (4 of them), ``n_layers 4`` for
    ``n_layers // 2`` (2 of them)."""
    (tmp_path / "model.py").write_text(MODEL.replace("BLOCKS", blocks))
    path = tmp_path / "p.tvp"
    path.write_text(PLAN.format(a=a, b=b, n=2 if blocks.startswith("2") else 4))
    return path


@pytest.mark.parametrize(("blocks", "a", "b"), [("2 * n_layers", 2, 4),
                                                ("n_layers // 2", 1, 2)])
def test_the_real_length_decides(tmp_path: Path, blocks: str, a: int, b: int) -> None:
    path = write(tmp_path, blocks, a, b)
    assert [d for d in resolve_file(path).diagnostics if d.severity == "error"] == []
    assert [d for d in api.layout_diagnostics(path) if d.severity == "error"] == []
    assert api.simulate_file(path).agrees


def test_a_selection_past_the_real_end_is_tvp268(tmp_path: Path) -> None:
    path = write(tmp_path, "n_layers // 2", 1, 4)
    found = [(d.code.id, d.span.line) for d in api.layout_diagnostics(path)
             if d.severity == "error"]
    assert found == [("TVP268", 8)]
