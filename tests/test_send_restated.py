"""`send T from i to j` where stage `j` reads `T` itself binds it to that input (Rule 5.2):
the send restates the implied transfer.

Found by an outside user: a model with a long skip (`proj.out` read by the first and the last
stage) and `send proj.out from 0 to 2` was bound to stage 2's first input of the same shape
(block 2's output, from stage 1): TVP244 from lint, a counterexample from check and a
difference from the oracle, for a plan identical to the one without the `send`.
"""

from __future__ import annotations

from pathlib import Path

from trainverify_dsl.api import layout_diagnostics, simulate_file

MODELS = Path(__file__).resolve().parent / "models" / "block_nets.py"


def plan(tmp_path: Path, send: str) -> Path:
    path = tmp_path / "skip.tvp"
    path.write_text(f'plan skip\nspec "{MODELS}:SkipNet" batch 8 seq 1\nspec-optimizer sgd lr=0.1\n'
                    "mesh pp=3\nmicrobatches 2 schedule 1f1b\nloss-scale 1/microbatches\n"
                    "pipeline-stage 0: proj, blocks[0:1]\npipeline-stage 1: blocks[1:3]\n"
                    "pipeline-stage 2: blocks[3:4], head, loss\n"
                    f"{send}\noptimizer sgd lr=0.1\n")
    return path


def test_a_send_restating_the_implied_transfer_agrees(tmp_path: Path) -> None:
    path = plan(tmp_path, "send proj.out from 0 to 2")
    assert not layout_diagnostics(path)
    assert simulate_file(path).agrees


def test_a_send_to_a_stage_that_does_not_read_it_still_lands_on_its_input(
        tmp_path: Path) -> None:
    """Stage 1 does not read `proj.out` (it reads block 0's output): the send lands on its
    input of that shape, the wrong tensor (TVP244 at the send)."""
    path = plan(tmp_path, "send proj.out from 0 to 1")
    found = [(d.code.id, d.span.line) for d in layout_diagnostics(path)]
    assert ("TVP244", 10) in found, found
