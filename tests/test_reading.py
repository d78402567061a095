"""The reading of a confirmed difference (ir/reading.py): how the first differing tensor
differs, with the spec's value beside the ranks' — on synthetic pairs (every reading, and
the structural findings that have none) and on shipped bug plans through `tvp check`."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from trainverify_dsl.ir.compare import Pair, Recipe, run_checks
from trainverify_dsl.ir.execute import ParallelOutcome
from trainverify_dsl.ir.layout import TLayout
from trainverify_dsl.ir.parallel import LossReduction, ParallelProgram
from trainverify_dsl.ir.reading import read
from trainverify_dsl.simulate.run import Float64

ROOT = Path(__file__).resolve().parents[1]


def _pair(mesh: tuple[tuple[str, int], ...], layout: TLayout,
          grads: dict[int, np.ndarray], want: np.ndarray) -> Pair:
    """A pair whose only compared value is ``grad(w)`` in ``layout`` on every rank."""
    program = ParallelProgram(
        "synthetic", mesh, None, 1, "gpipe", Fraction(1), (), (), (), None,
        LossReduction(tuple(a for a, _ in mesh)), (), (), (("w", layout),))
    got = ParallelOutcome(grads={r: {"w": g} for r, g in grads.items()})
    return run_checks(Pair(program, {"grad(w)": want}, {}, got, Recipe(False),
                           Float64(1e-12)))


def _first(pair: Pair):
    gradients = [m for m in pair.mismatches if m.check == "gradients"]
    assert gradients, pair.mismatches
    return gradients[0]


WANT = np.arange(1.0, 9.0).reshape(4, 2)


@pytest.mark.parametrize("factor, words", [
    (2.0, "2 times the spec's value: counted once per rank of its dp group (size 2): summed"),
    (0.5, "1/2 times the spec's value: divided by the size of its dp group (2) once too often"),
    (3.0, "3 times the spec's value"),
])
def test_a_constant_factor_is_read_and_named_after_the_group_it_matches(factor, words):
    pair = _pair((("dp", 2),), TLayout.replicated((4, 2)),
                 {0: factor * WANT, 1: factor * WANT}, WANT)
    reading = read(pair, _first(pair))
    assert reading is not None and words in reading.text
    assert "rank 0 (dp=0)" in reading.text
    if factor == 3.0:
        assert "group" not in reading.text  # 3 is no group's size on this mesh


def test_a_partial_sum_is_read_with_every_member_of_its_group():
    rng = np.random.default_rng(0)
    part = rng.normal(size=(4, 2))
    mesh = (("dp", 2), ("tp", 2))
    grads = {0: part, 1: WANT - part, 2: part, 3: WANT - part}
    pair = _pair(mesh, TLayout.replicated((4, 2)), grads, WANT)
    reading = read(pair, _first(pair))
    assert reading is not None
    assert "partial sum over tp" in reading.text and "reduce it over tp" in reading.text
    names = [who for who, _ in reading.ranks]
    assert names == ["rank 0 (dp=0, tp=0)", "rank 1 (dp=0, tp=1)"]
    # the shown values are the element's: they add up to the spec's value there
    assert sum(v for _, v in reading.ranks) == pytest.approx(reading.spec)
    assert reading.spec == WANT[reading.index]


def test_zeros_are_read_as_a_value_that_never_arrived():
    pair = _pair((("dp", 2),), TLayout.replicated((4, 2)),
                 {0: np.zeros((4, 2)), 1: WANT}, WANT)
    reading = read(pair, _first(pair))
    assert reading is not None and "holds zeros" in reading.text


def test_another_ranks_piece_is_read_as_such():
    layout = TLayout.split((4, 2), {0: ("dp",)})
    grads = {0: WANT[2:], 1: WANT[:2]}  # the two blocks swapped
    pair = _pair((("dp", 2),), layout, grads, WANT)
    reading = read(pair, _first(pair))
    assert reading is not None
    assert "holds the piece that belongs to rank 1 (dp=1)" in reading.text


def test_anything_else_is_read_as_a_plain_difference_at_its_largest_element():
    wrong = WANT.copy()
    wrong[3, 1] += 5.0
    wrong[0, 0] += 0.5
    pair = _pair((("dp", 2),), TLayout.replicated((4, 2)), {0: wrong, 1: WANT}, WANT)
    reading = read(pair, _first(pair))
    assert reading is not None and "differs from the spec's value" in reading.text
    assert reading.index == (3, 1) and reading.spec == 8.0
    assert reading.ranks == (("rank 0 (dp=0)", 13.0),)


def test_a_difference_from_a_zero_spec_value_is_read_in_absolute_terms():
    """A gradient that is zero everywhere in the spec (an expert no token reached) has no
    largest entry to be relative to: the reading said "largest difference 1.51e+297 of the
    spec's largest entry"; it says the spec is zero and the difference is absolute."""
    wrong = np.zeros((4, 2))
    wrong[1, 0] = 0.25
    zero = np.zeros((4, 2))
    pair = _pair((("dp", 2),), TLayout.replicated((4, 2)), {0: wrong, 1: zero}, zero)
    reading = read(pair, _first(pair))
    assert reading is not None, pair.mismatches
    assert "which is zero everywhere (largest difference 0.25, absolute)" in reading.text
    assert reading.index == (1, 0)


