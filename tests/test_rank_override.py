"""Per-rank overrides, `on AXIS=K: optimizer ...` (docs/semantics.md §6.4, issue 11 item 8).

An override restating the plan-wide step agrees and is proven; one with another
hyper-parameter differs on the ranks it holds on, reported at the override, with and without
ZeRO (where the all-gather carries the wrong block to every rank); every misuse is a located
lint error; the parallel program carries one update graph per parameter per override.
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
from trainverify_dsl.plan.resolve import resolve_file

ROOT = Path(__file__).resolve().parents[1]
MLP = ('plan m\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
       "spec-optimizer sgd lr=0.1 momentum=0.9\nmesh dp=2, tp=2\nsplit x [dp, -]\n"
       "split target [dp, -]\nall-reduce grad(params) over dp op=avg\n"
       "optimizer sgd lr=0.1 momentum=0.9\n")


def write(tmp_path: Path, text: str, name: str = "p.tvp") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_restating_the_plan_wide_step_agrees_and_is_verified(tmp_path: Path) -> None:
    path = write(tmp_path, MLP + "on dp=1, tp=0: optimizer sgd lr=0.1 momentum=0.9\n")
    assert simulate_file(path).agrees
    assert check_file(path).verdict == VERIFIED
    # what an override does not state is the plan-wide statement's (momentum 0.9 here)
    inherited = write(tmp_path, MLP + "on dp=1: optimizer sgd lr=0.1\n", "inherited.tvp")
    assert simulate_file(inherited).agrees


@pytest.mark.parametrize("override", ["on dp=1: optimizer sgd lr=0.2 momentum=0.9",
                                      "on tp=1: optimizer sgd lr=0.1 momentum=0.5"])
def test_another_hyper_parameter_differs_at_the_override(tmp_path: Path,
                                                         override: str) -> None:
    path = write(tmp_path, MLP + override + "\n")
    result = simulate_file(path)
    assert not result.agrees and result.max_rel_error > 1e-3
    axis, k = override.split()[1].rstrip(":").split("=")
    # the override's recipe itself (a logical value, no rank), then its ranks' values
    assert [m.rank for m in result.mismatches if m.check == "optimizer recipe"] == [-1]
    wrong = {m.rank for m in result.mismatches if m.check != "optimizer recipe"}
    program = api.build_programs(path, shrink=False).program
    from trainverify_dsl.ir.mesh import MeshGroups

    mesh = MeshGroups(program.mesh)  # an axis only the override names is simulated too
    assert axis in dict(program.mesh)
    assert wrong == {r for r in range(mesh.world_size) if mesh.coords(r)[axis] == int(k)}
    assert {m.span.line for m in result.mismatches} == {9}
    verdict = check_file(path)
    assert verdict.verdict == COUNTEREXAMPLE
    assert verdict.counterexample is not None and verdict.counterexample.span.line == 9


def test_under_zero_the_gathered_block_reaches_every_rank() -> None:
    path = ROOT / "plans" / "bugs" / "optimizer_lr_on_one_rank.tvp"
    result = simulate_file(path)
    assert not result.agrees
    assert {m.rank for m in result.mismatches if m.check != "optimizer recipe"} == {0, 1, 2, 3}
    assert result.first is not None and result.first.rank in (-1, 2)
    override = next(n for n, text in enumerate(path.read_text().splitlines(), 1)
                    if text.startswith("on dp=1, zp=0:"))
    assert result.first.span.line == override  # the override, before the copies it reaches


def test_the_program_carries_the_overrides_update_graphs(tmp_path: Path) -> None:
    path = write(tmp_path, MLP + "on dp=1: optimizer sgd lr=0.2 momentum=0.9\n")
    program = api.build_programs(path, shrink=False).program
    assert not parallel_problems(program)
    opt = program.optimizer
    assert opt is not None
    (override,) = opt.overrides
    assert override.coords == (("dp", 1),)
    assert {p for p, _ in override.graphs} == {u.param for u in opt.updates}
    assert opt.override_for({"dp": 1, "tp": 0}) is override
    assert opt.override_for({"dp": 0, "tp": 1}) is None
    assert "  on dp=1: sgd lr=1/5 momentum=9/10  @ 9:1" in \
        format_parallel(program, graphs=False).splitlines()


@pytest.mark.parametrize(("line", "code", "col"), [
    ("on dp=2: optimizer sgd lr=0.2 momentum=0.9", "TVP249", 4),
    ("on dp=1: optimizer adamw lr=0.2", "TVP249", 20),
    ("on dp=1, dp=0: optimizer sgd lr=0.2", "TVP230", 10),
    ("on zz=1: optimizer sgd lr=0.2", "TVP207", 4),
    ("on dp=1: optimizer sgd lr=0.2 shard over dp", "TVP249", 1),
    ("on dp=1: optimizer sgd lr=0.2 foo=1", "TVP253", 31),
    ("on dp=1/2: optimizer sgd lr=0.2", "TVP249", 4),
    # momentum 0 has no momentum buffer: turning it off is another set of states
    ("on dp=1: optimizer sgd lr=0.1 momentum=0", "TVP249", 1),
])
def test_a_malformed_override_is_a_lint_error_at_it(tmp_path: Path, line: str, code: str,
                                                    col: int) -> None:
    path = write(tmp_path, MLP + line + "\n")
    errors = [d for d in resolve_file(path, project_root=ROOT).diagnostics
              if d.severity == "error"]
    assert [(d.code.id, d.span.line, d.span.col) for d in errors] == [(code, 9, col)]


def test_turning_momentum_on_at_an_override_is_a_lint_error(tmp_path: Path) -> None:
    path = write(tmp_path, MLP.replace(" momentum=0.9", "") +
                 "on dp=1: optimizer sgd momentum=0.9\n")
    errors = [d for d in resolve_file(path, project_root=ROOT).diagnostics
              if d.severity == "error"]
    assert [(d.code.id, d.span.line) for d in errors] == [("TVP249", 9)]
    assert "momentum on" in errors[0].message
    # before: an internal error (an update graph with other inputs) in simulate and check
    assert api.check(path).verdict == "error"


def test_a_difference_below_the_tolerance_still_differs_at_the_override(
        tmp_path: Path) -> None:
    """Adam's eps changed on one rank moves the update by far less than the comparison's
    tolerance at these values; the recipe of every override is compared with the spec's, so
    the plan still differs (it agreed before), at the override, and check gives a
    counterexample there (it was inconclusive)."""
    text = MLP.replace("sgd lr=0.1 momentum=0.9", "adam lr=0.001 eps=1e-8")
    path = write(tmp_path, text + "on dp=1, tp=1: optimizer adam eps=1e-6\n")
    result = simulate_file(path)
    assert not result.agrees
    assert {m.span.line for m in result.mismatches} == {9}
    assert any("eps=1e-06" in m.detail for m in result.mismatches)
    verdict = check_file(path)
    assert verdict.verdict == COUNTEREXAMPLE
    assert verdict.counterexample is not None and verdict.counterexample.span.line == 9
    # the same override restating the spec's eps agrees
    same = write(tmp_path, text + "on dp=1, tp=1: optimizer adam eps=1e-8\n", "same.tvp")
    assert simulate_file(same).agrees


def test_two_overrides_on_one_rank_and_no_plan_wide_optimizer(tmp_path: Path) -> None:
    two = write(tmp_path, MLP + "on dp=1: optimizer sgd lr=0.2\non tp=0: optimizer sgd lr=0.3\n")
    errors = [d for d in resolve_file(two, project_root=ROOT).diagnostics
              if d.severity == "error"]
    assert [(d.code.id, d.span.line) for d in errors] == [("TVP249", 10)]
    # disjoint ranks are fine
    apart = write(tmp_path, MLP + "on dp=1: optimizer sgd lr=0.2\non dp=0, tp=1: optimizer sgd "
                  "lr=0.3\n", "apart.tvp")
    assert not [d for d in resolve_file(apart, project_root=ROOT).diagnostics
                if d.severity == "error"]
    without = MLP.removesuffix("optimizer sgd lr=0.1 momentum=0.9\n")
    none = write(tmp_path, without + "on dp=1: optimizer sgd lr=0.2\n", "none.tvp")
    errors = [d for d in resolve_file(none, project_root=ROOT).diagnostics
              if d.severity == "error"]
    # the override has nothing to override, and the spec's recipe nothing implementing it
    assert sorted(d.code.id for d in errors) == ["TVP249", "TVP280"]


def test_the_statement_formats_and_the_oracle_refuses_it(tmp_path: Path) -> None:
    assert format_source("on  dp=1 ,tp=0 :optimizer sgd   lr=0.2\n").text == \
        "on dp=1, tp=0: optimizer sgd lr=0.2\n"
    path = write(tmp_path, MLP + "on dp=1: optimizer sgd lr=0.2 momentum=0.9\n")
    with pytest.raises(OracleError, match="per-rank overrides"):
        run_distributed(path)


def test_an_override_in_a_template_takes_the_templates_arguments(tmp_path: Path) -> None:
    """`template o(x, ax=dp): on ax=1: optimizer sgd lr=x ...`: the override's axis and
    values stayed the parameter names (TVP207 "unknown mesh axis 'ax'", TVP225 "unknown
    name 'x'"), while every other statement of a template is substituted."""
    template = ("template o(x, ax=dp):\n"
                "    on ax=1: optimizer sgd lr=x momentum=0.9\n")
    same = write(tmp_path, MLP + template + "apply o(0.1)\n")
    assert api.layout_diagnostics(same) == []
    assert simulate_file(same).agrees
    other = write(tmp_path, MLP + template + "apply o(0.2, tp)\n", "other.tvp")
    result = simulate_file(other)
    assert not result.agrees
    program = api.build_programs(other, shrink=False).program
    from trainverify_dsl.ir.mesh import MeshGroups

    mesh = MeshGroups(program.mesh)
    wrong = {m.rank for m in result.mismatches if m.check != "optimizer recipe"}
    assert wrong == {r for r in range(mesh.world_size) if mesh.coords(r)["tp"] == 1}
    twice = write(tmp_path, MLP + template + "apply o(0.1)\napply o(0.2)\n", "twice.tvp")
    assert [d.code.id for d in api.layout_diagnostics(twice)] == ["TVP249"]
