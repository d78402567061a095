"""Tied parameters under pipeline parallelism (docs/semantics.md §5.4): the embedding tied to the
output head is held by the first and the last stage, each computes the gradient of its own use,
and `all-reduce grad(embed.weight) over pp` sums the copies over the pp ranks holding them
(Megatron-LM's embedding group). Without it the copies' gradients are partial over pp: the
layout pass reports TVP410 at the `pipeline-stage` that put the second use on another stage,
and the numbers differ on every rank holding a copy.

The plans are variants of plans/llama_tiny_tied.tvp (pp=2 x dp=2, ZeRO-1 AdamW)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl.api import SimulationSetupError, simulate_file
from trainverify_dsl.cli.main import main
from trainverify_dsl.plan import lint_file
from trainverify_dsl.simulate import TOLERANCE

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "plans" / "llama_tiny_tied.tvp"
BUG = ROOT / "plans" / "bugs" / "tied_embedding_grads_not_summed.tvp"
GROUP = "all-reduce grad(embed.weight) over pp"
SCATTER = "reduce-scatter grad(params) over dp dim=0 op=avg"


def variant(tmp_path: Path, *edits: tuple[str, str], name: str = "tied.tvp") -> Path:
    text = PLAN.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def line_of(path: Path, statement: str) -> int:
    lines = path.read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.split("#")[0].strip() == statement)


def errors_of(path: Path) -> list[tuple[str, int, str]]:
    """The full-size layout pass's errors (the simulation stops on them), or ``[]``."""
    try:
        simulate_file(path)
    except SimulationSetupError as error:
        return [(d.code.id, d.span.line, d.message) for d in error.diagnostics]
    return []


def assert_agrees(path: Path) -> None:
    result = simulate_file(path)
    assert result.agrees and not result.findings, result.mismatches[:3]
    assert result.max_rel_error < TOLERANCE


# ---------------------------------------------------------------- the plan pair


def test_the_correct_plan_compares_both_copies_with_the_spec() -> None:
    result = simulate_file(PLAN)
    assert result.agrees and not result.findings, result.mismatches[:3]
    # the loss; then per parameter its gradient, update and two Adam states on each rank
    # holding it: the 19 untied ones on the 2 dp ranks of their stage, embed.weight on all 4
    # (both stages hold a copy, each compared with the spec's one value)
    assert result.compared == 1 + 4 * (19 * 2 + 1 * 4)


def test_the_bug_twin_is_reported_at_its_line_by_the_layout_pass() -> None:
    found = errors_of(BUG)
    line = line_of(BUG, "pipeline-stage 1: layers[1:2], norm, output, loss")
    assert [(code, at) for code, at, _ in found] == [("TVP410", line)]
    assert "partial over pp" in found[0][2] and "embed.weight" in found[0][2]


def test_the_bug_twin_differs_numerically_on_both_stages() -> None:
    """Simulated anyway, each copy steps with its own use's gradient: rank 0 (stage 0, the
    lookup) and rank 2 (stage 1, the head) both differ from the spec."""
    result = simulate_file(BUG, stop_on_errors=False)
    assert not result.agrees and result.max_rel_error > 1e-3
    wrong = {(m.tensor, m.rank) for m in result.mismatches}
    assert {("grad(embed.weight)", r) for r in range(4)} <= wrong
    assert ("new(embed.weight)", 0) in wrong and ("new(embed.weight)", 2) in wrong
    assert not any("layers" in t or "norm" in t for t, _ in wrong)


def test_lint_accepts_the_embedding_group_but_not_other_groups_over_pp(tmp_path: Path) -> None:
    assert not lint_file(PLAN, project_root=ROOT)
    wider = variant(tmp_path, (GROUP, "all-reduce grad(embed.weight) over dp, pp"))
    scatter = variant(tmp_path, (GROUP, "reduce-scatter grad(embed.weight) over pp dim=0"),
                      name="scatter.tvp")
    for path in (wider, scatter):
        found = [(d.code.id, d.span.line) for d in lint_file(path, project_root=ROOT)]
        assert ("TVP246", line_of(PLAN, GROUP)) in found, found


