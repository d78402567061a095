"""The distributed oracle (``trainverify_dsl.oracle``): every small plan run as a real
multi-process ``torch.distributed`` (gloo) training step agrees with the single-device torch
step (torch.autograd + torch.optim, float64, not the project's IR), and every bug plan with at
most 8 ranks differs from it (or, for three of them, cannot be lowered at all).

The tolerance is written here as a literal, not imported: the tests fail if the implementation
loosens its own. A plan whose loss scale is perturbed by a relative 1e-6 must differ, in the
oracle and in ``tvp simulate``. Rank processes that hang or fail are killed and reported.

Plans are run in module-scoped batches (``run_many``) so the imports are paid once; each
plan's distributed run is bounded by the oracle's ``timeout`` (its ranks are killed then), so
no test can hang. The bug plans beyond a fast set of three are marked ``slow``.
"""

from __future__ import annotations

import multiprocessing
import re
import time
from pathlib import Path
from typing import Any

import pytest

from trainverify_dsl.oracle import OracleError, OracleResult, run_distributed, run_many

ROOT = Path(__file__).resolve().parent.parent
#: agreement: a relative error below this (a literal, on purpose)
TOL = 1e-9
#: seconds a plan's distributed run may take before its ranks are killed
TIMEOUT = 120

CORRECT = ["plans/mlp_tiny_dp.tvp", "plans/llama_tiny_tp.tvp", "plans/llama_tiny_sp.tvp",
           "plans/llama_tiny_cp.tvp", "plans/llama_tiny_cp_zigzag.tvp",
           "plans/deepseek_tiny_ep.tvp", "plans/deepseek_tiny_pp.tvp",
           "plans/deepseek_tiny_tp.tvp", "plans/mlp_dp_tp.tvp", "plans/mlp_tiny_zero.tvp",
           "plans/mlp_tp_gather_output.tvp",
           # gradient statements after every microbatch; clipping over the tp group
           "plans/mlp_tiny_overlap.tvp", "plans/llama_tiny_clip.tvp",
           # a label-smoothed loss through the vocab-parallel cross-entropy
           "plans/llama_tiny_smoothing.tvp",
           # a tied embedding on two stages, summed over the embedding group (pp), ZeRO-1
           "plans/llama_tiny_tied.tvp",
           # AdamW parameter groups on both sides (torch.optim param_groups)
           "plans/llama_tiny_nowd.tvp"]
#: bug plans checked in the fast run: gradient accumulation, a pipeline send, a collective's
#: stated backward
FAST_BUGS = ["plans/bugs/loss_not_scaled.tvp", "plans/bugs/send_wrong_stage.tvp",
             "plans/bugs/backward_allreduce.tvp"]
#: the first tensor that differs, in program order (loss, then per parameter its gradient,
#: update and states): what each bug breaks first.
FIRST_DIFFERENCE = {
    "plans/bugs/loss_not_scaled.tvp": "grad(fc1.weight)",
    "plans/bugs/send_wrong_stage.tvp": "loss",
    "plans/bugs/backward_allreduce.tvp": "grad(embed.weight)",
}
#: bug plans that no local program exists for (docs/lowering.md: TVP403 layout-mismatch;
#: TVP412 a gradient block the sharded optimizer cannot consume; TVP244 a stage reading a
#: value of a later stage)
NOT_LOWERABLE = ["plans/bugs/allgather_instead_of_allreduce.tvp",
                 "plans/bugs/allreduce_instead_of_allgather.tvp",
                 "plans/bugs/stage_order_breaks_dependency.tvp",
                 "plans/bugs/rope_not_offset.tvp", "plans/bugs/zero_reduce_scatter_order.tvp"]
#: bug plans the oracle refuses before running, with the words of its reason: a plan `tvp
#: lint` rejects, a loss reduction other than the local mean
REFUSED = {"plans/bugs/interleaved_without_virtual_stages.tvp": "the plan has errors",
           "plans/bugs/optimizer_eps_differs.tvp": "the plan has errors",
           "plans/bugs/weight_decay_on_norms.tvp": "the plan has errors",
           "plans/bugs/loss_divided_by_padded_tokens.tvp": "is not run by the oracle",
           "plans/bugs/optimizer_lr_on_one_rank.tvp": "are not run by the oracle"}
