"""Resolution: use imports, template expansion, loop unrolling, exact expressions, trails."""

from __future__ import annotations

import os
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest
from test_plan_support import (
    HEAD,
    codes_of,
    lint_files,
    parse_text,
    resolve_text,
    text_loader,
)

from trainverify_dsl.plan import lint_file, resolve_file, resolve_plan_file
from trainverify_dsl.plan.expand import MAX_DEPTH
from trainverify_dsl.plan.model import Partial, Shard
from trainverify_dsl.report.codes_plan import (
    DIVISION_BY_ZERO,
    EXPANSION_LIMIT,
    MISSING_PLAN_HEADER,
    PLAN_HEADER_IN_FRAGMENT,
    TEMPLATE_ARGUMENT_KIND,
    TEMPLATE_RECURSION,
    UNKNOWN_NAME,
    USE_CYCLE,
    USE_NOT_FOUND,
    USE_OUTSIDE_ROOT,
)

MESH = "mesh pp=2, dp=2, tp=4\n"


def targets(result, kind: str = "layouts") -> list[str]:
    return [str(item.target) for item in getattr(result.plan, kind)]


# ---------------------------------------------------------------- loops


def test_for_over_a_list_becomes_a_glob_pattern() -> None:
    result = resolve_text(MESH + "for l in layers:\n    split l.attention.wq.weight [tp, -]\n")
    assert result.ok
    assert targets(result) == ["layers.*.attention.wq.weight"]
    origin = result.plan.layouts[0].origins[0]
    assert [(s.kind, s.name) for s in origin.trail] == [("for", "l")]


def test_for_over_slices_and_nested_loops() -> None:
    result = resolve_text(MESH + "for l in layers[0:8], layers[16:24]:\n"
                                 "    for e in l.experts:\n"
                                 "        split e.w1.weight [tp, -]\n")
    assert result.ok
    assert targets(result) == ["layers[0:8].experts.*.w1.weight",
                               "layers[16:24].experts.*.w1.weight"]


def test_loop_variable_is_scoped_to_its_body() -> None:
    result = resolve_text(MESH + "for l in layers:\n    split l.w [tp, -]\nsplit l.w [tp, -]\n")
    assert targets(result) == ["layers.*.w", "l.w"]


# ---------------------------------------------------------------- templates


TEMPLATES = ("template col(m, axis=tp):\n    split m.weight [axis, -]\n    copy m.in over axis\n"
             "template scaled(s=1/2):\n    loss-scale s * 2\n")


def test_template_arguments_by_position_keyword_and_default() -> None:
    result = resolve_text(MESH + TEMPLATES + "apply col(a, dp)\napply col(m=b, axis=tp)\n"
                          "apply col(c)\n")
    assert result.ok, result.diagnostics
    placements = {str(x.target): dict(x.placements) for x in result.plan.layouts}
    assert placements["a.weight"]["dp"] == Shard(0)
    assert placements["b.weight"]["tp"] == Shard(0)
    assert placements["c.weight"]["tp"] == Shard(0)
    assert [c.axes for c in result.plan.collectives] == [("dp",), ("tp",), ("tp",)]


def test_number_argument_substitutes_into_expressions() -> None:
    result = resolve_text(MESH + TEMPLATES + "apply scaled(1/8)\n")
    assert result.ok
    assert result.plan.loss_scale == Fraction(1, 4)
    assert resolve_text(MESH + TEMPLATES + "apply scaled()\n").plan.loss_scale == 1


def test_template_inside_loop_records_both_sites() -> None:
    result = resolve_text(MESH + TEMPLATES + "for l in layers:\n    apply col(l.wq)\n")
    origin = result.plan.layouts[0].origins[0]
    assert [(s.kind, s.name) for s in origin.trail] == [("for", "l"), ("apply", "col")]
    assert origin.report_span.line == origin.trail[1].span.line
    assert origin.span.line != origin.report_span.line


def test_diagnostic_in_template_is_reported_at_the_apply_site_with_a_trail() -> None:
    result = resolve_text(MESH + TEMPLATES + "apply col(l.wq, tq)\n")
    (diagnostic,) = [d for d in result.diagnostics if d.code.id == "TVP207"][:1]
    assert diagnostic.span.line == 9
    assert any("in template col, applied at main.tvp:9:1" in n for n in diagnostic.notes)
    assert any(n.startswith("the statement is at main.tvp:5:") for n in diagnostic.notes)
    assert "did you mean 'tp'?" in diagnostic.message


@pytest.mark.parametrize("call", ["apply col(a, 2)", "apply col(a, x.y)"])
def test_axis_parameter_bound_to_a_non_name_is_reported(call: str) -> None:
    result = resolve_text(MESH + TEMPLATES + call + "\n")
    assert TEMPLATE_ARGUMENT_KIND.id in codes_of(result)


