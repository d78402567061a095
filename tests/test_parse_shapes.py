"""The statement-shape parse (``parse.shapes``) against the plain Lark parse: the same AST and
the same diagnostics on every shipped plan, stdlib file, golden file, syntax-error snippet, the
generated 10,000-line benchmark plan and mutated plans. And what the replay rests on: texts of
one shape (their digits aside) are lexed alike by Lark, because no terminal of the grammar
tells one digit from another (and the check that says so is right)."""

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


@pytest.fixture(autouse=True)
def every_file_by_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 1 for every file here, however little it repeats itself (the real threshold
    sends most small files straight to the plain parse, which would test nothing)."""
    monkeypatch.setattr(parser, "MAX_DISTINCT_SHAPES", 1.0)
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
    text_shape = groups.shape_of(text)
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


def test_shapes_are_used_where_a_file_repeats_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parser, "MAX_DISTINCT_SHAPES", 0.25)
    assert parser._parse_by_shapes(BENCH_PLAN, "bench.tvp") is not None
    small = dict(PLANS)["plans/llama3_8b_3d.tvp"]
    assert parser._parse_by_shapes(small, "small.tvp") is None
    assert_same_parse(small)


@QUICK
@given(plan=st.sampled_from(PLANS), seed=st.integers(0, 2**32 - 1))
def test_mutated_plans_parse_the_same(plan: tuple[str, str], seed: int) -> None:
    assert_same_parse(mutate(plan[1], random.Random(seed)), plan[0])


LINES = sorted({line.strip() + "\n" for _, text in PLANS for line in text.splitlines()
                if line.strip() and not line.startswith((" ", "#"))})
DIGITS = st.sampled_from("0123456789")


def lark_tokens(text: str) -> list[tuple]:
    """What Lark's lexer and postlexer feed its parser for ``text``: type and positions."""
    lark, builder = get_parser_and_builder()
    builder.reset("tokens.tvp")
    interactive = lark.parse_interactive(text)
    return [(t.type, t.start_pos, t.end_pos, t.line, t.column, t.end_line, t.end_column)
            for t in interactive.iter_parse()]


@QUICK
@given(line=st.sampled_from(LINES), digits=st.lists(DIGITS, min_size=40, max_size=40))
def test_texts_of_one_shape_are_lexed_alike(line: str, digits: list[str]) -> None:
    """Every digit of a shipped statement replaced by a drawn one: the same shape, the same
    terminals at the same places (when Lark accepts the line on its own at all)."""
    fresh = iter(digits * (1 + len(line) // 40))
    other = "".join(next(fresh) if char.isdigit() and char.isascii() else char
                    for char in line)
    lark, _ = get_parser_and_builder()
    groups = shapes.ShapeParser.of(lark)
    assert groups is not None and groups.shape_of(other) == groups.shape_of(line)
    try:
        expected = lark_tokens(line)
    except Exception:  # noqa: BLE001 - a line that is no plan on its own
        return
    assert lark_tokens(other) == expected


def test_the_grammar_cannot_tell_digits_apart() -> None:
    lark, _ = get_parser_and_builder()
    groups = shapes.ShapeParser.of(lark)
    assert groups is not None and groups.digits_interchangeable


@pytest.mark.parametrize("regexp,interchangeable", [
    (r"[0-9]+", True), (r"\d", True), (r"\w+(?![\w-])", True), (r"[^0-9]", True),
    (r'"([^"\\\r\n]|\\.)*"', True), (r"[A-Za-z_][A-Za-z0-9_]*", True), (r"\s|\S", True),
    (r"[1-9]", False), (r"[0-8]", False), (r"[^5]", False), (r"1f1b", False),
    (r"(a)\1", False), (r"x[02468]", False),
])
def test_the_digit_check_on_examples(regexp: str, interchangeable: bool) -> None:
    assert shapes.digits_are_interchangeable([regexp]) is interchangeable


def test_without_interchangeable_digits_shapes_are_exact_texts(monkeypatch) -> None:
    """A grammar that could tell digits apart: only identical groups share a shape, and the
    parse is still the plain one."""
    monkeypatch.setattr(shapes, "_terminals_ignore_digits", lambda parser: False)
    text = "split layers.1.w [tp, -]\nsplit layers.7.w [tp, -]\nsplit layers.7.w [tp, -]\n"
    lark, _ = get_parser_and_builder()
    groups = shapes.ShapeParser.of(lark)
    assert groups is not None and groups.shape_of(text) == text
    assert group_counts(text) == (2, 1)
    assert_same_parse(text)