#: bug plans whose effect on the compared tensors is small: a clip coefficient off by a fifth
#: scales lr * grad, which is small next to the parameters it updates
SMALL_EFFECT = {"plans/bugs/grad_norm_counts_tp_copies.tvp": 1e-7}
ALL_BUGS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "plans" / "bugs").glob("*.tvp"))
SLOW_BUGS = [p for p in ALL_BUGS if p not in FAST_BUGS and p not in NOT_LOWERABLE
             and p not in REFUSED]


def _id(path: str) -> str:
    return Path(path).stem


def _run(paths: list[str]) -> dict[str, OracleResult]:
    results = run_many([str(ROOT / p) for p in paths], timeout=TIMEOUT)
    return {p: results[str(ROOT / p)] for p in paths}


@pytest.fixture(scope="module")
def correct() -> dict[str, OracleResult]:
    return _run(CORRECT)


@pytest.fixture(scope="module")
def fast_bugs() -> dict[str, OracleResult]:
    return _run(FAST_BUGS + NOT_LOWERABLE)


@pytest.fixture(scope="module")
def slow_bugs() -> dict[str, OracleResult]:
    return _run(SLOW_BUGS)


def _assert_ran(result: OracleResult) -> None:
    assert result.error is None, result.error
    assert result.compared > 0


# ---------------------------------------------------------------- correct plans agree


@pytest.mark.parametrize("path", CORRECT, ids=_id)
def test_correct_plan_agrees_with_single_device_torch(path: str,
                                                      correct: dict[str, OracleResult]) -> None:
    result = correct[path]
    _assert_ran(result)
    assert result.max_rel_error < TOL, result.summary()
    assert result.agrees and result.first is None, result.summary()


def test_correct_plans_compare_every_final_output(correct: dict[str, OracleResult]) -> None:
    """Loss, a gradient and an updated parameter per parameter on every rank holding it, and
    AdamW's two moments under ZeRO-1: mlp_tiny_zero has 4 parameters on 4 ranks (4 gradients,
    4 parameters, 8 moments each) plus the loss and its 3 copies."""
    assert correct["plans/mlp_tiny_zero.tvp"].compared == 4 * 4 * 4 + 1
    # mlp_tiny_dp: 4 parameters on 2 ranks (gradient, new parameter; SGD keeps no state),
    # one loss copy per data block and microbatch, the loss
    assert correct["plans/mlp_tiny_dp.tvp"].compared == 4 * 2 * 2 + 1


# ---------------------------------------------------------------- bug plans differ


@pytest.mark.parametrize("path", FAST_BUGS, ids=_id)
def test_bug_plan_differs(path: str, fast_bugs: dict[str, OracleResult]) -> None:
    result = fast_bugs[path]
    _assert_ran(result)
    assert not result.agrees, result.summary()
    assert result.max_rel_error > 1e-3, result.summary()
    assert result.first is not None and result.first.tensor == FIRST_DIFFERENCE[path]


@pytest.mark.slow
@pytest.mark.parametrize("path", SLOW_BUGS, ids=_id)
def test_bug_plan_differs_slow(path: str, slow_bugs: dict[str, OracleResult]) -> None:
    result = slow_bugs[path]
    _assert_ran(result)
    assert not result.agrees, result.summary()
    assert result.max_rel_error > SMALL_EFFECT.get(path, 1e-3), result.summary()


@pytest.mark.parametrize("path", sorted(REFUSED), ids=_id)
def test_bug_plan_the_oracle_refuses(path: str) -> None:
    from trainverify_dsl.api import SimulationSetupError

    with pytest.raises((OracleError, SimulationSetupError), match=REFUSED[path]):
        run_distributed(ROOT / path, timeout=TIMEOUT)


