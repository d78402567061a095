"""``tvp lint``: file collection, formats, colour, exit codes; the linter is faked here
(the real one is exercised end to end at the bottom and by tests/test_golden.py)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_render_sarif import validate
from test_render_support import TEST_ERROR, TEST_WARNING

from trainverify_dsl.cli import lint_cmd
from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.span import Span

ROOT = Path(__file__).resolve().parent.parent


def fake_lint(file: str) -> list[Diagnostic]:
    """An error on every line holding BAD, a warning on every line holding WARN."""
    try:
        text = Path(file).read_text()
    except OSError:
        return [Diagnostic(TEST_ERROR, "cannot read file", Span(file, 1, 1, 1, 1))]
    if "CRASH" in text:
        raise RuntimeError("linter bug")
    found = []
    for number, line in enumerate(text.split("\n"), start=1):
        for word, code in (("BAD", TEST_ERROR), ("WARN", TEST_WARNING)):
            if word in line:
                col = line.index(word) + 1
                found.append(Diagnostic(code, f"found {word}", Span(file, number, col, number,
                                                                   col + len(word))))
    return found


@pytest.fixture
def lint(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setattr(lint_cmd, "default_linter", lambda: fake_lint)

    def invoke(*argv: str) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser()
        lint_cmd.configure(parser)
        status = lint_cmd.run(parser.parse_args(list(argv)))
        out, err = capsys.readouterr()
        return status, out, err

    return invoke


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_collect_plan_files(tmp_path: Path) -> None:
    a = write(tmp_path / "d" / "a.tvp", "")
    b = write(tmp_path / "d" / "sub" / "b.tvp", "")
    write(tmp_path / "d" / ".hidden" / "c.tvp", "")
    write(tmp_path / "d" / "notes.txt", "")
    other = write(tmp_path / "x.plan", "")
    (tmp_path / "empty").mkdir()
    files, empty = lint_cmd.collect_plan_files(
        [str(tmp_path / "d"), a, other, str(tmp_path / "empty"), "missing.tvp"])
    assert files == [a, b, other, "missing.tvp"]
    assert empty == [str(tmp_path / "empty")]


def test_clean_file_exits_0(lint, tmp_path: Path) -> None:
    status, out, _ = lint(write(tmp_path / "a.tvp", "plan ok\n"))
    assert (status, out) == (0, "no issues found in 1 file\n")


def test_warnings_only_exit_0(lint, tmp_path: Path) -> None:
    file = write(tmp_path / "a.tvp", "plan WARN\n")
    status, out, _ = lint(file)
    assert status == 0
    assert out.splitlines() == [f"{file}:1:6: warning: found WARN [TVP991]", "    plan WARN",
                                "         ^~~~", "0 errors, 1 warning in 1 file (1 file checked)"]


def test_errors_exit_1_and_every_file_is_reported(lint, tmp_path: Path) -> None:
    first = write(tmp_path / "a.tvp", "BAD\n")
    write(tmp_path / "b.tvp", "fine\n")
    status, out, _ = lint(first, str(tmp_path))
    assert status == 1
    assert out.splitlines()[-1] == "1 error, 0 warnings in 1 file (2 files checked)"


def test_missing_file_is_a_diagnostic(lint, tmp_path: Path) -> None:
    status, out, _ = lint(str(tmp_path / "nope.tvp"))
    assert status == 1
    assert "nope.tvp:1:1: error: cannot read file" in out


def test_directory_without_plans_is_a_usage_error(lint, tmp_path: Path) -> None:
    status, out, err = lint(str(tmp_path))
    assert (status, out) == (2, "")
    assert f"no .tvp files under {tmp_path}" in err


def test_linter_crash_is_one_line_exit_2(lint, tmp_path: Path) -> None:
    file = write(tmp_path / "a.tvp", "CRASH\n")
    status, _, err = lint(file, write(tmp_path / "b.tvp", "BAD\n"))
    assert status == 2
    assert err.strip() == (f"tvp lint: internal error while linting {file}: "
                           "RuntimeError: linter bug")
    assert "Traceback" not in err


def test_a_linter_that_cannot_load_is_exit_2_without_traceback(lint, tmp_path: Path,
                                                              monkeypatch) -> None:
    def broken() -> None:
        raise ImportError("cannot import name 'lint_file'")

    monkeypatch.setattr(lint_cmd, "default_linter", broken)
    status, out, err = lint(write(tmp_path / "a.tvp", "plan a\n"))
    assert (status, out) == (2, "")
    assert err == ("tvp lint: internal error: cannot load the linter: "
                   "cannot import name 'lint_file'\n")


def test_json_format(lint, tmp_path: Path) -> None:
    status, out, _ = lint(write(tmp_path / "a.tvp", "BAD\n"), "--format", "json")
    document = json.loads(out)
    assert status == 1
    assert [d["code"] for d in document["diagnostics"]] == ["TVP990"]
    assert document["summary"]["errors"] == 1


def test_sarif_format_is_valid_with_relative_uris(lint, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "plans" / "a.tvp", "BAD\n")
    status, out, _ = lint(str(tmp_path / "plans"), "--format", "sarif")
    log = json.loads(out)
    validate(log)
    location = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]
    assert (status, location["artifactLocation"]["uri"]) == (1, "plans/a.tvp")


def test_github_format_puts_the_summary_on_stderr(lint, tmp_path: Path) -> None:
    status, out, err = lint(write(tmp_path / "a.tvp", "x BAD\n"), "--format", "github")
    assert status == 1
    assert out.startswith("::error file=") and out.count("\n") == 1
    assert err == "1 error, 0 warnings in 1 file (1 file checked)\n"


@pytest.mark.parametrize(("choice", "coloured"), [("always", True), ("never", False),
                                                  ("auto", False)])
def test_colour_choice(lint, tmp_path: Path, choice: str, coloured: bool) -> None:
    _, out, _ = lint(write(tmp_path / "a.tvp", "BAD\n"), "--color", choice)
    assert ("\x1b[" in out) is coloured


def test_use_color_auto_follows_the_terminal_and_no_color(monkeypatch) -> None:
    class Terminal:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert lint_cmd.use_color("auto", Terminal())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not lint_cmd.use_color("auto", Terminal())
    assert lint_cmd.use_color("always", Terminal())


def test_bad_format_is_a_usage_error(lint) -> None:
    with pytest.raises(SystemExit) as stopped:
        lint("a.tvp", "--format", "xml")
    assert stopped.value.code == 2


# ---------------------------------------------------------------- with the real linter


def real_linter_available() -> bool:
    import trainverify_dsl.plan as plan

    return hasattr(plan, "lint_file")


needs_linter = pytest.mark.skipif(not real_linter_available(),
                                  reason="trainverify_dsl.plan.lint_file not available yet")

IMPORT_CHECK = """
import sys
from trainverify_dsl.cli.main import main
status = main(["lint", sys.argv[1], "--format", "json"])
heavy = sorted(m for m in ("torch", "z3") if m in sys.modules)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
sys.exit(status)
"""


@needs_linter
def test_lint_imports_neither_torch_nor_z3(tmp_path: Path) -> None:
    plan = write(tmp_path / "a.tvp", "plan demo\nmesh dp=2, tp=2\n")
    done = subprocess.run([sys.executable, "-c", IMPORT_CHECK, plan], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert "HEAVY=\n" in done.stderr, done.stderr
    assert done.returncode in (0, 1), done.stderr
    json.loads(done.stdout)


@needs_linter
def test_real_missing_file_is_a_diagnostic_not_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "trainverify_dsl", "lint",
                           str(tmp_path / "nope.tvp"), "--format", "json"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stderr
    (diagnostic,) = json.loads(done.stdout)["diagnostics"]
    assert diagnostic["file"].endswith("nope.tvp")
    assert "Traceback" not in done.stderr


@needs_linter
def test_benchmark_plan_lints_clean(tmp_path: Path) -> None:
    """bench/lint_bench.py must time a clean plan (every form: explicit, for, apply)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lint_bench", ROOT / "bench" / "lint_bench.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    text, n_layers = bench.generate_plan(600)
    assert n_layers >= 40 and "for l in layers[20:30]:" in text
    assert text.count("\n") >= 600
    assert "apply block_sp(layers.30, tp)" in text
    outcome = lint_cmd.lint_paths([write(tmp_path / "bench.tvp", text)])
    assert outcome.failures == ()
    assert outcome.report.diagnostics == ()


