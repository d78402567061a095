"""Syntax errors: the by-example table, the code registry, recovery and golden files."""

import re
from pathlib import Path

import pytest

from trainverify_dsl.parse import ast, parse_source
from trainverify_dsl.parse.errors import EXAMPLES
from trainverify_dsl.report import codes_syntax
from trainverify_dsl.report.diagnostics import Severity

GOLDEN = Path(__file__).parent / "golden" / "syntax"
EXPECTATION = re.compile(r"#\s*E:\s*(?P<message>.*?)\s*\[(?P<code>TVP\d+)\]\s*$")
#: Lark terminal names that must never reach a user (``NAME``, ``RSQB``, ``_NL``...).
LARK_WORDS = re.compile(r"\b(?:[A-Z]+_[A-Z_]+|_?[A-Z]{3,})\b|\$END")


def codes_of(text: str) -> list[str]:
    return [d.code.id for d in parse_source(text).diagnostics]


# ---------------------------------------------------------------- the example table


EXAMPLE_CASES = [(example.code.id, snippet) for example in EXAMPLES
                 for snippet in example.snippets]


@pytest.mark.parametrize("code, snippet", EXAMPLE_CASES, ids=range(len(EXAMPLE_CASES)))
def test_every_example_snippet_produces_its_code(code, snippet):
    assert codes_of(snippet) == [code]


@pytest.mark.parametrize("code, snippet", EXAMPLE_CASES, ids=range(len(EXAMPLE_CASES)))
def test_example_matches_inside_a_block_too(code, snippet):
    if snippet.startswith(("for", "template")):
        pytest.skip("block headers are not statements of a body")
    nested = "for l in layers:\n" + "".join(f"    {line}\n" for line in snippet.splitlines())
    assert code in codes_of(nested)


# ---------------------------------------------------------------- the code registry


SYNTAX_CODES = codes_syntax.CODES


@pytest.mark.parametrize("code", SYNTAX_CODES, ids=lambda c: c.id)
def test_code_is_complete(code):
    assert re.fullmatch(r"TVP1\d\d", code.id)
    assert re.fullmatch(r"[a-z]+(-[a-z]+)*", code.name)
    assert code.severity is Severity.ERROR
    for text in (code.summary, code.what, code.why, code.example, code.fix):
        assert text.strip()


def test_code_ids_and_names_are_unique():
    assert len({c.id for c in SYNTAX_CODES}) == len({c.name for c in SYNTAX_CODES}) \
        == len(SYNTAX_CODES)


@pytest.mark.parametrize("code", [c for c in SYNTAX_CODES
                                  if c.id not in codes_syntax.NOT_FROM_TEXT], ids=lambda c: c.id)
def test_code_example_produces_it_and_fix_is_clean(code):
    assert code.id in codes_of(code.example)
    assert codes_of(code.fix) == []


def test_every_example_code_is_registered():
    assert {e.code for e in EXAMPLES} <= set(SYNTAX_CODES)


# ---------------------------------------------------------------- messages and spans


ALL_BAD_TEXTS = [snippet for _, snippet in EXAMPLE_CASES] + [
    c.example for c in SYNTAX_CODES if c.id not in codes_syntax.NOT_FROM_TEXT]


@pytest.mark.parametrize("text", ALL_BAD_TEXTS, ids=range(len(ALL_BAD_TEXTS)))
def test_messages_use_user_words_and_spans_are_in_the_text(text):
    for diagnostic in parse_source(text).diagnostics:
        assert not LARK_WORDS.search(diagnostic.message), diagnostic.message
        span = diagnostic.span
        assert 1 <= span.line <= text.count("\n") + 1
        assert 0 <= span.start_pos < span.end_pos <= len(text) + 1