def test_an_embedding_group_over_some_of_the_stages_is_refused(tmp_path: Path) -> None:
    """pp=3 with the tied embedding on stages 0 and 2: the embedding group is two of the three
    pp ranks, a process group the oracle does not build; refused before any rank runs."""
    text = (ROOT / "plans" / "llama_tiny_tied.tvp").read_text()
    text = text.replace("mesh pp=2, dp=2", "mesh pp=3, dp=2").replace(
        "pipeline-stage 1: layers[1:2], norm, output, loss",
        "pipeline-stage 1: layers[1:2]\npipeline-stage 2: norm, output, loss")
    path = tmp_path / "tied_pp3.tvp"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(OracleError, match="held on some of the 3 stages"):
        run_distributed(path, timeout=TIMEOUT)


def test_a_false_layout_claim_is_never_agreed(tmp_path: Path) -> None:
    """`partial grad(fc1.weight) over dp op=sum` where the gradient is averaged: no value the
    ranks compare changes, so the oracle said "agrees" (exit 0) while `tvp simulate` and
    `tvp check` reject the plan (TVP407; found by a differential test of the two). The
    values still agree; the plan does not."""
    import json

    from trainverify_dsl.cli.main import main

    text = (ROOT / "plans" / "mlp_tiny_dp.tvp").read_text()
    path = tmp_path / "false_claim.tvp"
    path.write_text(text + "partial grad(fc1.weight) over dp op=sum\n", encoding="utf-8")
    result = run_distributed(path, timeout=TIMEOUT)
    assert result.values_agree and not result.agrees
    assert "TVP407" in result.layout_errors[0]
    assert "rejected" in result.summary() and "layout pass reports 1 error" in result.summary()
    # the same run as one JSON document (`--format json`), exit 1
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["run-distributed", str(path), "--format", "json",
                     "--allow-model-outside-root"])
    document = json.loads(out.getvalue())
    assert code == 1
    assert document["verdict"] == "rejected" and document["agrees"] is False
    assert document["differences"] == [] and document["difference_count"] == 0
    assert document["ranks"] == 2 and document["compared"] == result.compared
    assert "TVP407" in document["layout_errors"][0]


@pytest.mark.parametrize("path", NOT_LOWERABLE, ids=_id)
def test_bug_plan_cannot_be_lowered(path: str, fast_bugs: dict[str, OracleResult]) -> None:
    result = fast_bugs[path]
    assert result.lowering_error, result.summary()
    assert result.error is not None and result.error.startswith("LoweringError")


def test_every_bug_plan_is_covered() -> None:
    """Every bug plan is in one list above, and all fit in 8 ranks."""
    from trainverify_dsl.api import resolve_plan

    assert sorted(FAST_BUGS + SLOW_BUGS + NOT_LOWERABLE + list(REFUSED)) == ALL_BUGS
    for path in [p for p in ALL_BUGS if p not in REFUSED]:
        mesh = resolve_plan(ROOT / path).mesh
        assert mesh is not None and mesh.total_devices <= 8


def test_unlowerable_plan_raises_lowering_error() -> None:
    from trainverify_dsl.lower.findings import LoweringError

    with pytest.raises(LoweringError, match="split over cp"):
        run_distributed(ROOT / "plans/bugs/rope_not_offset.tvp", timeout=TIMEOUT)


# ---------------------------------------------------------------- the tolerance is a property


def _perturbed(tmp_path: Path) -> Path:
    """mlp_tiny_dp with its loss scale (hence every gradient) larger by a relative 1e-6."""
    text = (ROOT / "plans" / "mlp_tiny_dp.tvp").read_text()
    assert "loss-scale 1/microbatches\n" in text
    path = tmp_path / "perturbed.tvp"
    path.write_text(text.replace("loss-scale 1/microbatches\n",
                                 "loss-scale 1.000001/microbatches\n"))
    return path


def test_oracle_tells_a_relative_1e6_perturbation(tmp_path: Path) -> None:
    result = run_distributed(_perturbed(tmp_path), timeout=TIMEOUT)
    assert 5e-7 < result.max_rel_error < 2e-6, result.summary()
    assert not result.agrees
    assert result.first is not None and result.first.tensor.startswith("grad(")


