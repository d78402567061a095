"""Robustness and scale: random ASTs never make the resolver raise; lint imports no torch/z3;
a large plan resolves; the golden plan files, checked by a self-contained reader."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_plan_support import HEAD, parse_text, text_loader

from trainverify_dsl.parse import ast
from trainverify_dsl.plan import lint_file, plan_to_dict, resolve_plan_file
from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.span import Span

ROOT = Path(__file__).resolve().parent.parent
SPAN = Span("random.tvp", 1, 1, 1, 2)

# ---------------------------------------------------------------- random ASTs

words = st.sampled_from(["dp", "tp", "pp", "cp", "ep", "m", "l", "axis", "layers", "tokens",
                         "labels", "params", "embed", "w", "out", "in", "sum", "avg", "t0",
                         "t1", "microbatches", "batch", "seq", "x"])
idents = words.map(lambda w: ast.Ident(w, SPAN))
nums = st.fractions(min_value=-3, max_value=40, max_denominator=4).map(
    lambda f: ast.Num(f, str(f), SPAN))
exprs = st.recursive(
    nums | words.map(lambda w: ast.NameRef(w, SPAN)),
    lambda inner: st.builds(ast.BinOp, st.sampled_from("+-*/"), inner, inner, st.just(SPAN))
    | st.builds(ast.Neg, inner, st.just(SPAN)),
    max_leaves=6)
segments = st.one_of(
    words.map(lambda w: ast.Name(w, SPAN)),
    st.integers(0, 40).map(lambda i: ast.Index(i, SPAN)),
    st.builds(ast.Slice, st.none() | st.integers(-4, 40), st.none() | st.integers(-4, 40),
              st.none() | st.integers(-2, 3), st.just(SPAN)),
    st.sampled_from(["*", "w*", "?"]).map(lambda g: ast.Glob(g, SPAN)))
paths = st.builds(ast.Path, st.tuples(words.map(lambda w: ast.Name(w, SPAN)))
                  .flatmap(lambda head: st.lists(segments, max_size=3)
                           .map(lambda rest: head + tuple(rest))), st.just(SPAN))
targets = paths | st.builds(ast.GradRef, paths, st.just(SPAN))
values = exprs | paths | st.builds(ast.TupleValue, st.lists(exprs, max_size=3).map(tuple),
                                   st.just(SPAN))
option_keys = st.sampled_from(["op", "dim", "split-dim", "concat-dim", "lr", "betas", "eps",
                               "weight-decay", "momentum", "norm-type", "x", "axis", "m"])
options = st.lists(st.builds(ast.Option, option_keys.map(lambda k: ast.Ident(k, SPAN)), values,
                             st.just(SPAN)), max_size=3).map(tuple)
axes = st.lists(idents, max_size=3).map(tuple)
placements = st.builds(ast.Placement, st.sampled_from(["shard", "replicate", "partial"]),
                       st.none() | st.integers(0, 3), st.none() | idents, st.none() | idents,
                       st.just(SPAN))


def leaf_statements():
    return st.one_of(
        st.builds(ast.MeshDecl, st.lists(st.builds(ast.MeshAxis, idents, exprs, st.just(SPAN)),
                                         max_size=4).map(tuple), st.just(SPAN)),
        st.builds(ast.SplitStmt, targets, st.lists(st.builds(ast.DimEntry, axes, st.just(SPAN)),
                                                   max_size=4).map(tuple), st.just(SPAN)),
        st.builds(ast.ReplicateStmt, targets, axes, st.just(SPAN)),
        st.builds(ast.PartialStmt, targets, axes, options, st.just(SPAN)),
        st.builds(ast.PlaceStmt, targets, st.lists(placements, max_size=4).map(tuple),
                  st.just(SPAN)),
        st.builds(ast.CollectiveStmt, st.sampled_from(ast.COLLECTIVE_KINDS), st.just(SPAN),
                  targets, axes, options, st.none() | idents, st.just(SPAN)),
        st.builds(ast.SendStmt, targets, exprs, exprs, st.just(SPAN)),
        st.builds(ast.PipelineStageStmt, exprs, st.lists(paths, max_size=3).map(tuple),
                  st.just(SPAN)),
        st.builds(ast.MicrobatchesDecl, exprs, st.none() | idents, st.just(SPAN)),
        st.builds(ast.LossScaleDecl, exprs, st.just(SPAN)),
        st.builds(ast.OptimizerDecl, idents, options, axes, st.just(SPAN)),
        st.builds(ast.ClipGradNormDecl, exprs, options, st.just(SPAN)),
        st.builds(ast.AlgorithmStmt, idents, st.lists(targets, max_size=2).map(tuple), axes,
                  options, st.just(SPAN)),
        st.builds(ast.ApplyStmt, st.sampled_from(["t0", "t1", "t2"]).map(
            lambda n: ast.Ident(n, SPAN)), st.lists(values, max_size=3).map(tuple), options,
            st.just(SPAN)),
        st.builds(ast.UseDecl, st.sampled_from(["missing.tvp", "../../x.tvp", "/etc/hosts"]),
                  st.just(SPAN), st.just(SPAN)),
        st.builds(ast.PlanHeader, idents, st.just(SPAN)),
    )


statements = st.recursive(
    leaf_statements(),
    lambda inner: st.builds(ast.ForStmt, idents, st.lists(paths, min_size=1, max_size=2)
                            .map(tuple), st.lists(inner, max_size=3).map(tuple), st.just(SPAN))
    | st.builds(ast.TemplateDef, st.sampled_from(["t0", "t1", "t2"]).map(
        lambda n: ast.Ident(n, SPAN)), st.lists(st.builds(
            ast.Param, idents, st.none() | values, st.just(SPAN)), max_size=3).map(tuple),
        st.lists(inner, max_size=3).map(tuple), st.just(SPAN)),
    max_leaves=12)


PRELUDE = parse_text(HEAD + "mesh pp=2, dp=2, tp=2\nmicrobatches 2\n")[0].statements


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans(), st.lists(statements, max_size=10))
def test_random_asts_resolve_without_raising(with_mesh: bool, body: list) -> None:
    """Half the plans start with a valid header, so later checks see a mesh too."""
    prelude = PRELUDE if with_mesh else ()
    plan_file = ast.PlanFile("random.tvp", prelude + tuple(body), (), SPAN)
    result = resolve_plan_file(plan_file, loader=text_loader)
    assert all(isinstance(d, Diagnostic) for d in result.diagnostics)
    if result.plan is not None:
        json.dumps(plan_to_dict(result.plan))


# ---------------------------------------------------------------- no torch, no z3


def test_lint_imports_neither_torch_nor_z3() -> None:
    code = ("import sys\nimport trainverify_dsl.plan as p\n"
            "p.lint_file('tests/golden/plan/clean.tvp')\n"
            "bad = [m for m in ('torch', 'z3') if m in sys.modules]\n"
            "assert not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- scale


def big_plan(layers: int) -> str:
    """About 10 lines per layer: explicit per-layer statements (no loop shortcut)."""
    lines = [HEAD.rstrip("\n"), "mesh pp=4, dp=4, tp=8", "microbatches 2",
             "loss-scale 1/microbatches",
             "template col(m, axis=tp):", "    split m.weight [axis, -]", "    copy m.in over axis",
             "template row(m, axis=tp):", "    split m.weight [-, axis]",
             "    all-reduce m.out over axis"]
    for i in range(layers):
        lines += [f"apply col(layers.{i}.attention.wq)", f"apply col(layers.{i}.attention.wk)",
                  f"apply col(layers.{i}.attention.wv)", f"apply row(layers.{i}.attention.wo)",
                  f"apply col(layers.{i}.feed_forward.w1)",
                  f"apply col(layers.{i}.feed_forward.w3)",
                  f"apply row(layers.{i}.feed_forward.w2)",
                  f"replicate layers.{i}.attention_norm.weight over tp",
                  f"replicate layers.{i}.ffn_norm.weight over tp",
                  f"split layers.{i}.attention.wo.out [dp, -, -]"]
    quarter = layers // 4
    lines += [f"pipeline-stage {k}: layers[{k * quarter}:{(k + 1) * quarter}]" for k in range(4)]
    return "\n".join(lines) + "\nall-reduce grad(params) over dp op=avg\n"


def test_large_plan_resolves() -> None:
    """200 layers (2,000 lines) here; the 10,000-line timing (``big_plan(1000)``) is measured
    by hand, not asserted."""
    text = big_plan(200)
    assert text.count("\n") >= 2_000
    plan_file, syntax = parse_text(text)
    assert syntax == ()
    result = resolve_plan_file(plan_file)
    assert result.diagnostics == ()
    assert len(result.plan.layouts) == 2_000
    assert len(result.plan.collectives) == 1401
    assert [str(s.members[0]) for s in result.plan.stages][-1] == "layers[150:200]"
    assert result.plan.loss_scale == Fraction(1, 2)


# ---------------------------------------------------------------- golden files, own reader

EXPECT = re.compile(r"#\s*([EW]):\s*(.*?)\s*\[(TVP\d{3})\]")


def test_golden_plan_files_match_their_annotations() -> None:
    files = sorted((ROOT / "tests" / "golden" / "plan").glob("*.tvp"))
    assert len(files) >= 5
    for path in files:
        expected = []
        for number, line in enumerate(path.read_text().split("\n"), start=1):
            expected += [(number, kind, code, text) for kind, text, code in EXPECT.findall(line)]
        found = lint_file(path)
        for d in found:
            kind = "E" if d.severity == "error" else "W"
            match = next((e for e in expected if e[:3] == (d.span.line, kind, d.code.id)
                          and e[3] in d.message), None)
            assert match is not None, f"{path.name}: unexpected {d.span} {d.message}"
            expected.remove(match)
        assert expected == [], f"{path.name}: missing {expected}"
