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

MODELS = Path(__file__).resolve().parent / "models" / "block_nets.py"


def plan(tmp_path: Path, group: str) -> Path:
    path = tmp_path / "tied.tvp"
    path.write_text(f'plan tied\nspec "{MODELS}:TiedNet" batch 8 seq 1\n'
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
