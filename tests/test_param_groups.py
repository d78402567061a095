"""Parameter groups, `on TARGET, ...: optimizer ...` and `... spec-optimizer ...`
(docs/semantics.md §6.5).

A group on both sides agrees, is proven and agrees with torch.optim's `param_groups` under
gloo; a group one side lacks, or a regrouping, differs at the statement that chose the plan's
update, naming the parameters; `tvp lint` reports what the text alone shows; every misuse is a
located error; a per-rank override applies on top of a parameter's group; templates and
ZeRO-1 carry groups; the format round-trips.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl import api
from trainverify_dsl.api import check_file, simulate_file
from trainverify_dsl.check.verdict import COUNTEREXAMPLE, VERIFIED
from trainverify_dsl.ir.parallel import format_parallel, parallel_problems
from trainverify_dsl.oracle import OracleError, run_distributed
from trainverify_dsl.parse.format import format_source
from trainverify_dsl.parse.parser import parse_source
from trainverify_dsl.plan.resolve import resolve_file

ROOT = Path(__file__).resolve().parents[1]
HEAD = ('plan m\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
        "spec-optimizer adamw lr=0.01 weight-decay=0.1\n"
        "on fc1.bias, fc2.bias: spec-optimizer adamw weight-decay=0\n"
        "mesh dp=2, tp=2\nsplit x [dp, -]\nsplit target [dp, -]\n"
        "all-reduce grad(params) over dp op=avg\n")
#: the plan's side of the biases' no-decay group (line 10 after ``optimizer`` on line 9)
PLAN = HEAD + "optimizer adamw lr=0.01 weight-decay=0.1\n"
GROUP = "on fc1.bias, fc2.bias: optimizer adamw weight-decay=0\n"


def write(tmp_path: Path, text: str, name: str = "p.tvp") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def errors(path: Path) -> list[tuple[str, int]]:
    return [(d.code.id, d.span.line) for d in resolve_file(path, project_root=ROOT).diagnostics
            if d.severity == "error"]


def layout_errors(path: Path) -> list[tuple[str, int]]:
    return [(d.code.id, d.span.line) for d in api.layout_diagnostics(path)
            if d.severity == "error"]


def test_a_group_on_both_sides_agrees_and_is_verified(tmp_path: Path) -> None:
    path = write(tmp_path, PLAN + GROUP)
    assert errors(path) == []
    result = simulate_file(path)  # also checks the reference step against eager torch
    assert result.agrees, result.mismatches[:3]
    assert check_file(path).verdict == VERIFIED


def test_the_program_carries_each_parameters_group(tmp_path: Path) -> None:
    path = write(tmp_path, PLAN + GROUP)
    built = api.build_programs(path, shrink=False)
    program = built.program
    assert not parallel_problems(program)
    opt = program.optimizer
    assert opt is not None
    grouped = {u.param: dict(u.hyper)["weight-decay"] for u in opt.updates}
    assert grouped["fc1.bias"] == grouped["fc2.bias"] == 0
    assert grouped["fc1.weight"] == grouped["fc2.weight"] != 0
    assert {u.param for u in opt.updates if u.group.span is not None} == {"fc1.bias", "fc2.bias"}
    text = format_parallel(program, graphs=False)
    assert any(line.startswith("  update fc1.bias:") and "@ 10:1" in line
               for line in text.splitlines())
    # the reference updates the biases with its own group's graph
    reference = built.spec.program
    assert any(name.endswith(".group0") for name, _ in reference.graphs)


def test_a_group_the_plan_lacks_is_a_lint_error_at_its_optimizer(tmp_path: Path) -> None:
    path = write(tmp_path, PLAN)
    assert errors(path) == [("TVP280", 9)]
    # and the recipe's group the plan lacks, the other way round
    other = write(tmp_path, PLAN.replace("on fc1.bias, fc2.bias: spec-optimizer adamw "
                                         "weight-decay=0\n", "") + GROUP, "other.tvp")
    assert errors(other) == [("TVP280", 9)]


def test_a_regrouping_the_text_does_not_show_differs_at_the_statement_that_chose(
        tmp_path: Path) -> None:
    """The plan's group holds fc1.bias only: fc2.bias is updated by the plan-wide optimizer
    (line 9) with weight decay, the recipe's group keeps it undecayed. `tvp lint` cannot see
    it (the groups name other targets); the simulation and the proof report it at line 9,
    naming the parameter; gloo, running torch.optim's param_groups, differs too."""
    path = write(tmp_path, PLAN + "on fc1.bias: optimizer adamw weight-decay=0\n")
    assert errors(path) == []
    result = simulate_file(path)
    assert not result.agrees
    recipe = [m for m in result.mismatches if m.check == "optimizer recipe"]
    assert [(m.span.line, "fc2.bias" in m.detail, "fc1.bias" in m.detail)
            for m in recipe] == [(9, True, False)]
    assert {m.tensor for m in result.mismatches if m.check != "optimizer recipe"} >= \
        {"new(fc2.bias)"}
    verdict = check_file(path)
    assert verdict.verdict == COUNTEREXAMPLE
    assert verdict.counterexample is not None and verdict.counterexample.span.line == 9
    gloo = run_distributed(path, timeout=120)
    assert not gloo.agrees
    assert any("fc2.bias" in d.tensor for d in gloo.differences)


@pytest.mark.slow
def test_gloo_agrees_with_a_group_on_both_sides(tmp_path: Path) -> None:
    path = write(tmp_path, PLAN + GROUP)
    assert run_distributed(path, timeout=120).agrees