def test_simulate_tells_a_relative_1e6_perturbation(tmp_path: Path) -> None:
    """The same property for ``tvp simulate`` (its tolerance, too, is not taken on trust)."""
    from trainverify_dsl.api import simulate_file

    # the layout pass tells the scale statically (TVP411); the simulation must tell it too
    result = simulate_file(_perturbed(tmp_path), stop_on_errors=False)
    assert any(d.code.id == "TVP411" for d in result.findings)
    assert 5e-7 < result.max_rel_error < 2e-6
    assert not result.agrees


# ---------------------------------------------------------------- limits and clean-up


def test_larger_mesh_is_refused_with_a_message() -> None:
    with pytest.raises(OracleError, match=r"16 ranks.*at most 8"):
        run_distributed(ROOT / "plans" / "gpt2_3d.tvp")


def test_hanging_ranks_are_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that never finishes is killed at the timeout, and reported; no process is
    left behind."""
    import trainverify_dsl.oracle.run as oracle_run

    monkeypatch.setattr(oracle_run, "rank_main", _sleep_forever)
    start = time.monotonic()
    result = run_many([ROOT / "plans" / "mlp_tiny_dp.tvp"], timeout=3)
    (only,) = result.values()
    assert only.error is not None and "killed" in only.error
    assert time.monotonic() - start < 60
    assert multiprocessing.active_children() == []


def test_failing_rank_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The root cause is reported, not the timeout of the rank left waiting for it."""
    import trainverify_dsl.oracle.worker as worker

    monkeypatch.setattr(worker, "run_rank_job", _fail_on_rank_1)
    result = run_many([ROOT / "plans" / "mlp_tiny_dp.tvp"], timeout=3)
    (only,) = result.values()
    assert only.error is not None and only.error.startswith("rank 1: ValueError: boom")
    assert multiprocessing.active_children() == []


def _sleep_forever(job: Any, rank: int) -> None:
    time.sleep(600)


def _fail_on_rank_1(job: Any, rank: int) -> dict[str, Any]:
    if rank == 1:
        raise ValueError("boom")
    time.sleep(600)
    return {}


