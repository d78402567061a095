"""The statement-shape parse (``parse.shapes``) against the plain Lark parse: the same AST and
the same diagnostics on every shipped plan, stdlib file, golden file, syntax-error snippet, the
generated 10,000-line benchmark plan and mutated plans; and a replayed shape really is the
parse Lark would make, even when it is handed a shape that does not fit."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fuzz_plans import corpus, mutate  # noqa: E402
from bench.lint_bench import generate_plan  # noqa: E402
from trainverify_dsl.parse import parse_source, parser, shapes  # noqa: E402
from trainverify_dsl.parse.errors import EXAMPLES  # noqa: E402
from trainverify_dsl.parse.grammar import get_parser_and_builder  # noqa: E402

PLANS = corpus()
GOLDEN = sorted((ROOT / "tests" / "golden").rglob("*.tvp"))
SNIPPETS = [snippet for example in EXAMPLES for snippet in example.snippets]
BENCH_PLAN, _ = generate_plan(10_000)


def plain_parse(text: str, file: str) -> parser.ParseResult:
    """``parse_source`` without step 1: the whole file through ``Lark.parse``."""
    saved = parser._parse_by_shapes
    parser._parse_by_shapes = lambda source, name: None
    try:
        return parse_source(text, file)
    finally:
        parser._parse_by_shapes = saved


def assert_same_parse(text: str, file: str = "same.tvp") -> None:
    assert parse_source(text, file) == plain_parse(text, file)


def group_counts(text: str) -> tuple[int, int]:
    """(groups parsed by Lark, groups replayed) for a text ending in a newline."""
    lark, builder = get_parser_and_builder()
    groups = shapes.ShapeParser.of(lark)
    assert groups is not None
    text_shape = shapes.shape_of(text)
    for first_line, start, end in parser._group_bounds(text):
        builder.reset("count.tvp", first_line, start)
        groups.parse(text[start:end], text_shape[start:end])
    return groups.parsed, groups.replayed


@pytest.mark.parametrize("name,text", PLANS, ids=[name for name, _ in PLANS])
def test_shipped_plans_parse_the_same(name: str, text: str) -> None:
    assert parser._parse_by_shapes(text, name) is not None
    assert_same_parse(text, name)


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_files_parse_the_same(path: Path) -> None:
    assert_same_parse(path.read_text(encoding="utf-8"), str(path))


@pytest.mark.parametrize("snippet", SNIPPETS)
def test_syntax_errors_are_the_plain_parses(snippet: str) -> None:
    assert parser._parse_by_shapes(snippet, "bad.tvp") is None
    assert_same_parse(snippet)
    assert_same_parse(f"plan p\nmesh dp=2\n{snippet}split x [dp]\n")


def test_the_benchmark_plan_parses_the_same_and_mostly_by_replay() -> None:
    assert_same_parse(BENCH_PLAN, "bench.tvp")
    parsed, replayed = group_counts(BENCH_PLAN)
    assert parsed < 150 and replayed > 50 * parsed


def test_statements_differing_in_numbers_share_a_shape() -> None:
    text = "split layers.1.w [tp, -]\nsplit layers.7.w [tp, -]\nsplit layers.70.w [tp, -]\n"
    assert group_counts(text) == (2, 1)
    assert_same_parse(text)


QUICK = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


@QUICK
@given(plan=st.sampled_from(PLANS), seed=st.integers(0, 2**32 - 1))
def test_mutated_plans_parse_the_same(plan: tuple[str, str], seed: int) -> None:
    assert_same_parse(mutate(plan[1], random.Random(seed)), plan[0])


LINES = sorted({line.strip() + "\n" for _, text in PLANS for line in text.splitlines()
                if line.strip() and not line.startswith((" ", "#"))})


@QUICK
@given(st.lists(st.sampled_from(LINES), min_size=2, max_size=6))
def test_a_shape_that_does_not_fit_goes_back_to_lark(lines: list[str]) -> None:
    """Every line handed over as the same shape: each replay must see that the recorded
    lexemes do not fit (or fit exactly) and give what ``Lark.parse`` gives."""
    lark, builder = get_parser_and_builder()
    groups = shapes.ShapeParser.of(lark)
    assert groups is not None
    for line in lines:
        builder.reset("one.tvp")
        try:
            expected = lark.parse(line)
        except Exception:  # noqa: BLE001 - a line that is no plan on its own
            continue
        builder.reset("one.tvp")
        assert groups.parse(line, "one shape") == expected