def test_a_per_rank_override_applies_on_top_of_the_group(tmp_path: Path) -> None:
    # restating the plan-wide learning rate on dp=1 keeps the biases' group there
    same = write(tmp_path, PLAN + GROUP + "on dp=1: optimizer adamw lr=0.01\n")
    assert simulate_file(same).agrees
    # an override stating the decay puts it back on the biases of its ranks: a difference
    # at the override, named by parameter
    decay = write(tmp_path, PLAN + GROUP + "on dp=1: optimizer adamw weight-decay=0.1\n",
                  "decay.tvp")
    result = simulate_file(decay)
    assert not result.agrees
    recipe = [m for m in result.mismatches if m.check == "optimizer recipe"]
    assert [m.span.line for m in recipe] == [11] and "bias" in recipe[0].detail
    wrong = {m.rank for m in result.mismatches if m.check != "optimizer recipe"}
    from trainverify_dsl.ir.mesh import MeshGroups

    mesh = MeshGroups(api.build_programs(decay, shrink=False).program.mesh)
    assert wrong == {r for r in range(mesh.world_size) if mesh.coords(r)["dp"] == 1}


def test_groups_in_templates_and_under_zero(tmp_path: Path) -> None:
    text = (HEAD.replace("all-reduce grad(params) over dp op=avg",
                         "reduce-scatter grad(params) over dp dim=0 op=avg")
            .replace("batch 8 seq 1", "batch 8 seq 1 d_out 4")
            + "optimizer adamw lr=0.01 weight-decay=0.1 shard over dp\n"
            "template no_decay(m):\n    on m.bias: optimizer adamw weight-decay=0\n"
            "apply no_decay(fc1)\napply no_decay(fc2)\n")
    path = write(tmp_path, text)
    assert errors(path) == []
    assert simulate_file(path).agrees
    program = api.build_programs(path, shrink=False).program
    assert program.optimizer is not None and program.optimizer.shard_axes == ("dp",)
    assert {u.param for u in program.optimizer.updates if u.group.span is not None} == \
        {"fc1.bias", "fc2.bias"}


@pytest.mark.parametrize(("line", "code", "col"), [
    ("on fc1.bias: optimizer sgd lr=0.01", "TVP269", 24),
    ("on fc1.bias: optimizer adamw weight-decay=0 shard over dp", "TVP269", 1),
    ("on dp=1, fc1.bias: optimizer adamw weight-decay=0", "TVP269", 1),
    ("on fc1.bias: spec-optimizer adamw clip-grad-norm=1", "TVP269", 1),
    ("on dp=1: spec-optimizer adamw lr=0.02", "TVP249", 1),
    ("on fc1.bias: optimizer adamw foo=1", "TVP253", 30),
])
def test_a_malformed_group_is_a_lint_error_at_it(tmp_path: Path, line: str, code: str,
                                                 col: int) -> None:
    path = write(tmp_path, PLAN + GROUP.replace("fc1.bias, fc2.bias", "fc2.bias") + line + "\n")
    found = [(d.code.id, d.span.line, d.span.col)
             for d in resolve_file(path, project_root=ROOT).diagnostics
             if d.severity == "error" and d.code.id != "TVP280"]
    assert found == [(code, 11, col)]


def test_a_group_without_its_plan_wide_statement_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + GROUP)
    assert ("TVP269", 9) in errors(path)
    sgd = write(tmp_path, HEAD.replace("adamw lr=0.01 weight-decay=0.1", "sgd lr=0.1 "
                                       "momentum=0.9").replace("spec-optimizer adamw "
                                       "weight-decay=0", "spec-optimizer sgd momentum=0")
                + "optimizer sgd lr=0.1 momentum=0.9\n", "sgd.tvp")
    # momentum 0 in a group removes the momentum buffer: another set of states
    assert ("TVP269", 4) in errors(sgd)


def test_targets_are_checked_against_the_model(tmp_path: Path) -> None:
    typo = write(tmp_path, PLAN + "on fc1.bais: optimizer adamw weight-decay=0\n")
    assert errors(typo) == []  # the model is needed to know
    assert layout_errors(typo) == [("TVP401", 10)]
    twice = write(tmp_path, PLAN + GROUP + "on fc1: optimizer adamw weight-decay=0.2\n",
                  "twice.tvp")
    assert layout_errors(twice) == [("TVP269", 11)]
    # a module target selects every parameter inside it
    module = write(tmp_path, PLAN.replace("on fc1.bias, fc2.bias: spec-optimizer",
                                          "on fc1, fc2.bias: spec-optimizer")
                   + "on fc1, fc2.bias: optimizer adamw weight-decay=0\n", "module.tvp")
    assert layout_errors(module) == []
    assert simulate_file(module).agrees


def test_the_format_round_trips_and_a_coordinate_is_a_plain_name() -> None:
    text = ("on norm, layers.*.attention_norm: optimizer adamw weight-decay=0\n"
            "on norm: spec-optimizer adamw weight-decay=0\n"
            "on dp=1, tp=0: optimizer adamw lr=0.02\n")
    assert format_source(text).text == text
    bad = parse_source("on layers.0=1: optimizer adamw lr=0.02\n")
    assert [(d.code.id, d.span.col) for d in bad.diagnostics] == [("TVP101", 4)]


def test_the_oracle_still_refuses_per_rank_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, PLAN + GROUP + "on dp=1: optimizer adamw lr=0.01\n")
    with pytest.raises(OracleError, match="per-rank overrides"):
        run_distributed(path, timeout=120)
