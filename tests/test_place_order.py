"""`place` orders several `Shard(d)` of one dimension in mesh order, written positionally or
by name (docs/semantics.md §2.1, DTensor's default).

Found by an outside user: the named form took the written order, so on `mesh a=2, cols=2`
`place W [cols=S(0), a=S(0)]` cut the rows over (cols, a); a gather `over cols, a` was then
accepted (simulate agreed, check verified, against the documented meaning) and the right one,
`over a, cols`, was TVP406.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl.api import layout_diagnostics, simulate_file

MODEL = '''import torch
from torch import nn
import torch.nn.functional as F


class GLU(nn.Module):
    def __init__(self, d=4, f=8):
        super().__init__()
        self.d = d
        self.gate = nn.Linear(d, f, bias=False)
        self.up = nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def input_specs(self, batch, seq):
        dt = torch.get_default_dtype()
        return {"inp": ((batch, self.d), dt), "y": ((batch, self.d), dt)}

    def forward(self, inp, y):
        e = self.down(F.silu(self.gate(inp)) * self.up(inp)) - y
        return (e * e).mean()
'''


def plan(tmp_path: Path, placement: str, gather: str) -> Path:
    (tmp_path / "glu.py").write_text(MODEL)
    path = tmp_path / "place.tvp"
    path.write_text('plan place\nspec "glu.py:GLU" batch 2 seq 1\nspec-optimizer sgd lr=0.1\n'
                    f"mesh a=2, cols=2\nplace gate.weight {placement}\n"
                    "copy gate.in over a, cols\n"
                    f"all-gather gate.out over {gather} dim=1 backward scatter\n"
                    "optimizer sgd lr=0.1\n")
    return path


@pytest.mark.parametrize("placement", ["[S(0), S(0)]", "[a=S(0), cols=S(0)]",
                                       "[cols=S(0), a=S(0)]"])
def test_every_form_cuts_the_rows_in_mesh_order(tmp_path: Path, placement: str) -> None:
    right = plan(tmp_path, placement, "a, cols")
    assert not layout_diagnostics(right)
    assert simulate_file(right).agrees
    wrong = plan(tmp_path, placement, "cols, a")
    found = [(d.code.id, d.span.line) for d in layout_diagnostics(wrong)]
    assert found == [("TVP406", 7)], found