def test_mutual_recursion_is_a_diagnostic_with_the_chain() -> None:
    result = resolve_text(MESH + "template a(m):\n    apply b(m)\n"
                          "template b(m):\n    apply a(m.x)\napply a(top)\n")
    (diagnostic,) = [d for d in result.diagnostics if d.code is TEMPLATE_RECURSION]
    assert "expansion chain: a -> b -> a" in diagnostic.notes


def test_exponential_expansion_stops_with_a_diagnostic() -> None:
    result = resolve_text(EXPANSION_LIMIT.example, head="")
    assert codes_of(result) == [EXPANSION_LIMIT.id]
    assert result.plan is None


def test_a_long_flat_plan_is_not_told_to_reduce_nesting(monkeypatch) -> None:
    """The work limit on a plan with no template or loop at all: the help says what to do
    about many statements, not about nesting (it said "reduce nested templates and loops")."""
    import trainverify_dsl.plan.expand as expand

    monkeypatch.setattr(expand, "MAX_WORK", 20)
    flat = "".join(f"split w{i} [tp, -]\n" for i in range(30))
    result = resolve_text(MESH + flat)
    (diagnostic,) = [d for d in result.diagnostics if d.code is EXPANSION_LIMIT]
    assert "more than 20 expansion steps" in diagnostic.message
    assert "nested" not in (diagnostic.help or "") and "template" in (diagnostic.help or "")


def test_deep_loop_nesting_is_bounded() -> None:
    """Built as an AST: the parser itself refuses such nesting before the resolver sees it."""
    plan_file, _ = parse_text(HEAD + MESH + "for v in layers:\n    split v.w [tp, -]\n")
    loop = plan_file.statements[-1]
    for _ in range(MAX_DEPTH + 50):
        loop = replace(loop, body=(loop,))
    deep = replace(plan_file, statements=plan_file.statements[:-1] + (loop,))
    result = resolve_plan_file(deep)
    assert codes_of(result) == [EXPANSION_LIMIT.id]
    assert "nested" in (result.diagnostics[0].help or "")
    shallow = replace(plan_file, statements=plan_file.statements[:-1] + (
        replace(loop, body=(plan_file.statements[-1],)),))
    assert resolve_plan_file(shallow).ok


# ---------------------------------------------------------------- expressions


def test_expressions_are_exact_over_header_names() -> None:
    result = resolve_text(MESH + "microbatches 3\nloss-scale (1 + 2) / (microbatches * tp) + "
                          "batch / 16 - seq * 0\n")
    assert result.ok
    assert result.plan.loss_scale == Fraction(3, 4)


def test_division_by_zero_and_unknown_names_are_diagnostics() -> None:
    assert DIVISION_BY_ZERO.id in codes_of(resolve_text(MESH + "loss-scale 1/(tp - 4)\n"))
    result = resolve_text(MESH + "loss-scale 1/microbatchs\n")
    (diagnostic,) = result.diagnostics
    assert diagnostic.code is UNKNOWN_NAME
    assert "did you mean 'microbatches'?" in diagnostic.message
    assert result.plan.loss_scale == 1


def test_deep_expression_does_not_overflow() -> None:
    text = MESH + "loss-scale " + "(" * 150 + "1" + ")" * 150 + "\n"
    result = resolve_text(text)
    assert result.plan.loss_scale == 1


# ---------------------------------------------------------------- use


def test_use_relative_then_project_root_and_once(tmp_path: Path) -> None:
    files = {
        "main.tvp": HEAD + MESH + 'use "lib/a.tvp"\nuse "lib/a.tvp"\napply col(x)\n',
        "lib/a.tvp": 'use "b.tvp"\ntemplate col(m):\n    split m.w [tp, -]\n',
        "lib/b.tvp": "split b.w [dp, -]\n",
    }
    assert lint_files(tmp_path, files) == ()
    result = resolve_file(tmp_path / "main.tvp", loader=text_loader)
    assert targets(result) == ["b.w", "x.w"]
    assert [Path(f).name for f in result.plan.files] == ["main.tvp", "a.tvp", "b.tvp"]
    trail = result.plan.layouts[0].origins[0].trail
    assert [s.kind for s in trail] == ["use", "use"]


def test_use_cycle_reports_the_chain(tmp_path: Path) -> None:
    files = {"main.tvp": HEAD + MESH + 'use "a.tvp"\n', "a.tvp": 'use "b.tvp"\n',
             "b.tvp": 'use "a.tvp"\n'}
    diagnostics = lint_files(tmp_path, files)
    (cycle,) = [d for d in diagnostics if d.code is USE_CYCLE]
    assert Path(cycle.span.file).name == "b.tvp"
    assert any("main.tvp -> " in n and n.endswith("a.tvp") for n in cycle.notes), cycle.notes


