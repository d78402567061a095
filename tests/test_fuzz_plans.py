"""Mutated shipped plans through lint, fmt and lint --spec: diagnostics, never an internal
error (issue 13 item 7). The mutator is ``bench/fuzz_plans.py`` (one to three edits of the kinds
real edits make); hypothesis draws the plan, the seed and shrinks a failure to its smallest
seed. The long run (100k inputs) is ``python bench/fuzz_plans.py``; its last result is in
``bench/results/fuzz.md``."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fuzz_plans import (  # noqa: E402
    Failure,
    check_fmt,
    check_lint,
    check_spec,
    corpus,
    mutate,
)

PLANS = corpus()
SMALL = [p for p in PLANS if p[0] in ("plans/mlp_tiny_dp.tvp", "plans/llama_tiny_tp.tvp")]
QUICK = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fuzz.tvp"
    path.write_text(text, encoding="utf-8")
    return path


@QUICK
@given(plan=st.sampled_from(PLANS), seed=st.integers(0, 2**32 - 1))
def test_lint_and_fmt_answer_every_mutated_plan(tmp_path_factory: pytest.TempPathFactory,
                                                plan: tuple[str, str], seed: int) -> None:
    mutated = mutate(plan[1], random.Random(seed))
    check_lint(_write(tmp_path_factory.mktemp("fuzz"), mutated))
    check_fmt(mutated)


@SLOW
@given(plan=st.sampled_from(SMALL), seed=st.integers(0, 2**32 - 1))
def test_lint_spec_answers_every_mutated_small_plan(tmp_path_factory: pytest.TempPathFactory,
                                                    plan: tuple[str, str], seed: int) -> None:
    check_spec(_write(tmp_path_factory.mktemp("fuzz"), mutate(plan[1], random.Random(seed))))


def test_the_corpus_is_every_shipped_plan() -> None:
    names = {name for name, _ in PLANS}
    assert "plans/llama3_405b.tvp" in names and "stdlib/megatron.tvp" in names
    assert len([n for n in names if n.startswith("plans/bugs/")]) >= 14
    assert len(SMALL) == 2


def test_the_mutations_reach_both_clean_and_broken_plans() -> None:
    rng = random.Random(0)
    text = dict(PLANS)["plans/mlp_tiny_dp.tvp"]
    outcomes = {check_fmt(mutate(text, rng)) for _ in range(200)}
    assert outcomes == {True, False}


def test_the_properties_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative controls: a linter that raises and a formatter that drops a statement are
    reported as failures."""
    import trainverify_dsl.parse as parse
    import trainverify_dsl.plan as plan

    def crash(path: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(plan, "lint_file", crash)
    with pytest.raises(Failure, match="lint raised KeyError"):
        check_lint(_write(tmp_path, "plan t\n"))
    monkeypatch.undo()

    real = parse.format_source

    def lossy(text: str, file: str = "<string>"):  # noqa: ANN202 - test double
        result = real(text, file)
        if result.text is None:
            return result
        return type(result)(result.text.split("\n", 1)[-1], result.diagnostics)

    monkeypatch.setattr(parse, "format_source", lossy)
    with pytest.raises(Failure, match="fmt"):
        check_fmt(dict(PLANS)["plans/mlp_tiny_dp.tvp"])
