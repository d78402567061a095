"""A model of the user's own keeps its `batch` and `seq` unless its class lists them in
``WIDTHS`` (docs/semantics.md §9 rule 2, docs/models.md).

Found by an outside user: a sliding-window attention of width 2 is plain causal attention at
``seq`` 2, so a plan replacing it by causal context-parallel attention was proven at the
shrunk sequence (`tvp check`: verified) and agreed in `tvp simulate` when a large field made
it shrink, while the full-size plan differs. A model whose RoPE table is shorter than the
probe's sequence was an internal error of `tvp check`.
"""

from __future__ import annotations

from pathlib import Path

from trainverify_dsl.api import _plain, check_file, locate_model, resolve_plan, simulate_file
from trainverify_dsl.check.verdict import COUNTEREXAMPLE, VERIFIED
from trainverify_dsl.shrink import shrink_plan

MODEL = Path(__file__).resolve().parent / "models" / "sliding_window.py"


def plan(tmp_path: Path, settings: str) -> Path:
    path = tmp_path / "swa_cp.tvp"
    path.write_text(f'plan swa_cp\nspec "{MODEL}:SlidingWindowLM" {settings} batch 2 seq 8\n'
                    "spec-optimizer sgd lr=0.1\nmesh dp=2, cp=2\n"
                    "split inp [dp, cp]\nsplit tgt [dp, cp]\n"
                    "algorithm context-parallel-attention for attention over cp\n"
                    "all-reduce grad(params) over dp, cp op=avg\noptimizer sgd lr=0.1\n")
    return path


def sizes(path: Path) -> tuple[dict[str, int], int, int]:
    p = resolve_plan(path)
    assert p.spec is not None
    settings = {k: _plain(v) for k, v in p.spec.settings if k not in ("config", "batch", "seq")}
    shrunk = shrink_plan(p, settings, locate_model(p, path, allow_outside_root=True))
    return shrunk.overrides, shrunk.batch, shrunk.seq


def test_a_sliding_window_replaced_by_causal_attention_is_a_counterexample(
        tmp_path: Path) -> None:
    # max_seq 256 is above the simulation's shrinking threshold: it shrank seq to 2 and agreed
    path = plan(tmp_path, "window 2 max_seq 256")
    assert sizes(path) == ({}, 2, 8)
    result = simulate_file(path)
    assert not result.agrees and result.max_rel_error > 0.1
    assert result.first is not None and result.first.span.line == 7  # the algorithm
    verdict = check_file(path)
    assert verdict.verdict == COUNTEREXAMPLE, verdict.reason
    assert not any("shrunk" in a for a in verdict.assumptions)


def test_a_window_as_long_as_the_sequence_is_verified_at_its_own_sizes(tmp_path: Path) -> None:
    """Window 8 at seq 8 is causal attention: the plan is right. The RoPE table of 16 rows was
    an internal error (the probe built the model at seq 103)."""
    path = plan(tmp_path, "window 8 max_seq 16")
    verdict = check_file(path)
    assert verdict.verdict == VERIFIED, verdict.reason
    assert not any("shape reduction" in a for a in verdict.assumptions), verdict.assumptions
