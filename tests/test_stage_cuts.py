"""Stage cuts (``check/stages.py``): the proof cut where a pipeline plan sends the hidden
state between blocks.

- The hooks that see values crossing stages change nothing when they replace nothing
  (numerically, on a pipeline plan: the reference step and every rank's outputs).
- Marking every block boundary (``tvp check``'s lowering) changes no value of the step.
- A pipeline plan's cuts: each boundary it sends, the cotangent's ratio measured (the
  gradient average over ``dp=2`` makes the local cotangent twice the reference's), and the
  verdict proven in stages (``stages_total`` = cuts + 1), in the API and in the JSON.
- A cut that does not hold proves nothing: with a wrong cotangent ratio the cut proof is not
  ``proven``, and the verdict comes from the uncut proof, with a note saying so.
- A plan without pipeline stages is split at every block for the checker (one stage per
  block on the same ranks); a model without a block list is one stage.
"""

from __future__ import annotations

import json
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from trainverify_dsl import api
from trainverify_dsl.check import prove as prove_module
from trainverify_dsl.check import stages
from trainverify_dsl.check.verdict import VERIFIED
from trainverify_dsl.cli.main import main
from trainverify_dsl.ir.execute import evaluate_parallel
from trainverify_dsl.ir.program import evaluate_program

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ROOT / "plans" / "llama_tiny_interleaved.tvp"


@pytest.fixture(scope="module")
def interleaved():
    built = api.build_programs(PIPELINE, shrink=True, blocks=True)
    model = built.setup.build_real()
    values = api.step_values(built.program, built.spec, model, 0)
    return built, values


