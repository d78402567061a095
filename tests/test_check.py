"""``tvp check``: verdicts on shipped plans, bug plans and plans that must stay undecided.

- Correct MLP plans (data parallel with accumulation, tensor parallel, ZeRO-1) are
  ``verified``, every compared element accounted for by one of the three deciders.
- Bug plans get a counterexample (or their layout error) at their ``# BUG`` line.
- An op without an exact encoding (top-k routing) and an obligation the deciders cannot
  settle are ``inconclusive``, never ``verified``.
- The CLI's exit codes and its one JSON document.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainverify_dsl.api import check_file
from trainverify_dsl.check import prove as prove_module
from trainverify_dsl.check.verdict import COUNTEREXAMPLE, ERROR, INCONCLUSIVE, VERIFIED
from trainverify_dsl.cli.main import main

ROOT = Path(__file__).resolve().parents[1]

VERIFIED_PLANS = ["mlp_tiny_dp", "mlp_dp_tp", "mlp_tp_gather_output", "mlp_tiny_zero",
                  "mlp_tiny_overlap", "llama_tiny_tp",
                  pytest.param("llama_tiny_sp", marks=pytest.mark.slow),
                  pytest.param("llama_tiny_cp", marks=pytest.mark.slow),
                  pytest.param("llama_tiny_cp_zigzag", marks=pytest.mark.slow),
                  pytest.param("llama_tiny_interleaved", marks=pytest.mark.slow),
                  pytest.param("llama_tiny_clip", marks=pytest.mark.slow),
                  pytest.param("llama_tiny_smoothing", marks=pytest.mark.slow),
                  pytest.param("llama_tiny_masked", marks=pytest.mark.slow),
                  pytest.param("llama_tiny_tied", marks=pytest.mark.slow),
                  # parameter groups on both sides (docs/semantics.md §6.5)
                  pytest.param("llama_tiny_nowd", marks=pytest.mark.slow),
                  # LayerNorm and GELU: proven since both programs decompose alike
                  # (spec/trace.py ``decompositions``)
                  pytest.param("gpt2_tiny_tp", marks=pytest.mark.slow),
                  # sequence parallelism with biased row-parallel layers (scatter-dim)
                  pytest.param("gpt2_tiny_sp", marks=pytest.mark.slow),
                  pytest.param("deepseek_tiny_pp", marks=pytest.mark.slow),
                  pytest.param("deepseek_tiny_ep", marks=pytest.mark.slow),
                  # RoPE's backward needs the sums one side holds multiplied out
                  # (check/expand.py one_sided_equal)
                  pytest.param("deepseek_tiny_tp", marks=pytest.mark.slow)]
MLP_BUGS = ["loss_not_scaled", "loss_scaled_twice", "sum_instead_of_avg",
            "zero_reduce_scatter_order", "grad_sync_before_last_microbatch",
            "optimizer_lr_on_one_rank"]


def bug_line(path: Path) -> int:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if "# BUG" in line:
            return number
    match = re.match(r"^# bug: .+ \((?:missing after )?line (\d+)\)\.$",
                     path.read_text().splitlines()[0])
    assert match, path
    return int(match.group(1))


@pytest.mark.parametrize("name", VERIFIED_PLANS)
def test_correct_plan_is_verified(name: str) -> None:
    verdict = check_file(ROOT / "plans" / f"{name}.tvp")
    assert verdict.verdict == VERIFIED, verdict.reason
    assert verdict.exit_code == 0
    assert verdict.elements > 0
    decided = verdict.by_normal_form + verdict.by_expansion + verdict.by_solver
    assert decided == verdict.elements
    assert verdict.stages_proven == verdict.stages_total >= 1
    assert any("real arithmetic" in a for a in verdict.assumptions)
    assert not verdict.diagnostics
    if name.startswith("deepseek"):
        # DeepSeek's router: top-k of computed scores takes the order the scores have at
        # the numeric pre-check's values, and the verdict lists that assumption
        assert any("orderings of computed values" in a and "drawn" in a
                   for a in verdict.assumptions), verdict.assumptions


ALL_BUGS = sorted(p.stem for p in (ROOT / "plans" / "bugs").glob("*.tvp"))
#: a missing statement is reported at the statement it leaves wrong (as in
#: tests/test_simulate_plans.py): the sequence split whose positions are not offset
REPORTED_AT = {"rope_not_offset": 18, "local_token_counts": 21}


@pytest.mark.parametrize("name", MLP_BUGS + [
    pytest.param(n, marks=pytest.mark.slow) for n in ALL_BUGS if n not in MLP_BUGS])
def test_bug_plan_is_a_counterexample_at_its_line(name: str) -> None:
    path = ROOT / "plans" / "bugs" / f"{name}.tvp"
    verdict = check_file(path)
    assert verdict.verdict in (COUNTEREXAMPLE, ERROR), verdict.reason
    assert verdict.exit_code == 1
    lines = {d.span.line for d in verdict.diagnostics if d.span is not None}
    if verdict.counterexample is not None:
        assert verdict.counterexample.rel_error > 1e-6
        if verdict.counterexample.span is not None:
            lines.add(verdict.counterexample.span.line)
    assert REPORTED_AT.get(name, bug_line(path)) in lines, (lines, verdict.reason)


def test_a_wrong_scale_without_layout_error_is_a_confirmed_counterexample(
        tmp_path: Path) -> None:
    """The gradient average written as a sum: the layout pass cannot see a scale, the
    numbers can; the counterexample stands at the gradient statement."""
    text = (ROOT / "plans" / "mlp_tiny_dp.tvp").read_text()
    wrong = text.replace("all-reduce grad(params) over dp op=avg",
                         "all-reduce grad(params) over dp op=sum")
    assert wrong != text
    plan = tmp_path / "wrong.tvp"
    plan.write_text(wrong.replace('"stdlib/', f'"{ROOT}/stdlib/'))
    verdict = check_file(plan, allow_model_outside_root=True)
    assert verdict.verdict == COUNTEREXAMPLE, verdict.reason
    line = next(n for n, s in enumerate(wrong.splitlines(), 1) if "op=sum" in s)
    assert verdict.counterexample is not None
    assert verdict.counterexample.span.line == line


@pytest.mark.slow
def test_an_op_without_an_encoding_is_inconclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainverify_dsl.check import symbolic

    encodings = dict(symbolic.ENCODINGS)
    del encodings["relu"]
    monkeypatch.setattr(symbolic, "ENCODINGS", encodings)
    verdict = check_file(ROOT / "plans" / "mlp_tiny_dp.tvp")
    assert verdict.verdict == INCONCLUSIVE and verdict.exit_code == 3
    assert "`relu` has no exact encoding" in verdict.reason


def test_an_obligation_no_decider_settles_is_inconclusive(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """With the normal form unable to decide anything (every element an obligation) and
    neither multiplying out nor the solver allowed to help, a correct plan is inconclusive:
    unknown is not success."""
    from trainverify_dsl.check.solver import Outcome

    monkeypatch.setattr(prove_module.Exact, "equal", _everything_open)
    monkeypatch.setattr(prove_module, "_decide",
                        lambda ob, expander, timeout: Outcome("unknown", "z3: timeout"))
    verdict = check_file(ROOT / "plans" / "mlp_tiny_dp.tvp")
    assert verdict.verdict == INCONCLUSIVE
    assert "timeout" in verdict.reason
    assert verdict.open


def _everything_open(self: prove_module.Exact, got: object, want: object, where: object
                     ) -> tuple[bool, float]:
    import numpy as np

    if where.check == "lineages":
        return True, 0.0
    g = prove_module._objects(got)
    w = prove_module._objects(want)
    for index in np.ndindex(*g.shape):
        self.obligations.append(prove_module.Obligation(where, index, g[index], w[index]))
    self.elements += g.size
    return True, 0.0


def test_cli_json_document_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["check", "--format", "json", str(ROOT / "plans" / "mlp_tiny_dp.tvp")])
    document = json.loads(capsys.readouterr().out)
    assert status == 0
    for key in ("verdict", "stages_total", "stages_unique", "stages_proven", "seconds",
                "assumptions", "diagnostics", "counterexample", "plans"):
        assert key in document
    assert document["verdict"] == "verified"
    assert document["plans"][0]["elements"] > 0

    status = main(["check", "--format", "json",
                   str(ROOT / "plans" / "bugs" / "loss_not_scaled.tvp")])
    document = json.loads(capsys.readouterr().out)
    assert status == 1
    assert document["verdict"] in ("counterexample", "error")
    assert document["diagnostics"] or document["counterexample"]


def test_cli_missing_plan_is_an_error_not_a_traceback(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    status = main(["check", str(tmp_path / "nope.tvp")])
    captured = capsys.readouterr()
    assert status in (1, 2)
    assert "Traceback" not in captured.out + captured.err
    assert "ERROR" in captured.out


def test_a_plan_on_stdin_is_checked_and_named_stdin(tmp_path: Path) -> None:
    """`tvp check -` (a generator piping its plans): the plan's `spec` and `use` paths
    resolve from the current folder (here the stdlib's, from the installed package), its
    verdict and its lines are `<stdin>`'s, and the temporary file it was read into is gone."""
    import subprocess
    import sys

    text = (ROOT / "plans" / "mlp_tiny_dp.tvp").read_text(encoding="utf-8")
    wrong = text.replace("op=avg", "op=sum")
    assert wrong != text

    def run(stdin: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "trainverify_dsl", "check", *extra],
                              input=stdin, cwd=tmp_path, capture_output=True, text=True,
                              timeout=600)

    good = run(text, "-")
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.startswith("<stdin>: VERIFIED")
    bad = run(wrong, "-", "--format", "json")
    document = json.loads(bad.stdout)
    assert bad.returncode == 1 and document["verdict"] == COUNTEREXAMPLE
    assert document["plans"][0]["plan"] == "<stdin>"
    assert document["counterexample"]["file"] == "<stdin>"
    assert list(tmp_path.iterdir()) == []  # the temporary plan file is removed
    twice = run(text, "-", "-")
    assert twice.returncode == 2 and "once" in twice.stderr


