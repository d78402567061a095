"""Progress of `tvp simulate`: the driver names each phase through a callback, in order; the
CLI shows it as a rich status only on a terminal in text mode, and adds nothing to a pipe or
to JSON output."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from trainverify_dsl.api import simulate_file
from trainverify_dsl.cli.progress import phases

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "plans" / "mlp_tiny_dp.tvp"
PHASES = ["layout pass at full size", "shrinking the model's widths",
          "lowering the plan to its parallel program", "tracing the reference step",
          "evaluating the reference step", "checking the reference step against eager torch",
          "evaluating the parallel program on 2 ranks and comparing"]


def test_the_driver_names_every_phase_in_order() -> None:
    seen: list[str] = []
    result = simulate_file(PLAN, progress=seen.append)
    assert result.agrees and seen == PHASES


def test_a_terminal_shows_the_phases() -> None:
    stream = io.StringIO()
    with phases(True, stream, force_terminal=True) as progress:
        progress("tracing the reference step")
    assert "tracing the reference step" in stream.getvalue()


def test_a_pipe_or_json_shows_nothing() -> None:
    for enabled, terminal in ((True, False), (False, True)):
        stream = io.StringIO()
        with phases(enabled, stream, force_terminal=terminal) as progress:
            progress("tracing the reference step")
        assert stream.getvalue() == ""


def test_simulate_through_a_pipe_prints_one_json_document_and_a_quiet_stderr() -> None:
    done = subprocess.run([sys.executable, "-m", "trainverify_dsl", "simulate", "--format",
                           "json", str(PLAN)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verdict"] == "agrees"
    assert done.stderr == ""


def test_the_layout_pass_names_its_phases_with_the_file() -> None:
    """`tvp lint --spec` hands a callback to the layout pass; each phase names the file."""
    from trainverify_dsl.cli.lint_cmd import default_linter, with_layout_pass

    seen: list[str] = []
    lint = with_layout_pass(default_linter(), progress=seen.append)
    assert list(lint(str(PLAN))) == []
    assert seen == [f"{PLAN}: building the model at full size on fake tensors",
                    f"{PLAN}: lowering every stage at full size (the layout pass)",
                    f"{PLAN}: looking for sizes the model reads as numbers"]


def test_spec_and_lint_spec_through_a_pipe_add_nothing_to_stderr() -> None:
    for command in (["lint", "--spec", str(PLAN)],
                    ["spec", "stdlib/models/mlp.py:MLP", "--config", "mlp_tiny"]):
        done = subprocess.run([sys.executable, "-m", "trainverify_dsl", *command], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stderr == "", (command, done.stderr)


def test_the_seconds_count_up_while_a_phase_runs() -> None:
    """The line's "(N s)" was computed when the phase started, so a 45-second layout pass
    read "(3 s)" throughout (an outside user's terminal recording): it is rendered again at
    every refresh of the spinner now."""
    import re
    import time

    stream = io.StringIO()
    with phases(True, stream, force_terminal=True) as show:
        show("the layout pass")
        time.sleep(2.3)
    shown = {int(n) for n in re.findall(r"the layout pass \S*\((\d+) s\)", stream.getvalue())}
    assert {0, 1, 2} <= shown, shown