def _assert_same(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


class _Identity:
    def __init__(self) -> None:
        self.seen = {"forward": 0, "cotangent": 0}

    def forward(self, t, rank, coords, value):
        self.seen["forward"] += 1
        return value

    def cotangent(self, t, rank, coords, value):
        self.seen["cotangent"] += 1
        return value


def test_hooks_that_replace_nothing_change_nothing(interleaved) -> None:
    built, values = interleaved
    hook = _Identity()
    plain = evaluate_parallel(built.program, values)
    seen = evaluate_parallel(built.program, values, boundaries=hook)
    _assert_same(plain.losses, seen.losses)
    _assert_same(plain.grads, seen.grads)
    _assert_same(plain.updates, seen.updates)
    # three boundaries, two microbatches, two ranks each (dp=2); both sweeps receive
    assert hook.seen["forward"] == 3 * 2 * 2 * 2
    assert hook.seen["cotangent"] == 3 * 2 * 2
    names: list[str] = []
    ref = evaluate_program(built.spec.program, values)
    again = evaluate_program(built.spec.program, values,
                             replace=lambda name, v: names.append(name) or v)
    _assert_same(ref, again)
    assert "layers.1/out" in names and "layers.2/grad(in)" in names


@pytest.mark.parametrize("name", ["llama_tiny_interleaved", "llama_tiny_tied", "llama_tiny_tp"])
def test_marking_the_blocks_changes_no_value(name: str) -> None:
    plain = api.build_programs(ROOT / "plans" / f"{name}.tvp", shrink=True)
    marked = api.build_programs(ROOT / "plans" / f"{name}.tvp", shrink=True, blocks=True)
    model = plain.setup.build_real()
    values = api.step_values(plain.program, plain.spec, model, 0)
    a = evaluate_parallel(plain.program, values)
    b = evaluate_parallel(marked.program, values)
    _assert_same(a.losses, b.losses)
    _assert_same(a.grads, b.grads)
    _assert_same(a.updates, b.updates)
    # the block-by-block reference computes the flat one's outputs
    ref_flat = evaluate_program(plain.spec.program, values)
    ref_blocks = evaluate_program(marked.spec.program, values)
    for out in ref_flat:
        if not out.startswith("point:"):
            np.testing.assert_allclose(ref_blocks[out], ref_flat[out], rtol=1e-12, atol=1e-12)
    # only the plan's own marked points are observed (none here)
    assert [lin.point for lin in marked.program.lineages] == \
        [lin.point for lin in plain.program.lineages]


def test_the_pipeline_plan_is_cut_at_each_boundary_it_sends(interleaved) -> None:
    built, values = interleaved
    pair = api.check_pair(built, values)
    drawn = stages.numeric_values(pair.inputs, pair.known, pair.witness)
    cuts, witness = stages.plan_cuts(pair.reference, pair.program, pair.boundaries, drawn)
    assert [c.point for c in cuts] == ["layers.0.out", "layers.1.out", "layers.2.out"]
    assert [(t.source, t.dest) for c in cuts for t in c.transfers] == [(0, 1), (1, 2), (2, 3)]
    # gradients averaged over dp=2: each rank's loss is the mean over its half of the batch,
    # so its cotangent is twice its piece of the reference's
    assert all(c.scale == Fraction(2) for c in cuts)
    assert len(witness) == 6


def test_a_pipeline_plan_is_verified_in_stages(tmp_path: Path, capsys) -> None:
    verdict = api.check_file(PIPELINE, cache=False)
    assert verdict.verdict == VERIFIED, verdict.reason
    assert verdict.stages_total == verdict.stages_proven == 4
    # blocks 1 and 2 (on pp ranks 1 and 0) have one canonical form: proven once
    assert verdict.stages_unique == 3
    assert "in 4 stages cut at block boundaries (3 distinct" in verdict.reason
    assert [n.split(":")[0] for n in verdict.notes] == ["symmetry"]
    code = main(["check", "--no-cache", "--format", "json", str(PIPELINE)])
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    plan = document["plans"][0] if "plans" in document else document
    assert plan["stages_total"] == plan["stages_proven"] == 4


def test_a_cut_that_does_not_hold_proves_nothing(interleaved, monkeypatch) -> None:
    """With every cotangent ratio off by a factor of 3, the cut's obligations fail: that
    proof is not ``proven``, and the verdict is the uncut proof's, with a note."""
    built, values = interleaved
    pair = api.check_pair(built, values)
    real = stages.plan_cuts

    def wrong(*args):
        cuts, witness = real(*args)
        return [stages.Cut(c.point, c.boundary, c.transfers, c.layout, c.cotangent_layout,
                           c.scale * 3) for c in cuts], witness

    monkeypatch.setattr(stages, "plan_cuts", wrong)
    deadline = time.perf_counter() + 600
    cut = prove_module._prove_cut(pair, 2.0, lambda phase: None, deadline)
    assert cut is not None and cut.status != "proven"
    proof = prove_module.prove(pair, 2.0, deadline=deadline)
    assert proof.status == "proven" and proof.stages == 1
    assert "did not hold" in proof.uncut


def test_a_model_without_blocks_is_one_stage() -> None:
    verdict = api.check_file(ROOT / "plans" / "mlp_tiny_dp.tvp", cache=False)
    assert verdict.verdict == VERIFIED
    assert verdict.stages_total == verdict.stages_proven == 1


def test_a_plan_without_pipeline_stages_is_split_at_every_block() -> None:
    """llama_tiny_tp (dp x tp, no pipeline): for the checker each of its two blocks is a
    stage of its own on every rank, and so are the modules before them (the embedding) and
    after them (the head and the loss), the hidden state passed within the rank; the split
    program computes what the plan's does (test above), and the verdict says what was
    proven. The embedding's output is received before block 0's `.in` mark: its transfer
    carries that point, so the proof is cut there too."""
    built = api.build_programs(ROOT / "plans" / "llama_tiny_tp.tvp", shrink=True, blocks=True)
    assert built.segmented and len(built.program.stages) == 4
    assert [(t.source, t.dest, t.point) for t in built.program.transfers] == \
        [(0, 1, "layers.0.in"), (1, 2, "layers.0.out"), (2, 3, "layers.1.out")]
    plain = api.build_programs(ROOT / "plans" / "llama_tiny_tp.tvp", shrink=True, blocks=True,
                               segment=False)
    assert not plain.segmented and len(plain.program.stages) == 1
    verdict = api.check_file(ROOT / "plans" / "llama_tiny_tp.tvp", cache=False)
    assert verdict.verdict == VERIFIED, verdict.reason
    assert verdict.stages_total == verdict.stages_proven == 4
    assert verdict.stages_unique == 3  # the two blocks are one class (check/symmetry.py)
    assert any(a.startswith("stages: the program proven is the plan's with each stage split")
               for a in verdict.assumptions)


def test_plans_whose_stages_are_their_own_are_not_split() -> None:
    """Virtual stages (interleaved 1F1B) and explicit sends name the plan's stages: those
    plans keep them (and are cut only where they send between them)."""
    built = api.build_programs(PIPELINE, shrink=True, blocks=True)
    assert not built.segmented and len(built.program.stages) == 4


def test_a_difference_is_reported_on_the_plans_own_stages(monkeypatch) -> None:
    """A bug plan the numeric pre-check refutes on the split program is evaluated again
    unsplit, and its counterexample comes from that run (the plan's own stages)."""
    calls: list[tuple[bool, bool]] = []
    real = api.build_programs

    def spy(*args, **kwargs):
        built = real(*args, **kwargs)
        calls.append((kwargs.get("segment", True), built.segmented))
        return built

    monkeypatch.setattr(api, "build_programs", spy)
    from trainverify_dsl.spec import trace

    traced: list[object] = []
    trace_step = trace.trace_training_step
    monkeypatch.setattr(trace, "trace_training_step",
                        lambda *a, **k: traced.append(a) or trace_step(*a, **k))
    verdict = api.check_file(ROOT / "plans" / "bugs" / "missing_allreduce.tvp", cache=False)
    assert verdict.verdict == "counterexample"
    assert calls == [(True, True), (False, False)]
    assert verdict.counterexample is not None
    # the second build reuses the first's reference step (the same model, sizes, points)
    assert len(traced) == 1
