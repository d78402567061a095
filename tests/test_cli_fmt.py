"""``tvp fmt``: in place, --check, --diff, stdin, syntax errors leave files alone.

The formatter is faked (strip trailing blanks, one final newline; "SYNTAX" is an error) so
these tests pin the command's behaviour; the real ``format_source`` runs at the bottom.
"""

from __future__ import annotations

import argparse
import io
import os
from pathlib import Path
from typing import NamedTuple

import pytest
from test_render_support import TEST_ERROR

import trainverify_dsl.parse as parse
from trainverify_dsl.cli import fmt_cmd
from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.span import Span


class FakeResult(NamedTuple):
    text: str | None
    diagnostics: tuple[Diagnostic, ...]


def fake_format(text: str, file: str) -> FakeResult:
    if "SYNTAX" in text:
        line = text[:text.index("SYNTAX")].count("\n") + 1
        span = Span(file, line, 1, line, 7)
        return FakeResult(None, (Diagnostic(TEST_ERROR, "syntax error", span),))
    lines = [line.rstrip() for line in text.rstrip("\n").split("\n")]
    return FakeResult("\n".join(lines) + "\n", ())


@pytest.fixture
def fmt(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setattr(parse, "format_source", fake_format, raising=False)

    def invoke(*argv: str) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser()
        fmt_cmd.configure(parser)
        status = fmt_cmd.run(parser.parse_args(list(argv)))
        out, err = capsys.readouterr()
        return status, out, err

    return invoke


def plan(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_rewrites_in_place_and_keeps_the_mode(fmt, tmp_path: Path) -> None:
    messy = plan(tmp_path, "a.tvp", "plan a   \nmesh dp=2\n\n\n")
    tidy = plan(tmp_path, "b.tvp", "plan b\n")
    os.chmod(messy, 0o640)
    status, out, err = fmt(str(messy), str(tidy))
    assert (status, out) == (0, "")
    assert messy.read_text() == "plan a\nmesh dp=2\n"
    assert messy.stat().st_mode & 0o777 == 0o640
    assert err.splitlines() == [f"reformatted {messy}", "1 file reformatted, 1 file unchanged"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tvp", "b.tvp"]  # no temp files


def test_check_lists_files_and_writes_nothing(fmt, tmp_path: Path) -> None:
    messy = plan(tmp_path, "a.tvp", "plan a   \n")
    status, out, err = fmt("--check", str(tmp_path))
    assert (status, out) == (1, "")
    assert messy.read_text() == "plan a   \n"
    assert err.splitlines() == [f"would reformat {messy}",
                                "1 file would be reformatted, 0 files unchanged"]


def test_check_passes_on_canonical_files(fmt, tmp_path: Path) -> None:
    plan(tmp_path, "a.tvp", "plan a\n")
    assert fmt("--check", str(tmp_path))[0] == 0


def test_diff_prints_a_unified_diff(fmt, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    messy = plan(tmp_path, "a.tvp", "plan a   \nmesh dp=2\n")
    status, out, _ = fmt("--diff", "a.tvp")
    assert status == 1
    assert messy.read_text() == "plan a   \nmesh dp=2\n"
    assert out.splitlines() == ["--- a/a.tvp", "+++ b/a.tvp", "@@ -1,2 +1,2 @@",
                                "-plan a   ", "+plan a", " mesh dp=2"]


def test_diff_names_absolute_paths_as_given(fmt, tmp_path: Path) -> None:
    messy = plan(tmp_path, "a.tvp", "plan a   \n")
    assert fmt("--diff", str(messy))[1].splitlines()[:2] == [f"--- {messy}", f"+++ {messy}"]


def test_a_formatter_that_changes_the_meaning_is_caught(fmt, tmp_path: Path,
                                                        monkeypatch) -> None:
    def swap_the_axis(text: str, file: str) -> FakeResult:  # still parses, means otherwise
        return FakeResult(text.replace("[dp, -]", "[tp, -]"), ())

    monkeypatch.setattr(parse, "format_source", swap_the_axis)
    original = "plan a\nmesh dp=2\nsplit tokens [dp, -]\n"
    path = plan(tmp_path, "a.tvp", original)
    status, _, err = fmt(str(path))
    assert status == 1
    assert path.read_text() == original
    assert f"formatting {path} would change its meaning" in err


def test_diff_marks_a_missing_final_newline(fmt, tmp_path: Path) -> None:
    messy = plan(tmp_path, "a.tvp", "plan a")
    out = fmt("--diff", str(messy))[1]
    assert out.splitlines()[3:] == ["-plan a", "\\ No newline at end of file", "+plan a"]


def test_syntax_errors_leave_the_file_alone(fmt, tmp_path: Path) -> None:
    broken = plan(tmp_path, "a.tvp", "plan a   \nSYNTAX here\n")
    status, out, err = fmt(str(broken))
    assert (status, out) == (1, "")
    assert broken.read_text() == "plan a   \nSYNTAX here\n"
    assert f"{broken}:2:1: error: syntax error [TVP990]" in err
    assert "    SYNTAX here" in err
    assert err.splitlines()[-1] == "0 files reformatted, 0 files unchanged, 1 file failed"


def test_unreadable_file_fails(fmt, tmp_path: Path) -> None:
    status, _, err = fmt(str(tmp_path / "missing.tvp"))
    assert status == 1
    missing = tmp_path / "missing.tvp"
    assert f"{missing}:1:1: error: cannot read '{missing}': No such file or directory" in err


def test_stdin_to_stdout(fmt, monkeypatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("plan a  \n"))
    status, out, _ = fmt("-")
    assert (status, out) == (0, "plan a\n")


def test_stdin_check(fmt, monkeypatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("plan a  \n"))
    status, out, _ = fmt("--check", "-")
    assert (status, out) == (1, "")


# ---------------------------------------------------------------- with the real formatter

needs_formatter = pytest.mark.skipif(
    not hasattr(__import__("trainverify_dsl.parse", fromlist=["x"]), "format_source"),
    reason="trainverify_dsl.parse.format_source not available yet")


@needs_formatter
def test_real_formatter_round_trip(tmp_path: Path, capsys) -> None:
    messy = plan(tmp_path, "a.tvp", "plan   demo\nmesh   dp=2,tp=2\nsplit tokens [dp,-]\n")
    parser = argparse.ArgumentParser()
    fmt_cmd.configure(parser)
    assert fmt_cmd.run(parser.parse_args([str(messy)])) == 0
    formatted = messy.read_text()
    assert formatted != "plan   demo\nmesh   dp=2,tp=2\nsplit tokens [dp,-]\n"
    assert fmt_cmd.run(parser.parse_args(["--check", str(messy)])) == 0
    capsys.readouterr()


def test_unwritable_file_fails_without_a_traceback(fmt, tmp_path: Path, monkeypatch) -> None:
    def read_only(path: Path, text: str) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(fmt_cmd, "write_atomically", read_only)
    messy = plan(tmp_path, "a.tvp", "plan a   \n")
    status, _, err = fmt(str(messy))
    assert status == 1
    assert f"tvp fmt: cannot write {messy}: Read-only file system" in err
    assert "Traceback" not in err