def test_a_step_too_large_for_one_stage_is_inconclusive(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    from trainverify_dsl.check import terms

    monkeypatch.setattr(terms, "MAX_TERMS", 50)
    verdict = check_file(ROOT / "plans" / "mlp_tiny_dp.tvp")
    assert verdict.verdict == INCONCLUSIVE
    assert "distinct terms" in verdict.reason


def test_a_spent_time_limit_is_inconclusive_not_verified() -> None:
    """The plan is provable (the quick-start plan), but its time limit is spent before the
    proof: the verdict is inconclusive with the reason, never verified."""
    verdict = check_file(ROOT / "plans" / "mlp_tiny_dp.tvp", time_limit=0.0)
    assert verdict.verdict == INCONCLUSIVE
    assert verdict.exit_code == 3
    assert "time limit" in verdict.reason


def test_a_step_over_the_memory_budget_is_inconclusive_not_an_error() -> None:
    """A correct plan whose evaluation would exceed the memory budget is not checked: the
    verdict is inconclusive (exit 3) with TVP501 at the mesh line, never "the plan has
    errors" (exit 1), which would fail a CI job on a plan nobody showed wrong."""
    verdict = check_file(ROOT / "plans" / "mlp_tiny_dp.tvp", max_memory=1024)
    assert verdict.verdict == INCONCLUSIVE
    assert verdict.exit_code == 3
    assert verdict.reason.startswith("not checked: ") and "--max-memory" in verdict.reason
    assert [d.code.id for d in verdict.diagnostics] == ["TVP501"]
    assert verdict.diagnostics[0].span.line == 11  # `mesh dp=2`
    assert verdict.diagnostics[0].severity == "warning"  # not checked, not wrong


def test_the_time_limit_stops_deciding_obligations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Obligations left when the limit passes are open (inconclusive), not skipped as proven:
    the first obligation is decided, then the clock is past the deadline."""
    from trainverify_dsl.check.solver import Outcome

    calls = []

    def decide(ob: object, expander: object, timeout: float) -> Outcome:
        calls.append(timeout)
        return Outcome("expanded")

    monkeypatch.setattr(prove_module, "_decide", decide)
    monkeypatch.setattr(prove_module.Obligation, "describe", lambda self: "x")
    obligations = [prove_module.Obligation(None, (), object(), object()) for _ in range(2)]
    # the clock: the start, the first obligation before the deadline (1.0), then past it
    clock = iter([0.0, 0.0, 5.0, 5.0])
    monkeypatch.setattr(prove_module.time, "perf_counter", lambda: next(clock))
    proof = prove_module.Proof("proven")
    prove_module._solve(obligations, proof, 20.0, lambda phase: None, deadline=1.0)
    assert calls == [1.0]  # the solver's timeout is cut to what is left of the limit
    assert proof.status == "open" and proof.open == [("x", "the time limit was reached")]
    assert proof.by_expansion == 1 and proof.not_attempted == 1


@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_cli_rejects_a_bad_time_limit(value: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["check", "--time-limit", value, str(ROOT / "plans" / "mlp_tiny_dp.tvp")])
    assert info.value.code == 2


def test_the_api_checks_a_plan_given_as_text() -> None:
    """An auto-parallel search hands plans over as text: the verdict is the file's, and a
    counterexample names the text and the line in it (here the bug plan's `# BUG` line)."""
    from trainverify_dsl.api import TEXT_PLAN, check

    good = (ROOT / "plans" / "mlp_tiny_dp.tvp").read_text(encoding="utf-8")
    verdict = check(good)
    assert verdict.verdict == VERIFIED and verdict.plan == TEXT_PLAN

    bug = ROOT / "plans" / "bugs" / "sum_instead_of_avg.tvp"
    text = bug.read_text(encoding="utf-8")
    verdict = check(text)
    assert verdict.verdict in (COUNTEREXAMPLE, ERROR) and verdict.plan == TEXT_PLAN
    spans = [d.span for d in verdict.diagnostics]
    if verdict.counterexample is not None:
        spans.append(verdict.counterexample.span)
    assert spans and all(s.file == TEXT_PLAN for s in spans if s is not None)
    assert bug_line(bug) in {s.line for s in spans if s is not None}
    assert check(bug).verdict == verdict.verdict  # the path gives the same verdict


@pytest.mark.slow
@pytest.mark.parametrize("name", ["missing_allreduce", "sp_norm_grad_not_reduced",
                                  "avg_instead_of_sum", "tied_embedding_grads_not_summed",
                                  "send_wrong_stage"])
def test_the_proof_alone_never_proves_a_bug_plan(name: str) -> None:
    """The numeric pre-check normally refutes these first; here the symbolic proof runs on
    the wrong programs by itself and must not call them equal (a normal form that merged
    different values would say "proven"). The programs are built as ``tvp check`` builds
    them (blocks marked), so the pipeline plans among them go through the stage cuts."""
    import time

    from trainverify_dsl import api
    from trainverify_dsl.check.prove import prove

    built = api.build_programs(ROOT / "plans" / "bugs" / f"{name}.tvp", shrink=True,
                               stop_on_errors=False, blocks=True)
    model = built.setup.build_real()
    values = api.step_values(built.program, built.spec, model, 0)
    proof = prove(api.check_pair(built, values), 2.0, deadline=time.perf_counter() + 300)
    assert proof.status != "proven", proof.reason


def test_axis_names_mean_nothing_to_the_checker(tmp_path: Path) -> None:
    """The data- and tensor-parallel MLP plan with its axes called `rows` and `mp` (and
    outermost first the other way round) is verified like the shipped one; the same plan
    with the gradient average over the wrong one of them is a counterexample."""
    text = (ROOT / "plans" / "mlp_dp_tp.tvp").read_text(encoding="utf-8")
    text = re.sub(r"\bdp\b", "rows", re.sub(r"\btp\b", "mp", text))
    text = text.replace("mesh rows=2, mp=2", "mesh mp=2, rows=2")
    good = tmp_path / "renamed.tvp"
    good.write_text(text, encoding="utf-8")
    assert check_file(good).verdict == VERIFIED
    bad = tmp_path / "wrong_axis.tvp"
    bad.write_text(text.replace("grad(params) over rows", "grad(params) over mp"),
                   encoding="utf-8")
    assert check_file(bad).verdict in (COUNTEREXAMPLE, ERROR)


def test_colour_on_request_and_plain_text_otherwise(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`--color always` colours the verdict word; stripped of its escapes it is the plain
    output; `auto` through a pipe, and NO_COLOR, give plain text."""
    plan = str(ROOT / "plans" / "mlp_tiny_dp.tvp")
    assert main(["check", "--no-cache", "--color", "always", plan]) == 0
    coloured = capsys.readouterr().out
    assert "\x1b[1;32mVERIFIED\x1b[0m" in coloured
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(["check", "--no-cache", plan]) == 0
    plain = capsys.readouterr().out
    assert "\x1b[" not in plain
    strip = re.sub(r"\x1b\[[0-9;]*m", "", coloured)
    # the seconds differ from run to run
    assert re.sub(r"\(\d+\.\d s\)", "", strip) == re.sub(r"\(\d+\.\d s\)", "", plain)


def test_a_plan_without_a_spec_is_a_located_error(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`tvp lint` accepts a plan without a `spec` line; checking it is TVP504 at the file's
    first line, exit 1, never an unlocated usage message."""
    plan = tmp_path / "nospec.tvp"
    plan.write_text("plan x\nmesh dp=2\nsplit x [dp, -]\noptimizer sgd lr=0.1\n")
    verdict = check_file(plan)
    assert verdict.verdict == ERROR
    (diagnostic,) = verdict.diagnostics
    assert diagnostic.code.id == "TVP504" and diagnostic.span.line == 1
    assert main(["check", str(plan)]) == 1
    assert main(["simulate", str(plan)]) == 1
    assert f"{plan}:1:1: error" in capsys.readouterr().out


def test_a_plan_the_shrunk_lowering_cannot_compute_is_its_full_size_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A row-parallel weight also split over dp: the full-size layout pass reports TVP408 at
    the `apply`; the shrunk lowering then failed an internal shape check whose finding had no
    code, and every output format of `tvp check` crashed on it (found by the fuzz of tvp
    check). Now the verdict carries the full-size errors, in every format."""
    from test_plan_support import row_parallel_weight_over_dp

    plan = row_parallel_weight_over_dp(tmp_path)
    verdict = check_file(plan)
    assert verdict.verdict == ERROR
    assert [d.code.id for d in verdict.diagnostics] == ["TVP408"]
    for fmt in ("text", "json", "sarif", "github"):
        assert main(["check", "--format", fmt, str(plan)]) == 1
    assert "Traceback" not in capsys.readouterr().out


def test_the_api_passes_on_no_deprecation_notice_of_torch() -> None:
    """A search loop calling the API sees only verdicts: torch's own FutureWarnings while
    exporting are not passed on (the CLI filters them; the API must not depend on that)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        verdict = check_file(ROOT / "plans" / "mlp_tiny_dp.tvp")
    assert verdict.verdict == VERIFIED
    assert not [w for w in caught if issubclass(w.category, FutureWarning)]


def test_a_plan_the_check_could_not_handle_is_a_failure_in_sarif_and_github(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An `error` verdict without diagnostics (an internal error, exit 2) printed no SARIF
    result and an execution marked successful, and no GitHub annotation: code scanning read
    the plan as clean. Now it is a tool execution failure and an error annotation."""
    import trainverify_dsl.api as api

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "check_file", broken)
    plan = str(ROOT / "plans" / "mlp_tiny_dp.tvp")
    assert main(["check", "--no-cache", "--format", "sarif", plan]) == 2
    run = json.loads(capsys.readouterr().out)["runs"][0]
    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is False
    assert "RuntimeError: boom" in invocation["toolExecutionNotifications"][0]["message"]["text"]
    assert main(["check", "--no-cache", "--format", "github", plan]) == 2
    assert "::error" in capsys.readouterr().out


def test_a_plan_text_with_a_lone_surrogate_is_an_encoding_error_not_an_exception() -> None:
    """`api.check(text)` never raises for a bad plan: a lone surrogate in the text (a str
    Python allows, UTF-8 does not) was a UnicodeEncodeError; it is TVP109 at its place."""
    from trainverify_dsl.api import TEXT_PLAN, check

    verdict = check("plan x\nmesh dp=2 \ud800\n")
    assert verdict.verdict == ERROR and verdict.exit_code == 1
    found = [(d.code.id, d.span.file, d.span.line) for d in verdict.diagnostics]
    assert ("TVP109", TEXT_PLAN, 2) in found


def test_the_api_refuses_invalid_options_before_any_work(tmp_path: Path) -> None:
    """A `base_dir` that does not exist was a FileNotFoundError naming a temporary file, a
    negative seed a ValueError from numpy deep inside; an empty string "a directory"."""
    from trainverify_dsl.api import TEXT_PLAN, check

    with pytest.raises(ValueError, match="is not a directory"):
        check("plan x\nmesh dp=2\n", base_dir=tmp_path / "missing")
    for seed in (-1, 1.5, True, 2**40):
        with pytest.raises(ValueError, match="seed must be a whole number"):
            check("plan x\nmesh dp=2\n", seed=seed)
    # the command line's ranges: --timeout positive, --time-limit at least 0
    for timeout in (0, -1, float("nan"), "5"):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            check("plan x\nmesh dp=2\n", timeout=timeout)
    with pytest.raises(ValueError, match="time_limit must be a non-negative number"):
        check("plan x\nmesh dp=2\n", time_limit=-5)
    empty = check("")
    assert empty.verdict == ERROR and empty.plan == TEXT_PLAN


@pytest.mark.parametrize("lean_status, widened", [
    ("open", True), ("proven", False), ("failed", False), ("unsupported", False),
    ("refuted", False)])
def test_a_lean_proof_left_open_is_proven_again_wide(monkeypatch, lean_status: str,
                                                     widened: bool) -> None:
    """The first proof distributes only two-term sums (``terms.DISTRIBUTE_LEAN``). Only an
    open one (nothing refuted) is proven again, with the wide normal form, and says so; a
    proven, failed, unsupported or refuted one is the answer."""
    from trainverify_dsl.check import terms as t

    widths: list[int] = []

    def fake(pair, timeout_s, progress, deadline, symmetric=True, lean=False):
        widths.append(t.DISTRIBUTE)
        assert lean == (len(widths) == 1)
        if len(widths) == 1:
            proof = prove_module.Proof("open" if lean_status == "refuted" else lean_status,
                                       "1 of 3 obligations ... are not proven")
            if lean_status == "refuted":
                proof.refuted = [("an obligation", "a model")]
            return proof
        return prove_module.Proof("proven")

    monkeypatch.setattr(prove_module, "_prove", fake)
    proof = prove_module.prove(object())  # type: ignore[arg-type]
    assert widths == ([t.DISTRIBUTE_LEAN, t.DISTRIBUTE_WIDE] if widened
                      else [t.DISTRIBUTE_LEAN])
    assert bool(proof.widened) == widened
    if widened:
        assert proof.status == "proven" and "1 of 3 obligations" in proof.widened
    assert t.DISTRIBUTE == t.DISTRIBUTE_WIDE  # restored for whatever runs next


@pytest.mark.parametrize("name", ["llama_tiny_tp",
                                  # session 28: it needed the wide width until the stepwise
                                  # expansion (check/expand.py stepwise_zero)
                                  pytest.param("deepseek_tiny_tp", marks=pytest.mark.slow)])
def test_the_lean_normal_form_decides_a_shipped_plan_alone(name: str) -> None:
    verdict = check_file(ROOT / "plans" / f"{name}.tvp", cache=False)
    assert verdict.verdict == VERIFIED, verdict.reason
    assert not any("proven again with sums" in n for n in verdict.notes), verdict.notes