def test_a_factor_of_the_microbatch_count_is_named_as_the_count():
    """It read "divided by the size of its microbatch (2)"."""
    from dataclasses import replace

    program = _pair((("dp", 2),), TLayout.replicated((4, 2)), {0: WANT, 1: WANT}, WANT).program
    got = ParallelOutcome(grads={0: {"w": WANT / 4}, 1: {"w": WANT}})
    pair = run_checks(Pair(replace(program, microbatches=4), {"grad(w)": WANT}, {}, got,
                           Recipe(False), Float64(1e-12)))
    reading = read(pair, _first(pair))
    assert reading is not None
    assert "divided by the number of microbatches (4) once too often" in reading.text


def test_a_structural_finding_has_no_reading():
    program = ParallelProgram(
        "synthetic", (("dp", 2),), None, 1, "gpipe", Fraction(1), (), (), (), None,
        LossReduction(("dp",)), (), (), (("w", TLayout.replicated((4, 2))),))
    pair = run_checks(Pair(program, {"grad(w)": WANT}, {}, ParallelOutcome(), Recipe(False),
                           Float64(1e-12)))
    coverage = [m for m in pair.mismatches if m.check == "gradient coverage"]
    assert coverage and read(pair, coverage[0]) is None


def _check_json(plan: str) -> dict:
    run = subprocess.run([sys.executable, "-m", "trainverify_dsl", "check", "--format", "json",
                          plan], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr
    return json.loads(run.stdout)["counterexample"]


def test_check_reads_a_partial_norm_gradient_of_sequence_parallelism():
    found = _check_json("plans/bugs/sp_norm_grad_not_reduced.tvp")
    assert found["tensor"] == "grad(layers.0.ffn_norm.weight)"
    assert "partial sum over tp" in found["reading"]
    ranks = found["rank_values"]
    assert len(ranks) == 2
    assert sum(r["value"] for r in ranks) == pytest.approx(found["spec_value"], rel=1e-9)


def test_check_reads_a_sum_where_an_average_was_meant():
    found = _check_json("plans/bugs/sum_instead_of_avg.tvp")
    assert "2 times the spec's value: counted once per rank of its dp group" \
        in found["reading"]
    (rank,) = found["rank_values"]
    assert rank["value"] == pytest.approx(2 * found["spec_value"], rel=1e-9)


def test_small_values_keep_integers_buffers_and_signs():
    from trainverify_dsl.simulate.run import SMALL, SMALL_POSITIVE, small_values

    rng = np.random.default_rng(0)
    values = {"w": rng.normal(size=(3, 4)), "v(w)": rng.uniform(0.1, 1, size=(3, 4)),
              "tokens": np.arange(6).reshape(2, 3), "rope.cos": rng.normal(size=(5,)),
              "scale": np.full((2,), 3.0)}
    small = small_values(values, {"rope.cos"}, np.random.default_rng(1))
    assert set(np.unique(small["w"])) <= set(SMALL)
    assert set(np.unique(small["v(w)"])) <= set(SMALL_POSITIVE)
    assert set(np.unique(small["scale"])) <= set(SMALL_POSITIVE)  # positive everywhere
    assert small["tokens"] is values["tokens"] and small["rope.cos"] is values["rope.cos"]


def test_a_counterexample_is_shown_at_small_inputs_when_they_still_show_it():
    found = _check_json("plans/bugs/loss_not_scaled.tvp")
    assert found["inputs"] == "inputs drawn from ±1/2, ±1"
    assert "counted once per rank of its dp group (size 2) or once per microbatch (size 2)" \
        in found["reading"]