# ---------------------------------------------------------------- order and ZeRO


def test_the_embedding_group_after_the_zero_reduce_scatter_agrees_too(tmp_path: Path) -> None:
    """Rule 6.1's blocks are per parameter and the same rows on every stage: summing the
    copies before or after the reduce-scatter over dp adds the same blocks (§5.4)."""
    after = variant(tmp_path, (f"{GROUP}\n", ""), (f"{SCATTER}\n", f"{SCATTER}\n{GROUP}\n"))
    assert line_of(after, SCATTER) < line_of(after, GROUP)
    assert_agrees(after)


# ---------------------------------------------------------------- misuse


def test_averaging_the_copies_is_a_finding_at_the_statement(tmp_path: Path) -> None:
    path = variant(tmp_path, (GROUP, f"{GROUP} op=avg"))
    found = errors_of(path)
    line = line_of(path, f"{GROUP} op=avg")
    assert ("TVP406", line) in [(code, at) for code, at, _ in found], found
    message = next(m for code, at, m in found if (code, at) == ("TVP406", line))
    assert "partial sums over pp: op=avg divides them by 2" in message


def test_a_parameter_held_on_one_stage_has_no_copies_to_sum(tmp_path: Path) -> None:
    path = variant(tmp_path, (GROUP, "all-reduce grad(norm.weight) over pp"))
    found = errors_of(path)
    assert [(code, at) for code, at, _ in found] == [("TVP246", line_of(PLAN, GROUP))]
    assert "`norm.weight` is used on one pp rank only" in found[0][2]


