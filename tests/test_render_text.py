"""Text renderer: header, excerpt and marker, notes, related locations, summary, colour."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from test_render_support import FILE, SOURCE, TEST_NOTE, error, sources, warning

from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.render import LintReport, no_sources
from trainverify_dsl.report.render.text import render_diagnostic, render_text
from trainverify_dsl.report.span import Span


def block(diagnostic: Diagnostic, text: str = SOURCE, **options) -> list[str]:
    lookup = sources({diagnostic.span.file: text})
    return render_diagnostic(diagnostic, lookup, **options).splitlines()


def test_header_excerpt_and_marker() -> None:
    lines = block(error())
    assert lines == [
        "plans/demo.tvp:3:10: error: unknown mesh axis 'tq' [TVP990]",
        "    split x [tq, -]",
        "             ^~",
    ]


def test_marker_sits_under_the_span_for_every_column() -> None:
    for col in range(1, 16):
        lines = block(error(col=col, end_col=col + 1))
        assert lines[2].index("^") == lines[1].index("s") + col - 1


def test_notes_help_and_related_locations() -> None:
    related = ((Span(FILE, 2, 1, 2, 22), "mesh declared here"),)
    diagnostic = error(notes=("the mesh declares pp, dp, tp",), help="did you mean 'tp'?",
                       related=related)
    lines = block(diagnostic)
    assert lines[3:] == [
        "    note: the mesh declares pp, dp, tp",
        "    help: did you mean 'tp'?",
        "plans/demo.tvp:2:1: note: mesh declared here",
        "    mesh pp=4, dp=4, tp=8",
        "    ^~~~~~~~~~~~~~~~~~~~~",
    ]


def test_multi_line_note_is_indented_under_its_label() -> None:
    lines = block(error(notes=("first\nsecond",)))
    assert lines[3:] == ["    note: first", "          second"]


def test_tabs_are_expanded_and_the_marker_follows() -> None:
    text = "\tsplit\tx [tq]\n"
    lines = block(error(line=1, col=11, end_col=13), text)  # "tq" after two tabs
    assert lines[1] == "    " + "    split   x [tq]"
    assert lines[2] == "    " + " " * 15 + "^~"


def test_wide_characters_count_twice() -> None:
    text = "# 東京 x\n"
    lines = block(error(line=1, col=6, end_col=7), text)
    assert lines[2] == "    " + " " * 7 + "^"


def test_span_past_end_of_line_is_clipped() -> None:
    lines = block(error(line=1, col=40, end_col=50))
    assert lines[1] == "    plan demo"
    assert lines[2] == "    " + " " * 9 + "^"


def test_empty_span_still_gets_a_caret() -> None:
    lines = block(error(line=1, col=6, end_col=6))
    assert lines[2] == "    " + " " * 5 + "^"


def test_multi_line_span_marks_to_end_of_first_line() -> None:
    lines = block(error(line=2, col=6, end_line=3, end_col=5))
    assert lines[1] == "    mesh pp=4, dp=4, tp=8"
    assert lines[2] == "    " + " " * 5 + "^" + "~" * 15 + " (span ends at line 3)"


def test_missing_source_or_line_out_of_range_drops_the_excerpt() -> None:
    diagnostic = error()
    assert render_diagnostic(diagnostic, no_sources).splitlines() == [
        "plans/demo.tvp:3:10: error: unknown mesh axis 'tq' [TVP990]"]
    assert len(block(error(line=99))) == 1
    assert len(block(error(line=4))) == 1  # the empty line after the final newline


def test_carriage_returns_are_not_printed() -> None:
    lines = block(error(line=1, col=1, end_col=5), "plan demo\r\nmesh\r\n")
    assert lines[1] == "    plan demo"


def test_summary_counts_and_plurals() -> None:
    report = LintReport.of([error(), error(line=1), warning("w", file="b.tvp")],
                           [FILE, "b.tvp", "c.tvp"])
    text = render_text(report, no_sources)
    assert text.endswith("2 errors, 1 warning in 2 files (3 files checked)\n")


def test_clean_summary() -> None:
    assert render_text(LintReport.of([], ["a.tvp"]), no_sources) == \
        "no issues found in 1 file\n"
    assert render_text(LintReport.of([], ["a.tvp", "b.tvp"]), no_sources) == \
        "no issues found in 2 files\n"


def test_notes_appear_in_the_summary_only_when_present() -> None:
    note = Diagnostic(TEST_NOTE, "fyi", Span(FILE, 1, 1, 1, 2))
    text = render_text(LintReport.of([note], [FILE]), no_sources)
    assert text.splitlines()[-1] == "0 errors, 0 warnings, 1 note in 1 file (1 file checked)"
    assert "plans/demo.tvp:1:1: note: fyi [TVP992]" in text


def test_diagnostics_are_sorted_by_location() -> None:
    report = LintReport.of([error(line=3), error(line=1), error(file="a.tvp")], [])
    headers = [line for line in render_text(report, no_sources).splitlines() if ": error:" in line]
    assert [h.split(": error")[0] for h in headers] == [
        "a.tvp:3:10", "plans/demo.tvp:1:10", "plans/demo.tvp:3:10"]


def test_colour_only_when_asked() -> None:
    report = LintReport.of([error()], [FILE])
    plain = render_text(report, sources({FILE: SOURCE}))
    coloured = render_text(report, sources({FILE: SOURCE}), color=True)
    assert "\x1b[" not in plain
    assert "\x1b[1;31merror:\x1b[0m" in coloured
    assert _strip_ansi(coloured) == plain


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_tab_inside_the_span_widens_the_marker_to_the_next_tab_stop() -> None:
    text = "ab\tc\n"  # the tab at column 3 runs to display column 4
    lines = block(error(line=1, col=2, end_col=5), text)
    assert lines[1] == "    ab  c"
    assert lines[2] == "    " + " " + "^~~~"


@settings(max_examples=200, deadline=None)
@given(line=st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                           blacklist_characters="\n\r"), max_size=40),
       col=st.integers(-2, 60), length=st.integers(-3, 60), extra_lines=st.integers(0, 2))
def test_any_span_renders_without_error(line: str, col: int, length: int,
                                        extra_lines: int) -> None:
    diagnostic = error(line=1, col=col, end_line=1 + extra_lines, end_col=col + length)
    lines = block(diagnostic, line + "\n")
    if line.strip():
        marker = lines[2].strip().split(" ")[0]
        assert re.fullmatch(r"\^~*", marker)


@settings(max_examples=200, deadline=None)
@given(line=st.text(alphabet="abc xyz-=[],.", min_size=1, max_size=40).filter(str.strip),
       data=st.data())
def test_ascii_marker_sits_exactly_under_the_span(line: str, data: st.DataObject) -> None:
    col = data.draw(st.integers(1, len(line)))
    end_col = data.draw(st.integers(col + 1, len(line) + 1))
    lines = block(error(line=1, col=col, end_col=end_col), line + "\n")
    marker = lines[2][len("    "):]
    assert marker == " " * (col - 1) + "^" + "~" * (end_col - col - 1)
