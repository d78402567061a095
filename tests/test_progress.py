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