def test_use_missing_and_escaping_paths(tmp_path: Path) -> None:
    outside = tmp_path / "outside.tvp"
    outside.write_text("split x [tp]\n")
    project = tmp_path / "project"
    (project / "plans").mkdir(parents=True)
    os.symlink(outside, project / "plans" / "link.tvp")
    files = {"plans/main.tvp": HEAD + MESH + 'use "nope.tvp"\nuse "../../outside.tvp"\n'
             'use "link.tvp"\n'}
    for name, text in files.items():
        (project / name).write_text(text)
    result = resolve_file(project / "plans" / "main.tvp", project_root=project,
                          loader=text_loader)
    assert codes_of(result) == [USE_NOT_FOUND.id, USE_OUTSIDE_ROOT.id, USE_OUTSIDE_ROOT.id]


def test_plan_header_rules(tmp_path: Path) -> None:
    files = {"main.tvp": HEAD + MESH + 'use "frag.tvp"\n', "frag.tvp": "plan other\n"}
    diagnostics = lint_files(tmp_path, files)
    assert codes_of(diagnostics) == [PLAN_HEADER_IN_FRAGMENT.id]
    assert Path(diagnostics[0].span.file).name == "frag.tvp"
    alone = lint_files(tmp_path, {"frag2.tvp": MESH}, main="frag2.tvp")
    assert codes_of(alone) == [MISSING_PLAN_HEADER.id]


def test_lint_file_reports_a_missing_file_and_syntax_errors(tmp_path: Path) -> None:
    (missing,) = lint_file(tmp_path / "nope.tvp")
    assert missing.code.name == "unreadable-file" and "cannot read" in missing.message
    binary = tmp_path / "binary.tvp"
    binary.write_bytes(HEAD.encode() + b"mesh dp=2\nsplit tokens [dq, -]  # \xff\n")
    assert {d.code.name for d in lint_file(binary)} == {"unreadable-file", "unknown-mesh-axis"}
    bad = tmp_path / "bad.tvp"
    bad.write_text(HEAD + MESH + "split tokens [dp, -\nsplit labels [dq, -]\n")
    found = lint_file(bad)
    assert any(d.code.id.startswith("TVP1") for d in found)
    assert "TVP207" in codes_of(found)
    assert list(found) == sorted(found, key=lambda d: (d.span.line, d.span.col, d.code.id))


def test_partial_layout_and_ops() -> None:
    result = resolve_text(MESH + "partial x.out over tp, dp op=avg\n")
    assert dict(result.plan.layouts[0].placements)["dp"] == Partial("avg")


def test_template_parameters_reach_mesh_sizes_and_words() -> None:
    result = resolve_text("template setup(n, sched, back):\n    mesh dp=n, tp=2\n"
                          "    microbatches n * 2 schedule sched\n"
                          "    copy x over tp backward back\n"
                          "apply setup(4, gpipe, identity)\n")
    assert result.ok, result.diagnostics
    assert result.plan.mesh.shape == (4, 2)
    assert (result.plan.microbatches, result.plan.schedule) == (8, "gpipe")
    assert result.plan.collectives[0].backward == "identity"
    assert result.plan.collectives[0].backward_stated


def test_a_library_file_lints_alone_but_a_headerless_plan_does_not(tmp_path: Path) -> None:
    library = "template col(m, axis=tp):\n    split m.weight [axis, -]\n"
    assert lint_files(tmp_path, {"lib.tvp": library}, main="lib.tvp") == ()
    headerless = lint_files(tmp_path, {"p.tvp": "spec \"m.py:M\"\n" + library}, main="p.tvp")
    assert codes_of(headerless) == [MISSING_PLAN_HEADER.id]


def test_resolving_pauses_the_garbage_collector_and_restores_it(tmp_path: Path) -> None:
    """The collector is off while a plan resolves (speed: bench/lint_bench.py) and back in
    its previous state after, also when it was off, also when resolution fails; the AST and
    the plan leave no reference cycles behind for it."""
    import gc

    from trainverify_dsl.plan.resolve import collector_paused

    seen = []
    with collector_paused():
        seen.append(gc.isenabled())
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("boom")
    assert gc.isenabled()
    plan = tmp_path / "p.tvp"
    plan.write_text(HEAD + "split tokens [dp, -]\nfor l in layers[0:2]:\n    replicate l\n",
                    encoding="utf-8")
    gc.collect()
    resolve_file(plan)
    assert gc.isenabled() and gc.collect() == 0
