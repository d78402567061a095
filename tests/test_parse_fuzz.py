"""Property tests: any input gives diagnostics, never an exception; clean parses round-trip."""

from fractions import Fraction
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainverify_dsl.parse import ast, format_plan, format_source, parse_source
from trainverify_dsl.parse.ast import strip_spans
from trainverify_dsl.report import codes_syntax
from trainverify_dsl.report.span import NO_SPAN

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
SYNTAX_IDS = {code.id for code in codes_syntax.CODES}
CLEAN_PLAN = (Path(__file__).parent / "golden" / "syntax" / "clean.tvp").read_text(
    encoding="utf-8")

TOKENS = [
    "plan", "spec", "mesh", "microbatches", "loss-scale", "loss-reduction", "use", "split",
    "replicate",
    "partial", "place", "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "copy",
    "scatter", "send", "pipeline-stage", "optimizer", "clip-grad-norm", "on", "algorithm",
    "template", "apply", "for", "in", "over", "from", "to", "backward", "schedule", "shard",
    "grad", "dp", "tp", "layers", "l", "x", "weight-decay", "1f1b", "interleaved-1f1b",
    "S", "R", "P", "Shard", "sum", "avg", "identity", "*", "w*", "?", "0", "8", "3e-4",
    "0.5", "1_000", '"a.tvp"', "[", "]", "(", ")", ",", ":", ".", "=", "-", "+", "/",
    "[0:8]", "[3]", "[::2]", "#", "# note", "\n", "\n    ", "\n        ", "\t", "\r\n", " ",
]


def check_result(text: str) -> None:
    """The invariants every parse must keep, whatever the input."""
    result = parse_source(text, "fuzz.tvp")
    assert result.plan_file is not None
    for diagnostic in result.diagnostics:
        assert diagnostic.code.id in SYNTAX_IDS
        assert "internal error" not in diagnostic.message
        assert diagnostic.span.file == "fuzz.tvp"
        # Lines end at LF, CRLF or a lone CR (as Python reads text files).
        assert 1 <= diagnostic.span.line <= len(text.splitlines()) + 2
    formatted = format_source(text).text
    if formatted is not None:
        assert result.ok
        assert format_source(formatted).text == formatted
        again = parse_source(formatted).plan_file
        assert strip_spans(again) == strip_spans(result.plan_file)


@SETTINGS
@given(st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join))
def test_token_soup(text):
    check_result(text)


@SETTINGS
@given(st.lists(st.sampled_from(TOKENS), max_size=40).map("".join))
def test_token_soup_without_spaces(text):
    check_result(text)


@settings(SETTINGS, max_examples=100)
@given(st.integers(min_value=0, max_value=len(CLEAN_PLAN)))
def test_truncated_plans(cut):
    check_result(CLEAN_PLAN[:cut])


@SETTINGS
@given(st.integers(min_value=0, max_value=len(CLEAN_PLAN)), st.text(max_size=5))
def test_plans_with_inserted_text(position, insert):
    check_result(CLEAN_PLAN[:position] + insert + CLEAN_PLAN[position:])


@SETTINGS
@given(st.text(max_size=200))
def test_random_unicode_text(text):
    check_result(text)


@SETTINGS
@given(st.integers(min_value=0, max_value=10 ** 1200), st.integers(-2000, 2000))
def test_huge_numbers_are_exact_or_refused(mantissa, exponent):
    text = f"loss-scale {mantissa}e{exponent}"
    result = parse_source(text)
    if result.ok:
        value = result.plan_file.statements[0].value.value
        assert value == Fraction(mantissa) * Fraction(10) ** exponent
    else:
        assert [d.code.id for d in result.diagnostics] == ["TVP113"]


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=1, max_value=1500), st.sampled_from(["(", "-", "(1+", "-("]))
def test_deep_nesting_never_raises(depth, opener):
    closer = ")" * (depth * opener.count("("))
    check_result("loss-scale " + opener * depth + "1" + closer)


# ---------------------------------------------------------------- generated ASTs round-trip

NAMES = st.sampled_from(["dp", "tp", "x", "layers", "wq", "attention", "a_b", "w1", "S0"])
WORDS = st.sampled_from(["avg", "sum", "1f1b", "interleaved-1f1b", "weight-decay", "adamw"])
NUMBER_TEXTS = st.sampled_from(["0", "1", "16", "1_000", "0.5", "3e-4", "2E3", "1.5e+2"])


