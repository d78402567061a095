"""The canonical formatter: exact output, comments kept, idempotence, AST round trip."""

from pathlib import Path

import pytest

from trainverify_dsl.parse import ast, format_plan, format_source, parse_source
from trainverify_dsl.parse.ast import strip_spans
from trainverify_dsl.report.span import NO_SPAN

ROOT = Path(__file__).resolve().parent.parent
GOLDEN_SYNTAX = ROOT / "tests" / "golden" / "syntax"


def fmt(text: str) -> str:
    result = format_source(text)
    assert result.text is not None, [d.message for d in result.diagnostics]
    return result.text


def assert_round_trip(text: str) -> None:
    formatted = fmt(text)
    assert fmt(formatted) == formatted
    before = parse_source(text).plan_file
    after = parse_source(formatted).plan_file
    assert strip_spans(after) == strip_spans(before)
    assert [c.text for c in after.comments] == [c.text for c in before.comments]


MESSY = """\
# header comment
plan   p
mesh pp=2,dp=2 ,  tp=2   # axes
loss-scale   1 /microbatches


split tokens [ dp,- ]
place x [ tp = S( 0 ), dp=Replicate( ), Partial( sum ) ]
all-reduce x over (dp, cp) backward all-reduce op=avg
template t( m , axis = tp ) :
      split m.weight [axis,-]   # inside
      # own line inside
      copy m.in over axis
apply t( l.attention.wq , axis=tp )
for l in layers[0:8] , layers[ 16 : 24 ]:   # loop


    replicate l.norm.weight
    # end of loop body
# back at top level
optimizer adamw lr=3e-4 betas=( 0.9,0.95 ) shard over ( dp )
"""

CANONICAL = """\
# header comment
plan p
mesh pp=2, dp=2, tp=2  # axes
loss-scale 1/microbatches

split tokens [dp, -]
place x [tp=S(0), dp=R, P(sum)]
all-reduce x over dp, cp op=avg backward all-reduce

template t(m, axis=tp):
    split m.weight [axis, -]  # inside
    # own line inside
    copy m.in over axis

apply t(l.attention.wq, axis=tp)

for l in layers[0:8], layers[16:24]:  # loop
    replicate l.norm.weight
    # end of loop body

# back at top level
optimizer adamw lr=3e-4 betas=(0.9, 0.95) shard over dp
"""


def test_messy_file_formats_to_the_canonical_text():
    assert fmt(MESSY) == CANONICAL


def test_canonical_text_is_a_fixed_point():
    assert fmt(CANONICAL) == CANONICAL


def test_messy_file_round_trips():
    assert_round_trip(MESSY)


@pytest.mark.parametrize("source, expected", [
    ("loss-scale (1 + 2)*3", "loss-scale (1 + 2)*3"),
    ("loss-scale 1 - (2 - 3)", "loss-scale 1 - (2 - 3)"),
    ("loss-scale (1 - 2) - 3", "loss-scale 1 - 2 - 3"),
    ("loss-scale ((x))", "loss-scale x"),
    ("loss-scale -(a*b)", "loss-scale -(a*b)"),
    ("loss-scale (-a)*b", "loss-scale -a*b"),
    ("loss-scale a*-b", "loss-scale a*-b"),
    ("loss-scale a/(b/c)", "loss-scale a/(b/c)"),
    ("loss-scale batch-seq", "loss-scale batch - seq"),
    ("loss-scale 1_000 + 3E-4", "loss-scale 1_000 + 3E-4"),
    ("optimizer sgd x=(1,)", "optimizer sgd x=(1,)"),
    ("replicate layers[3].w", "replicate layers.3.w"),
    ("replicate layers[::2]", "replicate layers[::2]"),
    ('use "a\\"b"', 'use "a\\"b"'),
    ("split tokens [dp,zigzag( cp )]", "split tokens [dp, zigzag(cp)]"),
    ("split x [zigzag(dp,cp), -]", "split x [zigzag(dp, cp), -]"),
])
def test_expression_and_literal_printing(source, expected):
    assert fmt(source) == expected + "\n"
    assert_round_trip(source)


def test_block_gets_blank_lines_around_it_but_not_after_a_comment():
    text = "plan p\n# the loop\nfor l in layers:\n    replicate l\nsplit x [dp]\n"
    assert fmt(text) == ("plan p\n# the loop\nfor l in layers:\n    replicate l\n\n"
                         "split x [dp]\n")


def test_comment_only_and_empty_files():
    assert fmt("") == ""
    assert fmt("\n\n# a\n\n\n# b\n") == "# a\n\n# b\n"


def test_crlf_input_gives_lf_output():
    assert fmt("plan p\r\nsplit x [dp]  # c\r\n") == "plan p\nsplit x [dp]  # c\n"


def test_syntax_errors_give_no_text():
    result = format_source("split x [dp\n")
    assert result.text is None and [d.code.id for d in result.diagnostics] == ["TVP127"]


def test_format_plan_on_a_built_ast_without_spans():
    ident = ast.Ident
    plan = ast.PlanFile("", (
        ast.PlanHeader(ident("p", NO_SPAN), NO_SPAN),
        ast.ForStmt(ident("l", NO_SPAN), (ast.Path((ast.Name("layers", NO_SPAN),), NO_SPAN),),
                    (ast.ReplicateStmt(ast.Path((ast.Name("l", NO_SPAN),), NO_SPAN), (),
                                       NO_SPAN),), NO_SPAN),
    ), (), NO_SPAN)
    text = format_plan(plan)
    assert text == "plan p\n\nfor l in layers:\n    replicate l\n"
    assert strip_spans(parse_source(text).plan_file) == strip_spans(plan)


def _repository_plans() -> list[Path]:
    found = sorted(ROOT.glob("plans/**/*.tvp")) + sorted(ROOT.glob("stdlib/*.tvp"))
    clean = [p for p in sorted(GOLDEN_SYNTAX.glob("*.tvp"))
             if parse_source(p.read_text(encoding="utf-8")).ok]
    return found + clean


@pytest.mark.parametrize("path", _repository_plans(), ids=lambda p: str(p.relative_to(ROOT)))
def test_repository_plans_round_trip(path):
    assert_round_trip(path.read_text(encoding="utf-8"))
