"""The proof cache (check/cache.py) and `tvp check --jobs`: a proven pair is read back
instead of proven again, only proofs are stored, anything that changes the pair or the
checker is a miss, and checking plans in parallel gives the verdicts of checking them one
by one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainverify_dsl import api
from trainverify_dsl.check import cache
from trainverify_dsl.check import prove as prove_module

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "plans" / "mlp_tiny_dp.tvp"


class Counting:
    """``check.prove.prove`` that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.real = prove_module.prove

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> Counting:
    spy = Counting()
    monkeypatch.setattr(prove_module, "prove", spy)
    return spy


def test_a_proven_plan_is_read_back_not_proven_again(tmp_path: Path, counting: Counting):
    first = api.check_file(PLAN, cache_dir=tmp_path)
    assert first.verdict == "verified" and not first.cached and counting.calls == 1
    assert len(list(tmp_path.glob("*.json"))) == 1
    second = api.check_file(PLAN, cache_dir=tmp_path)
    assert second.verdict == "verified" and second.cached and counting.calls == 1
    assert (second.elements, second.by_normal_form, second.by_expansion, second.by_solver) == \
        (first.elements, first.by_normal_form, first.by_expansion, first.by_solver)
    assert second.assumptions == first.assumptions
    assert "from the proof cache" in second.reason


def test_no_cache_neither_reads_nor_writes(tmp_path: Path, counting: Counting):
    api.check_file(PLAN, cache_dir=tmp_path)
    again = api.check_file(PLAN, cache_dir=tmp_path, cache=False)
    assert not again.cached and counting.calls == 2
    empty = tmp_path / "other"
    api.check_file(PLAN, cache_dir=empty, cache=False)
    assert not empty.exists()


def test_a_changed_plan_is_a_miss(tmp_path: Path, counting: Counting):
    api.check_file(PLAN, cache_dir=tmp_path)
    text = PLAN.read_text().replace("microbatches 2", "microbatches 1")
    assert text != PLAN.read_text()
    changed = api.check(text, base_dir=ROOT / "plans", cache_dir=tmp_path)
    assert changed.verdict == "verified" and not changed.cached and counting.calls == 2
    assert len(list(tmp_path.glob("*.json"))) == 2
    # four microbatches are proven with two (docs/checking.md, "Fewer microbatches"): the
    # same proof as the plan's own two, met again
    four = api.check(PLAN.read_text().replace("microbatches 2", "microbatches 4"),
                     base_dir=ROOT / "plans", cache_dir=tmp_path)
    assert four.verdict == "verified" and four.cached and counting.calls == 2
    assert any("proven with 2 of the plan's 4 microbatches" in a for a in four.assumptions)


@pytest.mark.parametrize("plan", [PLAN, ROOT / "plans" / "mlp_dp_tp.tvp"],
                         ids=["plain", "templates"])
def test_a_plan_text_met_again_is_a_hit(tmp_path: Path, counting: Counting, plan: Path):
    """A search gives plans as text: each ``api.check`` writes a new temporary file, so the
    key must not depend on the file's name or on where statements stand (nor on the
    template-expansion notes, which name the file of the `apply`)."""
    text = plan.read_text()
    first = api.check(text, base_dir=ROOT / "plans", cache_dir=tmp_path)
    again = api.check(text, base_dir=ROOT / "plans", cache_dir=tmp_path)
    assert first.verdict == again.verdict == "verified" and counting.calls == 1
    assert again.cached
    # comments and blank lines move every statement: still the same proof
    moved = "# a comment a search tool added\n\n" + text.replace("\n\n", "\n\n\n")
    shifted = api.check(moved, base_dir=ROOT / "plans", cache_dir=tmp_path)
    assert shifted.cached and counting.calls == 1
    # and the file checked by its path meets the same proof
    assert api.check_file(plan, cache_dir=tmp_path).cached and counting.calls == 1
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_another_checker_is_a_miss(tmp_path: Path, counting: Counting,
                                   monkeypatch: pytest.MonkeyPatch):
    api.check_file(PLAN, cache_dir=tmp_path)
    monkeypatch.setattr(cache, "fingerprint", lambda: "a checker of another version")
    again = api.check_file(PLAN, cache_dir=tmp_path)
    assert not again.cached and counting.calls == 2


def test_only_proofs_are_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(prove_module, "prove", lambda *a, **k: prove_module.Proof(
        "open", "an obligation left open", elements=3))
    verdict = api.check_file(PLAN, cache_dir=tmp_path)
    assert verdict.verdict == "inconclusive"
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("content", ["not json", '{"status": "open"}',
                                     '{"status": "proven", "elements": -1}'])
def test_an_unreadable_entry_is_a_miss_and_is_replaced(tmp_path: Path, counting: Counting,
                                                       content: str):
    api.check_file(PLAN, cache_dir=tmp_path)
    (entry,) = tmp_path.glob("*.json")
    entry.write_text(content)
    again = api.check_file(PLAN, cache_dir=tmp_path)
    assert again.verdict == "verified" and not again.cached and counting.calls == 2
    assert json.loads(entry.read_text())["status"] == "proven"


def test_an_unwritable_cache_is_no_error(tmp_path: Path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder should be")
    verdict = api.check_file(PLAN, cache_dir=blocked)
    assert verdict.verdict == "verified" and not verdict.cached


def _check(*args: str, cache_dir: Path) -> dict:
    run = subprocess.run([sys.executable, "-m", "trainverify_dsl", "check", "--format", "json",
                          "--cache-dir", str(cache_dir), *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 1, run.stderr  # the bug plan decides the exit code
    return json.loads(run.stdout)


def test_jobs_give_the_verdicts_of_one_by_one(tmp_path: Path):
    plans = ["plans/mlp_tiny_dp.tvp", "plans/bugs/sum_instead_of_avg.tvp",
             "plans/mlp_dp_tp.tvp"]
    serial = _check(*plans, cache_dir=tmp_path / "serial")
    parallel = _check("--jobs", "2", *plans, cache_dir=tmp_path / "parallel")

    def strip(document: dict) -> dict:
        document = {k: v for k, v in document.items() if k != "seconds"}
        document["plans"] = [{k: v for k, v in p.items() if k != "seconds"}
                             for p in document["plans"]]
        return document

    assert [p["plan"] for p in parallel["plans"]] == plans
    assert [p["verdict"] for p in parallel["plans"]] == \
        ["verified", "counterexample", "verified"]
    assert strip(parallel) == strip(serial)
    assert len(list((tmp_path / "parallel").glob("*.json"))) == 2  # the two proofs


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_cli_rejects_a_bad_job_count(value: str):
    run = subprocess.run([sys.executable, "-m", "trainverify_dsl", "check", "--jobs", value,
                          str(PLAN)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "jobs" in run.stderr