def test_the_second_name_of_a_tied_parameter_gets_a_help(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    path = variant(tmp_path, (GROUP, "all-reduce grad(output.weight) over pp"))
    assert main(["simulate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:{line_of(PLAN, GROUP)}:1: error:" in out and "[TVP401]" in out
    assert "`output.weight` is tied to `embed.weight`" in out and "Traceback" not in out


@pytest.mark.parametrize("value", ["maybe", "1"])
def test_a_bad_tie_embeddings_value_stands_at_the_spec_line(
        tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = variant(tmp_path, ("tie_embeddings true", f"tie_embeddings {value}"))
    assert main(["simulate", str(path)]) == 1
    out = capsys.readouterr().out
    spec = line_of(path, next(line for line in path.read_text().splitlines()
                              if line.startswith("spec ")))
    assert f"{path}:{spec}:1: error:" in out and "[TVP303]" in out
    assert "tie_embeddings is a yes/no setting" in out and "Traceback" not in out


# ---------------------------------------------------------------- other meshes


def test_without_pipeline_stages_the_two_uses_share_one_copy(tmp_path: Path) -> None:
    """No pp: one stage holds the parameter and its local autograd sums both uses."""
    path = variant(tmp_path, ("mesh pp=2, dp=2", "mesh dp=2"),
                   ("pipeline-stage 0: embed, layers[0:1]\n", ""),
                   ("pipeline-stage 1: layers[1:2], norm, output, loss\n", ""),
                   (f"{GROUP}\n", ""))
    assert_agrees(path)


PP3 = (("mesh pp=2, dp=2", "mesh pp=3, dp=2"),
       ("pipeline-stage 1: layers[1:2], norm, output, loss",
        "pipeline-stage 1: layers[1:2]\npipeline-stage 2: norm, output, loss"))


@pytest.mark.slow
def test_the_embedding_group_is_the_stages_holding_a_copy(tmp_path: Path) -> None:
    """pp=3: the copies live on stages 0 and 2; the all-reduce over pp adds those two, and
    stage 1 (which holds none) takes no part."""
    assert_agrees(variant(tmp_path, *PP3))


@pytest.mark.slow
def test_a_missing_embedding_group_over_three_stages_names_the_last_holder(
        tmp_path: Path) -> None:
    path = variant(tmp_path, *PP3, (f"{GROUP}\n", ""))
    found = errors_of(path)
    assert [(code, at) for code, at, _ in found] == [
        ("TVP410", line_of(path, "pipeline-stage 2: norm, output, loss"))]


@pytest.mark.slow
def test_virtual_stages_hold_copies_on_the_first_and_last_rank(tmp_path: Path) -> None:
    path = variant(tmp_path, ("batch 4 seq 8 tie_embeddings", "batch 4 seq 8 n_layers 4 "
                              "tie_embeddings"),
                   ("microbatches 2 schedule 1f1b", "microbatches 2 schedule interleaved-1f1b"),
                   ("pipeline-stage 0: embed, layers[0:1]",
                    "pipeline-stage 0: embed, layers[0:1], layers[2:3]"),
                   ("pipeline-stage 1: layers[1:2], norm, output, loss",
                    "pipeline-stage 1: layers[1:2], layers[3:4], norm, output, loss"))
    assert_agrees(path)


@pytest.mark.slow
@pytest.mark.parametrize(("replicas", "agrees"), [("once", True), ("each", False)])
def test_clipping_counts_the_tied_copies_once(tmp_path: Path, replicas: str,
                                              agrees: bool) -> None:
    """§6.3: with the norm group over every axis, `replicas=once` counts a tied parameter's
    gradient on its first stage only (Megatron's `param_is_not_shared`); `replicas=each`
    counts both copies and clips with another coefficient."""
    opt = "adamw lr=0.01 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1"
    path = variant(tmp_path, (f"spec-optimizer {opt}", f"spec-optimizer {opt} clip-grad-norm=0.01"),
                   (f"optimizer {opt} shard over dp",
                    f"clip-grad-norm 0.01 replicas={replicas}\noptimizer {opt} shard over dp"))
    result = simulate_file(path)
    assert result.agrees is agrees, result.mismatches[:3]
    if not agrees:
        assert {m.check for m in result.mismatches} >= {"clipping"}


GPT2_TIED = """# GPT-2 tiny, output head tied to the token embedding, pp=2 x dp=2
plan gpt2_tiny_tied
spec "stdlib/models/gpt2.py:GPT2" config gpt2_tiny batch 8 seq 8 tie_embeddings true
spec-optimizer adam lr=0.01 betas=(0.9, 0.95) eps=1e-8
mesh pp=2, dp=2
microbatches 2 schedule gpipe
loss-scale 1/microbatches
split tokens [dp, -]
split labels [dp, -]
pipeline-stage 0: embed, pos_embed, layers[0:1]
pipeline-stage 1: layers[1:2], norm, output, loss
all-reduce grad(embed.weight) over pp
all-reduce grad(params) over dp op=avg
optimizer adam lr=0.01 betas=(0.9, 0.95) eps=1e-8
"""


@pytest.mark.slow
@pytest.mark.parametrize("summed", [True, False], ids=["summed", "not-summed"])
def test_gpt2_with_a_tied_head_over_two_stages(tmp_path: Path, summed: bool) -> None:
    """GPT-2 (learned positions, biases, the embedding sum in the root module): the same
    rule; untied parameters keep one copy, only `embed.weight` is held on both stages."""
    text = GPT2_TIED if summed else GPT2_TIED.replace(f"{GROUP}\n", "")
    path = tmp_path / "gpt2_tied.tvp"
    path.write_text(text, encoding="utf-8")
    if summed:
        assert_agrees(path)
        return
    found = errors_of(path)
    assert [(code, at) for code, at, _ in found] == [
        ("TVP410", line_of(path, "pipeline-stage 1: layers[1:2], norm, output, loss"))]