def _ident(name: str) -> ast.Ident:
    return ast.Ident(name, NO_SPAN)


def _num(text: str) -> ast.Num:
    return parse_source(f"loss-scale {text}").plan_file.statements[0].value


EXPRS = st.recursive(
    st.one_of(NUMBER_TEXTS.map(_num), NAMES.map(lambda n: ast.NameRef(n, NO_SPAN))),
    lambda inner: st.one_of(
        st.builds(lambda op, a, b: ast.BinOp(op, a, b, NO_SPAN),
                  st.sampled_from("+-*/"), inner, inner),
        inner.map(lambda e: ast.Neg(e, NO_SPAN))),
    max_leaves=8)
SEGMENTS = st.one_of(
    NAMES.map(lambda n: ast.Name(n, NO_SPAN)),
    st.sampled_from(["*", "w*", "*_proj", "?"]).map(lambda p: ast.Glob(p, NO_SPAN)),
    st.integers(0, 40).map(lambda i: ast.Index(i, NO_SPAN)),
    st.tuples(st.none() | st.integers(-3, 9), st.none() | st.integers(-3, 9),
              st.none() | st.integers(1, 3)).map(lambda t: ast.Slice(*t, NO_SPAN)))
PATHS = st.builds(lambda head, rest: ast.Path((ast.Name(head, NO_SPAN), *rest), NO_SPAN),
                  NAMES, st.lists(SEGMENTS, max_size=3))
TARGETS = PATHS | PATHS.map(lambda p: ast.GradRef(p, NO_SPAN))
AXES = st.lists(NAMES, min_size=1, max_size=3).map(lambda ns: tuple(_ident(n) for n in ns))
OPTIONS = st.lists(st.builds(lambda k, v: ast.Option(_ident(k), v, NO_SPAN),
                             st.sampled_from(["op", "dim", "split-dim", "lr"]), EXPRS),
                   max_size=2).map(tuple)
STATEMENTS = st.one_of(
    st.builds(lambda t, d: ast.SplitStmt(t, d, NO_SPAN), TARGETS, st.lists(
        st.lists(NAMES, max_size=2).map(
            lambda ns: ast.DimEntry(tuple(_ident(n) for n in ns), NO_SPAN)),
        min_size=1, max_size=3).map(tuple)),
    st.builds(lambda t, a: ast.ReplicateStmt(t, a, NO_SPAN), TARGETS, AXES | st.just(())),
    st.builds(lambda k, t, a, o, b: ast.CollectiveStmt(k, NO_SPAN, t, a, o, b, NO_SPAN),
              st.sampled_from(ast.COLLECTIVE_KINDS), TARGETS, AXES, OPTIONS,
              st.none() | WORDS.map(_ident)),
    st.builds(lambda e: ast.LossScaleDecl(e, NO_SPAN), EXPRS),
    st.builds(lambda m: ast.MeshDecl(tuple(ast.MeshAxis(_ident(n), e, NO_SPAN)
                                           for n, e in m), NO_SPAN),
              st.lists(st.tuples(NAMES, EXPRS), min_size=1, max_size=3)),
    st.builds(lambda t, s, d: ast.SendStmt(t, s, d, NO_SPAN), TARGETS, EXPRS, EXPRS),
    st.builds(lambda k, o, a: ast.OptimizerDecl(_ident(k), o, a, NO_SPAN),
              WORDS, OPTIONS, AXES | st.just(())),
)
BLOCKS = st.builds(lambda v, it, body: ast.ForStmt(_ident(v), (it,), tuple(body), NO_SPAN),
                   NAMES, PATHS, st.lists(STATEMENTS, min_size=1, max_size=3))


@SETTINGS
@given(st.lists(STATEMENTS | BLOCKS, max_size=6))
def test_generated_asts_print_and_parse_back(statements):
    plan = ast.PlanFile("", tuple(statements), (), NO_SPAN)
    text = format_plan(plan)
    result = parse_source(text)
    assert result.diagnostics == (), (text, [d.message for d in result.diagnostics])
    assert strip_spans(result.plan_file) == strip_spans(plan)
    assert format_plan(result.plan_file) == text