def test_error_span_points_at_the_offending_token():
    text = "plan p\nreplicate params over dp pp\n"
    (diagnostic,) = parse_source(text, "f.tvp").diagnostics
    span = diagnostic.span
    assert (span.file, span.line, span.col, span.end_col) == ("f.tvp", 2, 26, 28)
    assert text[span.start_pos:span.end_pos] == "pp"


def test_end_of_line_error_says_what_was_expected():
    (diagnostic,) = parse_source("send x.out from 0\n").diagnostics
    assert diagnostic.code.id == "TVP102"
    assert "'to'" in diagnostic.message


def test_unknown_statement_suggests_the_keyword():
    (diagnostic,) = parse_source("pipline-stage 0: embed\n").diagnostics
    assert "did you mean 'pipeline-stage'?" in diagnostic.message


@pytest.mark.parametrize("line, glued", [
    ("optimizer sgd lr=0x10 momentum=0.9", "0x10"),  # the error is at `momentum`
    ("optimizer sgd lr=0x10", "0x10"),  # the error is the end of the line
    ("mesh dp=2k, tp=2", "2k"),
    ("loss-scale 1e-3x", "1e-3x"),
    ("for l in layers:\n    all-reduce grad(l.w) over dp op=avg lr=1e", "1e"),
])
def test_a_number_with_letters_glued_to_it_is_reported_where_it_is(line, glued):
    """The parser reads `0x10` as `0` and the name `x10`, and fails later (at `momentum`,
    or at the end of the line): the diagnostic names the glued text, at its position."""
    text = f"plan p\n{line}\n"
    diagnostics = parse_source(text, "f.tvp").diagnostics
    assert [d.code.id for d in diagnostics] == ["TVP115"]
    span = diagnostics[0].span
    assert text[span.start_pos:span.end_pos] == glued
    assert f"{glued!r} is not a number" in diagnostics[0].message


def test_a_digit_led_word_where_a_word_is_legal_is_not_a_glued_number():
    """`schedule 1f1b` is one word; an error after it elsewhere in the statement is not
    blamed on it."""
    assert codes_of("microbatches 4 schedule 1f1b\n") == []
    assert codes_of("microbatches 4 schedule 1f1b x\n") == ["TVP101"]


@pytest.mark.parametrize("line, written, suggestion", [
    ("spec-all-reduce grad(params) over dp", "spec-all-reduce", "all-reduce"),
    ("all-reduce-grad(params) over dp", "all-reduce-grad", "all-reduce"),
    ("loss-scale-1", "loss-scale-1", "loss-scale"),
])
def test_an_unknown_statement_is_named_as_written(line, written, suggestion):
    """The lexer cuts a keyword off the front of `spec-all-reduce`: the message said
    "unknown statement 'spec' ... did you mean 'spec'?"."""
    (diagnostic,) = parse_source(f"plan p\n{line}\n").diagnostics
    assert diagnostic.code.id == "TVP107"
    assert f"unknown statement {written!r}" in diagnostic.message
    assert f"did you mean '{suggestion}'?" in diagnostic.message


# ---------------------------------------------------------------- recovery


def test_a_block_whose_only_statements_are_wrong_gets_no_missing_body_error():
    """Recovery blanks the body's bad statements; the header is then bodiless, but saying
    so (TVP105) would blame a body that is there. A header with no body at all still is."""
    assert codes_of("for l in layers:\n    replicate x over dp pp\n") == ["TVP101"]
    assert codes_of("template t(m):\n    for q in m:\n        split q [tp tp]\n") == \
        ["TVP127"]
    assert codes_of("for l in layers:\nsplit x [tp, -]\n") == ["TVP105"]


