"""Interleaved 1F1B: virtual stages (docs/semantics.md §5.3).

Each pp rank's layer chunks are stages of their own (chunk c of rank r is stage c*pp + r),
run on that rank; values are those of the plain pipeline, so the shipped interleaved plan
agrees with the spec (tests/test_simulate_plans.py) and is verified (tests/test_check.py).
Here: the program's shape, a head placed on the wrong rank, and the oracle's refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl.api import layout_diagnostics, prepare
from trainverify_dsl.ir.parallel import parallel_problems
from trainverify_dsl.lower.lowering import lower
from trainverify_dsl.lower.program import parallel_program
from trainverify_dsl.report import codes_plan

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "plans" / "llama_tiny_interleaved.tvp"


def test_each_chunk_is_a_stage_on_its_pp_rank() -> None:
    setup = prepare(PLAN)
    program = parallel_program(lower(setup.plan, setup.fake_model, setup.fake_inputs))
    assert parallel_problems(program) == []
    assert [(st.index, st.rank) for st in program.stages] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    # the chain of activations between consecutive virtual stages (plus the RoPE table the
    # embedding stage computes once)
    chain = {(t.source, t.dest) for t in program.transfers}
    assert {(0, 1), (1, 2), (2, 3)} <= chain
    # each layer's parameters are held by the stage of its chunk
    assert program.holders("layers.2.attention.wq.weight") == (2,)
    assert program.holders("embed.weight") == (0,)
    assert program.holders("output.weight") == (3,)
    assert [st.index for st in program.stages if st.output("loss")] == [3]


def test_head_on_the_first_rank_breaks_a_data_dependency(tmp_path: Path) -> None:
    """The norm, head and loss listed with pp rank 0 go to its last chunk (virtual stage 2),
    before layer 3 (virtual stage 3): a data dependency the layout pass reports at the stage,
    naming the virtual stages."""
    text = PLAN.read_text()
    text = text.replace("layers[2:3]\n", "layers[2:3], norm, output, loss\n")
    text = text.replace("layers[3:4], norm, output, loss\n", "layers[3:4]\n")
    plan = tmp_path / "head_on_rank0.tvp"
    plan.write_text(text)
    found = layout_diagnostics(plan, allow_model_outside_root=True)
    assert found, "the layout pass found nothing"
    first = found[0]
    assert first.code is codes_plan.STAGE_ORDER
    assert first.span.line == text.splitlines().index(
        "pipeline-stage 0: embed, layers[0:1], layers[2:3], norm, output, loss") + 1
    assert "virtual stage 2 (pp rank 0, chunk 1)" in first.message
    assert "virtual stage 3 (pp rank 1, chunk 1)" in first.message


def test_the_distributed_oracle_refuses_virtual_stages(tmp_path: Path) -> None:
    from trainverify_dsl.oracle import OracleError, run_distributed

    with pytest.raises(OracleError, match="virtual stages"):
        run_distributed(PLAN, tmp_path / "run")
