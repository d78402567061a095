"""GitHub workflow commands: properties, escaping, severities, multi-line spans."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from test_render_support import FILE, TEST_NOTE, error, warning

from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.render import LintReport
from trainverify_dsl.report.render.github import escape_data, escape_property, render_github
from trainverify_dsl.report.span import Span


def test_error_command() -> None:
    out = render_github(LintReport.of([error()], [FILE]))
    assert out == ("::error file=plans/demo.tvp,line=3,col=10,endLine=3,endColumn=11,"
                   "title=TVP990 (test-error)::unknown mesh axis 'tq'\n")


def test_severities_map_to_commands() -> None:
    note = Diagnostic(TEST_NOTE, "fyi", Span(FILE, 1, 1, 1, 2))
    out = render_github(LintReport.of([error(), warning("w"), note], [FILE]))
    assert [line.split(" ")[0] for line in out.splitlines()] == ["::warning", "::notice",
                                                                 "::error"]


def test_escaping() -> None:
    assert escape_data("100% done\r\nnext") == "100%25 done%0D%0Anext"
    assert escape_property("a:b,c%d\n") == "a%3Ab%2Cc%25d%0A"


def test_file_names_and_messages_are_escaped() -> None:
    diagnostic = error("bad: 50%", file="dir,x/a:b.tvp", help="use x, y")
    out = render_github(LintReport.of([diagnostic], []))
    assert "file=dir%2Cx/a%3Ab.tvp," in out
    assert out.endswith("::bad: 50%25%0Ahelp: use x, y\n")
    assert out.count("\n") == 1


def test_multi_line_span_has_no_columns() -> None:
    out = render_github(LintReport.of([error(line=2, end_line=4, end_col=3)], [FILE]))
    assert "line=2,endLine=4,title=" in out
    assert "col=" not in out


def test_related_locations_become_notices() -> None:
    related = ((Span("other.tvp", 7, 2, 7, 5), "declared here"),)
    out = render_github(LintReport.of([error(related=related)], [FILE])).splitlines()
    assert out[1] == ("::notice file=other.tvp,line=7,col=2,endLine=7,endColumn=4,"
                      "title=TVP990 related::declared here")


def test_clean_report_prints_nothing() -> None:
    assert render_github(LintReport.of([], [FILE])) == ""


def test_absolute_paths_under_the_workspace_become_relative() -> None:
    inside = render_github(LintReport.of([error(file="/ws/plans/a.tvp")], []), root="/ws")
    outside = render_github(LintReport.of([error(file="/other/a.tvp")], []), root="/ws")
    assert "file=plans/a.tvp," in inside
    assert "file=/other/a.tvp," in outside


def unescape(text: str) -> str:
    for escaped, plain in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","),
                           ("%25", "%")):
        text = text.replace(escaped, plain)
    return text


@given(st.text())
def test_escaping_round_trips_and_leaves_no_separators(text: str) -> None:
    data, prop = escape_data(text), escape_property(text)
    assert unescape(data) == text and unescape(prop) == text
    assert "\n" not in data and "\r" not in data
    assert not {",", ":", "\n", "\r"} & set(prop)