@needs_linter
def test_real_lint_text_output_points_at_the_mistake(tmp_path: Path) -> None:
    plan = write(tmp_path / "a.tvp", "plan demo\nmesh dp=2, tp=2\nsplit tokens [dq, -]\n")
    done = subprocess.run([sys.executable, "-m", "trainverify_dsl", "lint", plan,
                           "--color", "always"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 1, done.stderr
    plain = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout).splitlines()
    assert re.fullmatch(rf"{re.escape(plan)}:3:15: error: .*'dq'.* \[TVP\d{{3}}\]", plain[0])
    assert plain[1:3] == ["    split tokens [dq, -]", "                  ^~"]
    assert plain[-1].startswith("1 error")
    assert "\x1b[1;31merror:" in done.stdout


@pytest.mark.parametrize("fmt", ["sarif", "json"])
def test_a_folder_without_plans_still_writes_a_document(
        tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`tvp lint --format sarif empty/ > results.sarif` left an empty file for the CI
    upload to choke on; it is an empty report now (still exit 2, the reason on stderr)."""
    from trainverify_dsl.cli.main import main

    assert main(["lint", "--format", fmt, str(tmp_path)]) == 2
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    if fmt == "sarif":
        validate(document)
        assert document["runs"][0]["results"] == []
    assert "no .tvp files under" in captured.err
