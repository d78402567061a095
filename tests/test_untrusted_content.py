"""Diagnostics never reproduce foreign content (issue 13 item 3).

A source line shown in a text excerpt is cut to ``MAX_EXCERPT`` characters around the span,
a token quoted in a message to ``MAX_QUOTED``; a file that is not a plan (a `.env` file
reached through ``use`` or a symlink, a 20 MB log line) gets one TVP110 diagnostic at 1:1
that quotes none of it, in every output format. A real plan with typos keeps its per-line
diagnostics.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainverify_dsl import PROJECT_ROOT
from trainverify_dsl.parse import format_source, parse_source
from trainverify_dsl.parse.errors import MAX_QUOTED
from trainverify_dsl.parse.parser import looks_like_a_plan
from trainverify_dsl.plan import lint_file
from trainverify_dsl.report import codes_syntax
from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.render import FORMATS, FileSources, LintReport, render
from trainverify_dsl.report.render.text import MAX_EXCERPT, render_diagnostic
from trainverify_dsl.report.span import Span

SECRET = "sk-live-0123456789abcdef"
SECRET_ENV = f"API_KEY={SECRET}\nDB_PASSWORD=correct-horse-battery\nexport REGION=eu\n"
HEAD = 'plan x\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\nmesh dp=2\n'
FEW_KB = 4096


def rendered(diagnostics: list[Diagnostic], files: list[str]) -> dict[str, str]:
    report = LintReport.of(diagnostics, files)
    return {fmt: render(fmt, report, FileSources(), root=os.getcwd()) for fmt in FORMATS}


def bounded_part(fmt: str, output: str) -> str:
    """The part of ``output`` that depends on the input. SARIF always carries the whole rule
    table (fixed text, ~150 KB); only its results and artifacts depend on the plan."""
    if fmt != "sarif":
        return output
    run = json.loads(output)["runs"][0]
    return json.dumps([run["results"], run.get("artifacts")])


def tvp(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    return subprocess.run([sys.executable, "-m", "trainverify_dsl.cli.main", *argv], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=120)


# ---------------------------------------------------------------- excerpts and quotes


def long_line_diagnostic(line: str, col: int, width: int) -> str:
    span = Span("f.tvp", 2, col, 2, col + width)
    return render_diagnostic(Diagnostic(codes_syntax.UNEXPECTED_TOKEN, "bad", span),
                             {"f.tvp": "plan p\n" + line + "\n"}.get)


def test_a_long_line_is_cut_at_its_start() -> None:
    block = long_line_diagnostic("split " + "a" * 100_000 + " [dp]", 1, 5)
    header, source, marker = block.splitlines()
    assert source == "    split " + "a" * (MAX_EXCERPT - 6) + " …"
    assert marker == "    ^~~~~"


def test_a_long_line_is_cut_around_a_span_far_into_it() -> None:
    line = "split " + "a" * 50_000 + " zz" + " b" * 50_000
    col = line.index("zz") + 1
    block = long_line_diagnostic(line, col, 2)
    _, source, marker = block.splitlines()
    assert source.startswith("    … ") and source.endswith(" …")
    assert len(source) <= len("    ") + MAX_EXCERPT + 4
    assert source[marker.index("^"):marker.index("^") + 2] == "zz"
    assert marker.strip() == "^~"


def test_a_span_running_past_the_window_is_clipped_to_it() -> None:
    block = long_line_diagnostic("x" * 10_000, 1, 10_000)
    _, source, marker = block.splitlines()
    assert len(marker) <= len(source)
    assert len(block) < 1000


def test_a_huge_token_is_quoted_cut_in_every_format(tmp_path: Path) -> None:
    plan = tmp_path / "main.tvp"
    token = "q" * 1_000_000
    plan.write_text(HEAD + f"split x [dp {token}]\n{token} y\n", encoding="utf-8")
    diagnostics = list(lint_file(str(plan)))
    assert diagnostics and all(len(d.message) < 300 for d in diagnostics)
    assert any("'" + "q" * MAX_QUOTED + "…'" in d.message for d in diagnostics)
    for fmt, output in rendered(diagnostics, [str(plan)]).items():
        assert len(bounded_part(fmt, output)) < FEW_KB, fmt


# ---------------------------------------------------------------- not a plan


def test_a_20_mb_one_line_file_gives_one_small_diagnostic(tmp_path: Path) -> None:
    path = tmp_path / "huge.tvp"
    path.write_text("k" * 20_000_000 + "\n", encoding="utf-8")
    diagnostics = list(lint_file(str(path)))
    assert [(d.code.id, d.span.line, d.span.col) for d in diagnostics] == [("TVP110", 1, 1)]
    for fmt, output in rendered(diagnostics, [str(path)]).items():
        assert "k" * 20 not in output, fmt
        assert len(bounded_part(fmt, output)) < FEW_KB, fmt


def test_use_of_a_secrets_file_does_not_print_the_secret(tmp_path: Path) -> None:
    (tmp_path / "secret.env").write_text(SECRET_ENV, encoding="utf-8")
    (tmp_path / "main.tvp").write_text(HEAD + 'use "secret.env"\n', encoding="utf-8")
    for fmt in FORMATS:
        result = tvp("lint", "--format", fmt, "main.tvp", cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        output = result.stdout + result.stderr
        for leaked in (SECRET, "API_KEY", "DB_PASSWORD", "correct-horse", "REGION"):
            assert leaked not in output, (fmt, leaked)
        assert "TVP110" in output and "Traceback" not in output
    text = tvp("lint", "main.tvp", cwd=tmp_path).stdout
    assert text.count("[TVP110]") == 1
    assert "secret.env:1:1: error: this file does not look like a plan" in text
    assert "note: in the file used at main.tvp:4:1" in text


def test_a_secrets_file_that_is_not_utf8_does_not_print_the_secret(tmp_path: Path) -> None:
    """A byte that is not UTF-8 in a `.env` file: the TVP110 quoted none of it, but the
    TVP109 about the byte that followed quoted its line, secret and all (`lint`, `fmt`)."""
    (tmp_path / "secret.env").write_bytes(SECRET_ENV.encode() + b"\xff\n")
    (tmp_path / "main.tvp").write_text(HEAD + 'use "secret.env"\n', encoding="utf-8")
    for command in (("lint", "main.tvp"), ("lint", "secret.env"), ("fmt", "secret.env"),
                    ("lint", "--format", "json", "secret.env")):
        result = tvp(*command, cwd=tmp_path)
        output = result.stdout + result.stderr
        assert SECRET not in output and "API_KEY" not in output, (command, output)
        assert output.count("TVP110") == 1 and "TVP109" not in output, (command, output)


def test_a_plan_that_is_a_symlink_to_another_file_is_not_quoted(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(SECRET_ENV, encoding="utf-8")
    (tmp_path / "plan.tvp").symlink_to(".env")
    for argv in (("lint",), ("lint", "--format", "github"), ("fmt",), ("fmt", "--check")):
        result = tvp(*argv, "plan.tvp", cwd=tmp_path)
        assert result.returncode == 1
        assert SECRET not in result.stdout + result.stderr
        assert "API_KEY" not in result.stdout + result.stderr
        assert "TVP110" in result.stdout + result.stderr
    assert (tmp_path / ".env").read_text(encoding="utf-8") == SECRET_ENV


def test_a_non_plan_file_keeps_nothing_of_its_text() -> None:
    result = parse_source("for x in y:\n    split x [dp]\nimport os\nprint(os.environ)\n"
                          "import sys\n", "script.py")
    assert [d.code.id for d in result.diagnostics] == ["TVP110"]
    assert result.plan_file is not None and result.plan_file.statements == ()
    assert format_source("API_KEY=1\n").text is None


@pytest.mark.parametrize("text", [
    "API_KEY=abc\n",
    "plan=prod\nuse=all\n",                      # key=value, not statements
    "# comment\n\nfoo bar baz\n",
    '{"plan": "x", "mesh": [1, 2]}\n',
    "for a while I thought\nthis was fine\nbut it was not\n",
])
def test_foreign_texts_get_one_diagnostic(text: str) -> None:
    diagnostics = parse_source(text, "f").diagnostics
    assert [(d.code.id, d.span.line, d.span.col) for d in diagnostics] == [("TVP110", 1, 1)]
    assert re.sub(r"\d+", "N", diagnostics[0].message) == (
        "this file does not look like a plan: N of N lines (not blank, not comments) start "
        "with a statement keyword; its text is not shown")
    assert not looks_like_a_plan(text)


# ---------------------------------------------------------------- real plans stay per-line


@pytest.mark.parametrize(("text", "expected"), [
    ("plan p\nallreduce x over dp\nsplitt y [dp]\nmesh dp 2\n",
     [(2, "TVP107"), (3, "TVP107"), (4, "TVP123")]),
    ("splitt x [dp]\n", [(1, "TVP107")]),
    ("split x [dp,\nfoo bar\n", [(1, "TVP121"), (2, "TVP107")]),
    ("plan p\nmesh dp=2\nsplit x [dp\nwhat is this\nreplicate y\n",
     [(3, "TVP127"), (4, "TVP107")]),
])
def test_a_plan_with_typos_keeps_its_per_line_diagnostics(text: str,
                                                          expected: list[tuple[int, str]]) -> None:
    assert looks_like_a_plan(text)
    found = [(d.span.line, d.code.id) for d in parse_source(text).diagnostics]
    assert found == expected


def test_every_shipped_plan_looks_like_a_plan() -> None:
    files = sorted(PROJECT_ROOT.glob("plans/**/*.tvp")) + sorted(
        PROJECT_ROOT.glob("stdlib/**/*.tvp"))
    assert files
    for path in files:
        assert looks_like_a_plan(path.read_text(encoding="utf-8")), path


def test_the_code_never_quotes_source() -> None:
    assert codes_syntax.NOT_A_PLAN.quotes_source is False
    diagnostic = Diagnostic(codes_syntax.NOT_A_PLAN, "not a plan", Span("f", 1, 1, 1, 2))
    block = render_diagnostic(diagnostic, {"f": SECRET_ENV}.get)
    assert block == "f:1:1: error: not a plan [TVP110]\n"
