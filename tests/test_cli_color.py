"""Colour and progress on a terminal, plain text everywhere else.

On a terminal (`--color auto`, the default) `tvp lint`, `tvp simulate` and `tvp check` style
their text: locations bold, severities and verdicts in their colours, the `^~~~` marker in its
severity's. Stripped of its escape codes, coloured output is exactly the plain output, which
is what a pipe, `--color never` and `NO_COLOR` give. `FORCE_COLOR` colours a pipe (CI logs).
Long commands show their phase on a terminal's stderr, and nothing with `--format json`.
"""

from __future__ import annotations

import errno
import io
import os
import pty
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trainverify_dsl.check.verdict import Counterexample, Verdict
from trainverify_dsl.cli import check_cmd, lint_cmd, simulate_cmd
from trainverify_dsl.cli.main import main
from trainverify_dsl.report.codes_plan import UNKNOWN_MESH_AXIS
from trainverify_dsl.report.codes_run import INCONCLUSIVE
from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.span import Span

ROOT = Path(__file__).resolve().parent.parent
GOOD = ROOT / "plans" / "mlp_tiny_dp.tvp"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip(text: str) -> str:
    return ANSI.sub("", text)


def _on_a_terminal(args: list[str], env: dict[str, str] | None = None,
                   stream: str = "stdout") -> tuple[str, str]:
    """Run `python -m trainverify_dsl ARGS` with ``stream`` (stdout or stderr) on a pseudo
    terminal and the other one on a pipe: (what the terminal got, what the pipe got)."""
    controller, terminal = pty.openpty()
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, stream: terminal}
    with subprocess.Popen([sys.executable, "-m", "trainverify_dsl", *args], cwd=ROOT,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
                          **streams) as process:
        os.close(terminal)
        pipe = process.stderr if stream == "stdout" else process.stdout
        with ThreadPoolExecutor(1) as pool:  # drain the pipe while the terminal is read
            piped = pool.submit(pipe.read)
            seen = _read_all(controller)
            process.wait(timeout=300)
            return seen.replace("\r\n", "\n"), piped.result().decode("utf-8")


