"""A loss computed on embeddings gathered over the data ranks (CLIP, SimCLR: every rank
scores its rows against every rank's): each rank holds the whole loss, and the cotangent of
the gathered embeddings is complete on every rank. `all-gather`'s default backward sums it
over the ranks (a reduce-scatter, as `torch.distributed.nn.all_gather` does), so the
gradients come out `|dp|` times their share, and the data-parallel average divides that
back: open_clip's recipe, correct, and a real DDP run computes the spec's gradient. The
layout pass called it TVP406 at both gathers (a complete gradient summed). It now defers
that factor to the parameters it reaches (``lower/gradients.py``, ``_Factor``): an average
over the same axis undoes it; otherwise it is TVP406 at the gather, as before."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from trainverify_dsl.api import check_file, layout_diagnostics, simulate_file

MODELS = textwrap.dedent('''\
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Clip(nn.Module):
        def __init__(self):
            super().__init__()
            self.image = nn.Linear(4, 8)
            self.text = nn.Linear(4, 8)

        def input_specs(self, batch, seq):
            return {"pixels": ((batch, 4), torch.float32), "words": ((batch, 4), torch.float32)}

        def forward(self, pixels, words):
            a, b = self.image(pixels), self.text(words)
            logits = a @ b.t()
            labels = torch.arange(logits.shape[0], device=logits.device)
            return F.cross_entropy(logits, labels)
''')

PLAN = """plan clip
spec "models.py:Clip" batch 8 seq 1
spec-optimizer sgd lr=0.1
mesh rows=2
split pixels [rows, -]
split words [rows, -]
all-gather image.out over rows dim=0{backward}
all-gather text.out over rows dim=0{backward}
all-reduce grad(params) over rows op={op}
optimizer sgd lr=0.1
"""


def _plan(tmp_path: Path, op: str, backward: str = "") -> Path:
    (tmp_path / "models.py").write_text(MODELS, encoding="utf-8")
    path = tmp_path / f"clip_{op}{backward.strip().replace(' ', '_')}.tvp"
    path.write_text(PLAN.format(op=op, backward=backward), encoding="utf-8")
    return path


def _found(path: Path) -> list[tuple[str, int]]:
    return [(d.code.id, d.span.line)
            for d in layout_diagnostics(path, allow_model_outside_root=True)]


@pytest.mark.parametrize("op,backward", [("avg", ""), ("sum", " backward scatter")])
def test_a_loss_on_gathered_embeddings_is_verified_when_the_factors_cancel(
        tmp_path: Path, op: str, backward: str) -> None:
    """The default backward (sums the complete cotangent: x2) with the average (/2), and the
    `scatter` backward (takes the rank's rows) with the sum of the shares."""
    path = _plan(tmp_path, op, backward)
    assert _found(path) == []
    assert simulate_file(path, allow_model_outside_root=True).agrees
    if op == "avg":
        verdict = check_file(path, allow_model_outside_root=True, cache=False)
        assert verdict.verdict == "verified", verdict.reason


def test_the_summing_backward_without_the_average_is_found_at_the_gathers(
        tmp_path: Path) -> None:
    path = _plan(tmp_path, "sum")
    assert _found(path) == [("TVP406", 7), ("TVP406", 8)]
    assert not simulate_file(path, stop_on_errors=False, allow_model_outside_root=True).agrees


def test_the_scattering_backward_with_the_average_is_found_at_the_average(
        tmp_path: Path) -> None:
    path = _plan(tmp_path, "avg", " backward scatter")
    assert _found(path) == [("TVP406", 9), ("TVP411", 9)]  # divides shares: 1/2 the spec's
    assert not simulate_file(path, stop_on_errors=False, allow_model_outside_root=True).agrees
