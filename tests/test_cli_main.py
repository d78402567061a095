"""The ``tvp`` dispatcher: --version, no command, unknown command, subcommand help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainverify_dsl import __version__
from trainverify_dsl.cli.main import SUBCOMMANDS, main

ROOT = Path(__file__).resolve().parent.parent


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"tvp {__version__}\n"


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "usage: tvp" in captured.err
    for name in SUBCOMMANDS:
        assert name in captured.err


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["frobnicate"])
    assert stopped.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["lint", "fmt", "explain"])
def test_subcommand_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main([command, "--help"])
    assert stopped.value.code == 0
    assert f"usage: tvp {command}" in capsys.readouterr().out


def test_module_entry_point_in_a_subprocess() -> None:
    done = subprocess.run([sys.executable, "-m", "trainverify_dsl", "--version"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, f"tvp {__version__}\n"), done.stderr
    done = subprocess.run([sys.executable, "-m", "trainverify_dsl"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr


def test_a_command_imports_its_own_module_only() -> None:
    """Start-up: ``tvp lint`` configures (and so imports) the lint module and no other."""
    check = ("import sys\nfrom trainverify_dsl.cli.main import main\n"
             "try:\n    main(['lint', '--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith('trainverify_dsl.cli.')))")
    done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "['trainverify_dsl.cli.lint_cmd', " \
        "'trainverify_dsl.cli.main']"


@pytest.mark.parametrize(("argv", "says"), [
    (["check", "--seed", "-1"], "-1 is not a seed"),
    (["simulate", "--seed", "x"], "'x' is not a whole number"),
    (["run-distributed", "--seed", str(2**32)], "is not a seed"),
    (["check", "--timeout", "-5"], "not a number of seconds"),
    (["check", "--timeout", "0"], "not a positive number of seconds"),
])
def test_bad_numbers_on_the_command_line_are_usage_errors(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A negative seed was an internal error from numpy after the layout pass ran; a negative
    solver timeout was taken as given."""
    with pytest.raises(SystemExit) as exited:
        main([*argv, str(ROOT / "plans" / "mlp_tiny_dp.tvp")])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_a_reader_that_goes_away_gets_no_traceback(tmp_path: Path) -> None:
    """`tvp check --format json ... | head -c 0`: the pipe is closed before the command
    writes (it is still starting), and the closed pipe ends it quietly."""
    plan = tmp_path / "missing.tvp"
    proc = subprocess.Popen([sys.executable, "-m", "trainverify_dsl", "check", "--format",
                             "json", str(plan)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 2
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_a_symlink_loop_is_a_diagnostic_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loop = tmp_path / "self.tvp"
    loop.symlink_to(loop)
    for fmt in ("text", "json", "sarif"):
        assert main(["lint", "--format", fmt, str(loop)]) == 1
        out = capsys.readouterr().out
        assert "TVP109" in out and "Traceback" not in out


def test_an_unexpected_error_of_a_command_is_an_internal_error_exit_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A bug that reaches `main` (an outside user saw `tvp run-distributed` print a raw
    traceback and exit 1, which reads as "differs") is one line on stderr and exit 2."""
    from trainverify_dsl.cli import run_distributed_cmd

    def broken(args: object) -> int:
        raise AttributeError("'tuple' object has no attribute 'numerator'")

    monkeypatch.setattr(run_distributed_cmd, "run", broken)
    assert main(["run-distributed", "plans/mlp_tiny_dp.tvp"]) == 2
    captured = capsys.readouterr()
    assert "tvp run-distributed: internal error: AttributeError:" in captured.err
    assert "please report it" in captured.err and "Traceback" not in captured.err
    assert captured.out == ""
    # with --format json, stdout is still one JSON document (it was empty)
    assert main(["run-distributed", "--format", "json", "plans/mlp_tiny_dp.tvp"]) == 2
    document = json.loads(capsys.readouterr().out)
    assert document["verdict"] == "error" and "AttributeError" in document["error"]