def _read_all(controller: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError as error:  # EIO: every writer closed the terminal
            if error.errno != errno.EIO:
                raise
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    return b"".join(chunks).decode("utf-8")


def _piped(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainverify_dsl", *args], cwd=ROOT,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def bad_plan(tmp_path: Path) -> Path:
    plan = tmp_path / "bad.tvp"
    plan.write_text(GOOD.read_text(encoding="utf-8").replace("over dp op=avg", "over dq op=avg"),
                    encoding="utf-8")
    return plan


# ---------------------------------------------------------------- tvp lint on a real terminal


def test_lint_on_a_terminal_is_coloured_and_stripped_is_the_piped_text(bad_plan: Path) -> None:
    coloured, _ = _on_a_terminal(["lint", str(bad_plan)])
    piped = _piped(["lint", str(bad_plan)])
    assert piped.returncode == 1 and "\x1b[" not in piped.stdout
    assert f"\x1b[1m{bad_plan}:18:30:\x1b[0m \x1b[1;31merror:\x1b[0m" in coloured  # headline
    assert "\x1b[1;31m^~\x1b[0m" in coloured  # the marker, in the severity's colour
    assert strip(coloured) == piped.stdout


def test_no_color_on_a_terminal_and_never_give_the_plain_text(bad_plan: Path) -> None:
    piped = _piped(["lint", str(bad_plan)]).stdout
    assert _on_a_terminal(["lint", str(bad_plan)], {"NO_COLOR": "1"})[0] == piped
    assert _on_a_terminal(["lint", "--color", "never", str(bad_plan)])[0] == piped


def test_force_color_colours_a_pipe_but_no_color_wins(bad_plan: Path) -> None:
    forced = _piped(["lint", str(bad_plan)], {"FORCE_COLOR": "1"}).stdout
    plain = _piped(["lint", str(bad_plan)]).stdout
    assert "\x1b[1;31merror:" in forced and strip(forced) == plain
    assert _piped(["lint", str(bad_plan)], {"FORCE_COLOR": "1", "NO_COLOR": "1"}).stdout == plain


class _Stream(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.mark.parametrize(("choice", "environment", "terminal", "expected"), [
    ("auto", {}, True, True),
    ("auto", {}, False, False),
    ("auto", {"NO_COLOR": "1"}, True, False),
    ("auto", {"NO_COLOR": ""}, True, True),  # set but empty: no-color.org says ignore it
    ("auto", {"FORCE_COLOR": "1"}, False, True),
    ("auto", {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False, False),
    ("always", {"NO_COLOR": "1"}, False, True),
    ("never", {"FORCE_COLOR": "1"}, True, False),
])
def test_use_color(choice: str, environment: dict[str, str], terminal: bool, expected: bool,
                   monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert lint_cmd.use_color(choice, _Stream(terminal)) is expected


# ---------------------------------------------------------------- tvp simulate


@pytest.mark.parametrize("plan", [GOOD, ROOT / "plans" / "bugs" /
                                  "grad_sync_before_last_microbatch.tvp"])
def test_simulate_colours_its_verdict_and_locations(plan: Path) -> None:
    from trainverify_dsl.api import simulate_file

    result = simulate_file(plan)
    plain = simulate_cmd._text(str(plan), result)
    coloured = simulate_cmd._text(str(plan), result, color=True)
    assert "\x1b[" not in plain and strip(coloured) == plain
    if result.agrees:
        assert "\x1b[1;32magrees with the spec\x1b[0m" in coloured
    else:
        assert "\x1b[1;31mDIFFERS from the spec\x1b[0m" in coloured
        line = next(n for n, text in enumerate(plan.read_text().splitlines(), 1)
                    if "# BUG" in text)
        assert f"  \x1b[1m{plan}:{line}:1:\x1b[0m grad(fc1.weight) on rank 0" in coloured


def test_simulate_color_option(capsys: pytest.CaptureFixture[str]) -> None:
    """`--color always` reaches the refusal's diagnostics too; through a pipe `auto` is
    plain."""
    refused = str(ROOT / "plans" / "bugs" / "sum_instead_of_avg.tvp")
    assert main(["simulate", "--color", "always", refused]) == 1
    coloured = capsys.readouterr().out
    assert main(["simulate", refused]) == 1
    plain = capsys.readouterr().out
    assert "\x1b[1;31merror:\x1b[0m" in coloured and "\x1b[" not in plain
    assert strip(coloured) == plain


# ---------------------------------------------------------------- tvp check


def _verdicts() -> list[Verdict]:
    span = Span("plans/p.tvp", 7, 3, 7, 12)
    found = Diagnostic(UNKNOWN_MESH_AXIS, "unknown mesh axis 'dq'", span)
    warning = Diagnostic(INCONCLUSIVE, "a warning", span)
    counterexample = Counterexample("gradients", "grad(w)", 1, 0.5, span, detail="2x")
    return [
        Verdict("verified", "plans/a.tvp", reason="61 elements", assumptions=["real numbers"],
                seconds=3.81, elements=61, by_normal_form=60, by_solver=1),
        Verdict("counterexample", "plans/[b].tvp", reason="differs", seconds=1.0,
                counterexample=counterexample),
        Verdict("inconclusive", "plans/c.tvp", reason="time limit", seconds=600.0,
                open=[(f"stage {n}", "z3 said unknown") for n in range(7)],
                assumptions=["real numbers"]),
        Verdict("error", "plans/p.tvp", reason="the plan has errors",
                diagnostics=[found, warning]),
    ]


def test_check_text_coloured_is_the_plain_text_with_styles() -> None:
    for verdict in _verdicts():
        plain = check_cmd.text(verdict)
        coloured = check_cmd.text(verdict, color=True)
        assert "\x1b[" not in plain and "\x1b[" in coloured
        assert strip(coloured) == plain
    error = check_cmd.text(_verdicts()[-1], color=True)
    assert "\x1b[1mplans/p.tvp:7:3:\x1b[0m \x1b[1;31merror:\x1b[0m unknown mesh axis" in error
    assert "\x1b[1;33mwarning:\x1b[0m" in error and "\x1b[2m[TVP207]\x1b[0m" in error


def test_check_summary_table_is_aligned_and_coloured_only_on_request(
        capsys: pytest.CaptureFixture[str]) -> None:
    check_cmd.summary(_verdicts(), color=False)
    plain = capsys.readouterr().out
    check_cmd.summary(_verdicts(), color=True)
    coloured = capsys.readouterr().out
    assert "\x1b[" not in plain and "plans/[b].tvp" in plain  # a plan name is not markup
    assert strip(coloured) == plain
    assert "\x1b[1;32mverified" in coloured and "\x1b[1;31mcounterexample" in coloured
    rows = [line for line in plain.splitlines() if "plans/" in line]
    assert len(rows) == 4 and len({len(row) for row in rows}) == 1  # aligned columns


# ---------------------------------------------------------------- progress


def test_spec_shows_its_phases_on_a_terminal_and_nothing_in_json() -> None:
    model = ["spec", "stdlib/models/mlp.py:MLP", "--config", "mlp_tiny"]
    shown, stdout = _on_a_terminal(model, stream="stderr")
    assert "tracing the training step" in shown
    assert stdout.startswith("model ")
    quiet, stdout = _on_a_terminal([*model, "--format", "json"], stream="stderr")
    assert quiet == "" and stdout.startswith("{")


def test_lint_spec_shows_its_phases_on_a_terminal() -> None:
    shown, stdout = _on_a_terminal(["lint", "--spec", str(GOOD)], stream="stderr")
    assert f"{GOOD}: lowering every stage at full size" in shown
    assert stdout == "no issues found in 1 file\n"
    quiet, _ = _on_a_terminal(["lint", "--spec", "--format", "json", str(GOOD)],
                              stream="stderr")
    assert quiet == ""


def test_check_shows_its_phases_on_a_terminal_and_keeps_a_pipe_plain() -> None:
    shown, stdout = _on_a_terminal(["check", str(GOOD)], stream="stderr")
    assert f"{GOOD}: layout pass at full size" in shown
    assert stdout.startswith(f"{GOOD}: VERIFIED (") and "\x1b[" not in stdout