def test_every_error_is_reported_and_good_statements_are_kept():
    text = ("plan p\n"
            "split a [dp,]\n"
            "split b [dp]\n"
            "for l in layers:\n"
            "    split l.x [tp\n"
            "    split l.y [tp]\n"
            "    copy l.z tp\n"
            "mesh dp 2\n"
            "mesh dp=2\n")
    result = parse_source(text)
    assert [(d.span.line, d.code.id) for d in result.diagnostics] == [
        (2, "TVP121"), (5, "TVP127"), (7, "TVP120"), (8, "TVP123")]
    kept = result.plan_file.statements
    assert [type(s).__name__ for s in kept] == ["PlanHeader", "SplitStmt", "ForStmt", "MeshDecl"]
    assert [s.target.segments[1].name for s in kept[2].body] == ["y"]
    assert kept[1].span.line == 3 and kept[3].span.line == 9


def test_recovered_spans_keep_file_positions():
    text = "split a [,]\nplan p\nsplit b [dp]\n"
    result = parse_source(text)
    last = result.plan_file.statements[-1]
    assert text[last.span.start_pos:last.span.end_pos] == "split b [dp]"
    assert last.span.line == 3


def test_leading_indentation_is_reported_once():
    result = parse_source("    plan p\nsplit x [dp]\n")
    assert [(d.span.line, d.code.id) for d in result.diagnostics] == [(1, "TVP104")]
    assert isinstance(result.plan_file.statements[0], ast.SplitStmt)


@pytest.mark.parametrize("text", ids=["parens", "minus", "sums", "tuples", "blocks"], argvalues=[
    "loss-scale " + "(" * 10_000 + "1" + ")" * 10_000,
    "loss-scale " + "-" * 10_000 + "1",
    "loss-scale " + "(1+" * 10_000 + "1" + ")" * 10_000,
    "optimizer sgd x=" + "(" * 5_000 + "1," + "),"  * 4_999 + ")",
    "for l in layers:\n" + "".join(" " * (i + 1) + "for l in l:\n" for i in range(300))
    + " " * 302 + "replicate l\n",
])
def test_deep_nesting_is_a_diagnostic_not_a_crash(text):
    result = parse_source(text)
    assert {d.code.id for d in result.diagnostics} <= {"TVP108"}


def test_ten_thousand_redundant_parentheses_parse():
    text = "loss-scale " + "(" * 10_000 + "1" + ")" * 10_000
    result = parse_source(text)
    assert result.diagnostics == ()
    assert result.plan_file.statements[0].value.text == "1"


# ---------------------------------------------------------------- golden files


def expectations(text: str) -> list[tuple[int, str, str]]:
    found = []
    for number, line in enumerate(text.split("\n"), start=1):
        match = EXPECTATION.search(line)
        if match:
            found.append((number, match["code"], match["message"]))
    return found


GOLDEN_FILES = sorted(GOLDEN.glob("*.tvp"))


def test_golden_files_exist():
    assert len(GOLDEN_FILES) >= 4


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.name)
def test_golden_syntax_file(path):
    text = path.read_text(encoding="utf-8")
    diagnostics = parse_source(text, str(path)).diagnostics
    expected = expectations(text)
    assert [(d.span.line, d.code.id) for d in diagnostics] == [(n, c) for n, c, _ in expected]
    for diagnostic, (_, _, message) in zip(diagnostics, expected, strict=True):
        assert message in diagnostic.message


def test_a_bug_in_the_builder_is_a_diagnostic_not_a_traceback(monkeypatch):
    from trainverify_dsl.parse.build import AstBuilder

    def broken(self, raw, children):
        raise ValueError("simulated bug")

    monkeypatch.setattr(AstBuilder, "send_stmt", broken)
    from trainverify_dsl.parse import grammar
    grammar.get_parser_and_builder.cache_clear()
    try:
        result = parse_source("plan p\nsend x from 0 to 1\nsplit y [dp]\n")
    finally:
        monkeypatch.undo()
        grammar.get_parser_and_builder.cache_clear()
    assert [(d.span.line, d.code.id) for d in result.diagnostics] == [(2, "TVP101")]
    assert "internal error" in result.diagnostics[0].message
    assert len(result.plan_file.statements) == 2
