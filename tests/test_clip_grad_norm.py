"""``clip-grad-norm`` (docs/semantics.md §6.3): the reference recipe clips with torch's
``clip_grad_norm_``; the plan's norm group and its replica rule decide each rank's coefficient.
Each case is a shipped plan with the recipe's clipping added, simulated: a correct norm group
agrees; a group that misses a splitting axis, or copies counted twice, differs at the
statement. (The Llama twin pair plans/llama_tiny_clip.tvp and
plans/bugs/grad_norm_counts_tp_copies.tvp run in tests/test_simulate_plans.py and
tests/test_check.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl.api import simulate_file
from trainverify_dsl.plan import lint_file

ROOT = Path(__file__).resolve().parent.parent
#: small enough that every drawn step is clipped (a norm below it leaves the gradients alone
#: and every norm group would agree)
LIMIT = "0.001"


def variant(tmp_path: Path, plan: str, clip: str | None, recipe: bool = True,
            limit: str = LIMIT) -> Path:
    """``plans/<plan>.tvp`` with ``clip`` appended and (``recipe``) the recipe clipping at
    ``limit``."""
    text = (ROOT / "plans" / f"{plan}.tvp").read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("spec-optimizer "))
    if recipe:
        lines[at] += f" clip-grad-norm={limit}"
    if clip is not None:
        lines.append(clip)
    path = tmp_path / f"{plan}_clip.tvp"
    path.write_text("\n".join(lines).replace('"stdlib/', f'"{ROOT}/stdlib/') + "\n")
    return path


def simulate(path: Path):  # noqa: ANN201 - test helper
    return simulate_file(path, allow_model_outside_root=True)


@pytest.mark.parametrize(("plan", "clip"), [
    ("mlp_tiny_dp", f"clip-grad-norm {LIMIT}"),                 # every mesh axis
    ("mlp_tiny_dp", f"clip-grad-norm {LIMIT} over dp"),
    ("mlp_dp_tp", f"clip-grad-norm {LIMIT} over tp"),           # dp replicas are equal
    ("mlp_dp_tp", f"clip-grad-norm {LIMIT} over dp, tp"),       # dp copies counted once
    ("mlp_tiny_zero", f"clip-grad-norm {LIMIT} over dp, zp"),   # ZeRO blocks over both
    ("deepseek_tiny_pp", f"clip-grad-norm {LIMIT} over pp"),    # one norm over the stages
])
def test_a_norm_group_holding_every_part_agrees(tmp_path: Path, plan: str, clip: str) -> None:
    result = simulate(variant(tmp_path, plan, clip))
    assert result.agrees, result.mismatches[:3]
    assert result.compared > 0


@pytest.mark.parametrize(("plan", "clip"), [
    ("mlp_dp_tp", f"clip-grad-norm {LIMIT} over dp"),           # tp shards missing
    ("mlp_dp_tp", f"clip-grad-norm {LIMIT} over tp replicas=each"),  # biases count twice
    ("mlp_tiny_dp", f"clip-grad-norm {LIMIT} replicas=each"),   # dp replicas count twice
    ("mlp_tiny_zero", f"clip-grad-norm {LIMIT} over zp"),       # the dp blocks missing
])
def test_a_wrong_norm_group_differs_at_the_statement(tmp_path: Path, plan: str,
                                                     clip: str) -> None:
    path = variant(tmp_path, plan, clip)
    result = simulate(path)
    assert not result.agrees
    line = len(path.read_text().splitlines())
    first = result.first
    assert first is not None and first.check == "clipping", first
    assert first.span is not None and first.span.line == line


@pytest.mark.parametrize(("plan", "clip"), [
    ("mlp_dp_tp", "clip-grad-norm 1000 over dp"),               # tp shards missing
    ("mlp_tiny_dp", "clip-grad-norm 1000 replicas=each"),       # dp replicas count twice
])
def test_a_wrong_norm_group_differs_though_nothing_is_clipped(tmp_path: Path, plan: str,
                                                               clip: str) -> None:
    """At a bound no drawn norm reaches, every coefficient is 1 and the gradients are the
    spec's: a norm summed over the wrong group agreed (and real steps past the bound clip
    wrongly). The squared norm itself is compared first; tvp check finds it too."""
    from trainverify_dsl.api import check_file

    path = variant(tmp_path, plan, clip, limit="1000")
    result = simulate(path)
    assert not result.agrees
    first = result.first
    assert first is not None and first.tensor == "clip squared norm", first
    assert first.span is not None and first.span.line == len(path.read_text().splitlines())
    assert check_file(path, allow_model_outside_root=True).verdict == "counterexample"


def test_the_recipe_and_the_plan_must_both_clip_at_one_norm(tmp_path: Path) -> None:
    missing = lint_file(variant(tmp_path, "mlp_tiny_dp", None))
    assert [d.code.id for d in missing] == ["TVP280"]
    assert "the plan does not clip" in missing[0].message
    extra = variant(tmp_path, "mlp_tiny_dp", "clip-grad-norm 1.0", recipe=False)
    (found,) = lint_file(extra)
    assert found.code.id == "TVP280" and found.span.line == len(extra.read_text().splitlines())
    other = variant(tmp_path, "mlp_tiny_dp", "clip-grad-norm 0.5")
    (found,) = lint_file(other)
    assert "at norm 0.5, the spec's recipe at 0.001" in found.message


@pytest.mark.parametrize(("clip", "code"), [
    (f"clip-grad-norm {LIMIT} norm-type=1", "TVP255"),
    (f"clip-grad-norm {LIMIT} replicas=twice", "TVP255"),
    (f"clip-grad-norm {LIMIT} over dq", "TVP207"),
    (f"clip-grad-norm {LIMIT} scale=2", "TVP260"),
])
def test_malformed_clipping_is_a_located_error(tmp_path: Path, clip: str, code: str) -> None:
    path = variant(tmp_path, "mlp_tiny_dp", clip)
    found = lint_file(path)
    assert code in [d.code.id for d in found], [(d.code.id, d.message) for d in found]
    assert all(d.span.line == len(path.read_text().splitlines()) for d in found)