def test_cli_refuses_a_larger_mesh(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from trainverify_dsl.cli.main import main

    assert main(["run-distributed", str(ROOT / "plans" / "gpt2_3d.tvp")]) == 2
    assert "at most 8" in capsys.readouterr().err
    assert main(["run-distributed", str(ROOT / "plans" / "gpt2_3d.tvp"), "--format",
                 "json"]) == 2
    captured = capsys.readouterr()
    document = json.loads(captured.out)  # one document on stdout, one line on stderr
    assert document["verdict"] == "not-run" and "at most 8" in document["error"]
    assert document["ranks"] is None and document["differences"] == []
    assert "at most 8" in captured.err


def test_cli_json_reports_a_broken_spec_with_its_diagnostics(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from trainverify_dsl.cli.main import main

    (tmp_path / "model.py").write_text("import torch\nclass M(torch.nn.Module):\n"
                                       "    def forward(self, x):\n        return x\n",
                                       encoding="utf-8")
    text = (ROOT / "plans" / "mlp_tiny_dp.tvp").read_text()
    spec = next(line for line in text.splitlines() if line.startswith("spec "))
    path = tmp_path / "broken.tvp"
    path.write_text(text.replace(spec, 'spec "model.py:M" batch 8 seq 1'), encoding="utf-8")
    code = main(["run-distributed", str(path), "--format", "json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1 and document["verdict"] == "errors", document
    assert document["findings"] and document["findings"][0]["code"].startswith("TVP3")


@pytest.mark.slow
def test_project_collectives_agree_with_torch_distributed() -> None:
    """The project's own ``tvp.collective`` over its gloo ``DistCommunicator`` (an all-gather,
    then its own arithmetic) gives the single-device result too, on a plan with all-gathers
    and reduce-scatters (sequence parallel) and one with all-to-alls (expert parallel)."""
    paths = ["plans/llama_tiny_sp.tvp", "plans/deepseek_tiny_ep.tvp"]
    results = run_many([ROOT / p for p in paths], timeout=TIMEOUT, collectives="project")
    for result in results.values():
        _assert_ran(result)
        assert result.max_rel_error < TOL, result.summary()


# ---------------------------------------------------------------- masked labels


@pytest.mark.parametrize("value", [-100, 3])
@pytest.mark.parametrize("shape", [(2, 2), (4, 2), (8, 4), (4, 8), (2, 3, 4), (6,)])
def test_masked_labels_count_unevenly_in_every_block_split(shape: tuple[int, ...],
                                                          value: int) -> None:
    """The oracle's masked labels (``mask_rows``) never give every block of an even split of
    the rows or of the positions the same token count: a plan dividing each rank's loss by
    its own count must differ from torch for every seed (with a random share it agreed for
    some)."""
    import numpy as np

    from trainverify_dsl.simulate.run import mask_rows

    # every entry drawn equal to an in-range masking value (a pad id 3 of 16) moves away
    ids = mask_rows(np.full(shape, 3, dtype=np.int64), (value,), 16)
    kept = (ids != value)
    assert kept.reshape(-1, shape[-1]).any(axis=-1).all()  # no row masked whole
    for dim in range(ids.ndim):
        for blocks in range(2, ids.shape[dim] + 1):
            if ids.shape[dim] % blocks:
                continue
            counts = {int(b.sum()) for b in np.split(kept, blocks, axis=dim)}
            assert len(counts) > 1, (dim, blocks)


def test_a_refusal_names_the_statement_it_refuses(tmp_path: Path) -> None:
    """What the oracle does not run (per-rank overrides, a loss reduction, virtual stages) is
    refused at the statement's file:line:col, as every other diagnostic is."""
    text = (ROOT / "plans" / "mlp_tiny_dp.tvp").read_text(encoding="utf-8").replace(
        '"stdlib/', f'"{ROOT}/stdlib/')
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines, 1) if line.startswith("optimizer "))
    path = tmp_path / "override.tvp"
    path.write_text("\n".join(lines[:at] + ["on dp=1: optimizer sgd lr=0.1"] + lines[at:])
                    + "\n", encoding="utf-8")
    with pytest.raises(OracleError, match=rf"^{re.escape(str(path))}:{at + 1}:1: per-rank"):
        run_distributed(path)


def test_a_plan_that_cannot_be_lowered_is_reported_at_its_statement(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The lowering's findings are diagnostics with file:line:col, in text and in JSON (the
    message alone named no line, while `tvp lint --spec` located the same error)."""
    import json

    from trainverify_dsl.cli.main import main

    text = (ROOT / "plans" / "mlp_tiny_dp.tvp").read_text(encoding="utf-8").replace(
        '"stdlib/', f'"{ROOT}/stdlib/')
    path = tmp_path / "wrong.tvp"  # a weight split over the data axis: the input is too
    path.write_text(text + "split fc1.weight [dp, -]\n", encoding="utf-8")
    assert main(["run-distributed", str(path)]) == 1
    out = capsys.readouterr().out
    assert re.search(rf"{re.escape(str(path))}:\d+:\d+: error: .*\[TVP4\d\d\]", out), out
    assert "cannot be lowered" in out
    assert main(["run-distributed", str(path), "--format", "json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["verdict"] == "errors" and document["findings"], document
    assert all(f["span"]["file"] == str(path) and f["span"]["line"] >= 1
               for f in document["findings"]), document["findings"]


def test_cli_a_plan_with_syntax_errors_is_errors_exit_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was `not-run`, exit 2 (read as a usage error), while a spec error is `errors`,
    exit 1, as in lint, simulate and check."""
    import json

    from trainverify_dsl.cli.main import main

    path = tmp_path / "syntax.tvp"
    path.write_text("plan p\nmesh dp=2\nsplit x [dp; -]\n", encoding="utf-8")
    assert main(["run-distributed", "--format", "json", str(path)]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["verdict"] == "errors"
    assert any(f["code"] == "TVP100" for f in document["findings"]), document["findings"]
    assert main(["run-distributed", str(path)]) == 1
    out = capsys.readouterr().out
    assert "[TVP100]" in out and "not run: the plan has errors" in out
