"""``tvp lint FILE_OR_DIR...``: syntax, names, layouts; never imports torch or z3.

Plain ``tvp lint`` never imports or runs a model file. ``--spec`` does (the model file is
Python code), so the file must lie inside the plan's folder, the project root or the stdlib
unless ``--allow-model-outside-root`` is given (TVP310).

``--spec`` adds the layout pass (docs/lowering.md): each plan that lints clean is lowered
against the spec model its ``spec`` line names (on fake tensors, at full size), reporting
names that bind to nothing, splits that do not divide the real sizes, partial sums fed to
nonlinear ops, collectives that do not fit their tensor's layout, false layout claims and
stage orders against the data flow (TVP4xx). That imports torch and traces the model, so it
is opt-in: plain ``tvp lint`` stays fast and torch-free for editors.

Directories are searched recursively for ``*.tvp`` files (hidden directories skipped);
files named explicitly are linted whatever their extension; a path that does not exist is
handed to the linter, which reports it as a diagnostic. Output goes to stdout:

    text    diagnostics, then the summary line (``no issues found in N files`` when clean)
    json    one JSON document (report/render/json_format.py), no separate summary
    sarif   one SARIF 2.1.0 log (report/render/sarif.py)
    github  workflow commands only; the summary line goes to stderr

Exit codes: 0 no errors (warnings and notes allowed), 1 at least one error, 2 usage error
(argparse), no ``.tvp`` file found, or an internal error while linting a file (reported on
stderr as one line, never a traceback).

An internal error (any unexpected exception while linting a file, in the layout pass of
``--spec`` too) is never reported as success, in any format: the other files are still
linted, and the crashed file is counted as an error (``1 error (1 internal error), ...`` in
the text summary), listed under ``internal_errors`` in JSON, makes SARIF's
``invocations[0].executionSuccessful`` false with a tool execution notification, and gets a
file-level ``::error`` in the github format.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from trainverify_dsl.report.diagnostics import Diagnostic, Severity
from trainverify_dsl.report.render import (
    FORMATS,
    FileSources,
    InternalError,
    LintReport,
    render,
    summarize,
    summary_line,
)

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2

PLAN_SUFFIX = ".tvp"
COLOR_CHOICES = ("auto", "always", "never")

Linter = Callable[[str], Sequence[Diagnostic]]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="FILE_OR_DIR",
                        help="plan files, or directories searched for *.tvp")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="output format (default: text)")
    add_color_option(parser)
    parser.add_argument("--spec", action="store_true",
                        help="also run the layout pass against the plan's spec model "
                             "(imports torch and runs the model file's code; TVP4xx)")
    add_model_root_option(parser)


def positive_int(text: str) -> int:
    """An argument that must be a positive integer (argparse ``type``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def seed(text: str) -> int:
    """A random seed: a whole number from 0 to 2**32 - 1 (numpy's seeds; argparse ``type``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"{value} is not a seed (0 to 2**32 - 1)")
    return value


def add_color_option(parser: argparse.ArgumentParser) -> None:
    """``--color auto|always|never``, shared by the commands with text output (``use_color``)."""
    parser.add_argument("--color", choices=COLOR_CHOICES, default="auto",
                        help="colour text output: auto (on a terminal, unless NO_COLOR is set; "
                             "FORCE_COLOR colours a pipe too), always, never")


def add_model_root_option(parser: argparse.ArgumentParser) -> None:
    """``--allow-model-outside-root``, shared by the commands that import model files."""
    parser.add_argument("--allow-model-outside-root", action="store_true",
                        help="import a model file even if it lies outside the plan's folder, "
                             "the project and the stdlib (it runs as Python code: only for "
                             "files you trust)")


@dataclass(frozen=True, slots=True)
class LintRun:
    #: the files the linter crashed on are ``report.internal_errors`` (exit 2)
    report: LintReport

    @property
    def failures(self) -> tuple[str, ...]:
        """One stderr line per file the linter crashed on."""
        return tuple(f"tvp lint: internal error while linting {failure.file}: "
                     f"{failure.message}" for failure in self.report.internal_errors)


def run(args: argparse.Namespace) -> int:
    files, empty_dirs = collect_plan_files(args.paths)
    for directory in empty_dirs:
        print(f"tvp lint: no {PLAN_SUFFIX} files under {directory}", file=sys.stderr)
    if not files:
        if args.format in ("json", "sarif"):  # stdout stays a document (a CI upload reads it)
            _write(sys.stdout, render(args.format, LintReport.of((), ()), FileSources(),
                                      color=False, root=os.getcwd()))
        return EXIT_USAGE
    from trainverify_dsl.cli.progress import phases

    spec = getattr(args, "spec", False)
    # the layout pass imports torch and lowers at full size (tens of seconds for the paper
    # plans): on a terminal with text output a status line names the file and the phase
    with phases(spec and args.format == "text") as progress:
        try:
            linter = default_linter()
            if spec:
                linter = with_layout_pass(linter, allow_model_outside_root=getattr(
                    args, "allow_model_outside_root", False), progress=progress)
        except Exception as error:  # a broken install must not print a traceback either
            print(f"tvp lint: internal error: cannot load the linter: {error}",
                  file=sys.stderr)
            return EXIT_USAGE
        outcome = lint_paths(files, linter)
    color = use_color(args.color, sys.stdout)
    rendered = render(args.format, outcome.report, FileSources(), color=color,
                      root=os.getcwd())
    _write(sys.stdout, rendered)
    if args.format == "github":
        _write(sys.stderr, summary_line(summarize(outcome.report)) + "\n")
    for failure in outcome.failures:
        print(failure, file=sys.stderr)
    return exit_code(outcome)


def exit_code(outcome: LintRun) -> int:
    if outcome.report.internal_errors:
        return EXIT_USAGE
    has_errors = any(d.severity is Severity.ERROR for d in outcome.report.diagnostics)
    return EXIT_FINDINGS if has_errors else EXIT_CLEAN


def lint_paths(files: Iterable[str], linter: Linter | None = None) -> LintRun:
    """Lint each file in process; a crash in the linter becomes a failure line, not a raise."""
    lint = linter or default_linter()
    diagnostics: list[Diagnostic] = []
    failures: list[InternalError] = []
    checked: list[str] = []
    for file in files:
        checked.append(file)
        try:
            diagnostics.extend(lint(file))
        except Exception as error:  # a linter bug must not print a traceback
            failures.append(InternalError(file, f"{type(error).__name__}: {error}"))
    return LintRun(LintReport.of(diagnostics, checked, failures))


def default_linter() -> Linter:
    """``plan.lint_file`` (parse + resolve + semantic checks)."""
    from trainverify_dsl.plan import lint_file

    return lint_file


def render_diagnostics(diagnostics: list[Diagnostic], files: list[str], fmt: str, *,
                       color: bool = False, failures: Sequence[InternalError] = ()) -> str:
    """Diagnostics of other commands (``tvp simulate``, ``tvp check``) in lint's formats;
    ``color`` applies to text; ``failures``: files the command could not handle (an
    internal error: SARIF's execution is unsuccessful, GitHub gets an error annotation)."""
    report = LintReport.of(diagnostics, files, failures)
    return render(fmt, report, FileSources(), color=color, root=os.getcwd())


def with_layout_pass(linter: Linter, *, allow_model_outside_root: bool = False,
                     progress: Callable[[str], None] | None = None) -> Linter:
    """``linter``, then (for plans without errors) the layout pass against the spec. It
    imports the plan's model file, confined to the plan's folder, the project and the stdlib
    unless ``allow_model_outside_root``. ``progress`` hears each phase, named with the file."""

    def lint(file: str) -> Sequence[Diagnostic]:
        found = list(linter(file))
        if any(d.severity is Severity.ERROR for d in found):
            return found
        import warnings

        from trainverify_dsl.api import layout_diagnostics

        def phase(name: str) -> None:
            if progress is not None:
                progress(f"{file}: {name}")

        from trainverify_dsl.cli.progress import model_output_to_stderr

        # torch's own deprecations are not the user's problem; the model's prints not ours
        with warnings.catch_warnings(), model_output_to_stderr():
            warnings.simplefilter("ignore", FutureWarning)
            return found + layout_diagnostics(
                file, allow_model_outside_root=allow_model_outside_root, progress=phase)

    return lint


def collect_plan_files(paths: Iterable[str]) -> tuple[list[str], list[str]]:
    """(files to lint in order, without duplicates; directories holding no plan file)."""
    files: dict[str, None] = {}
    seen: set[Path] = set()
    empty: list[str] = []
    for given in paths:
        found = _plan_files_under(given) if Path(given).is_dir() else [given]
        if not found:
            empty.append(given)
        for file in found:
            try:
                key = Path(file).resolve()
            except (OSError, RuntimeError):  # a symlink loop: the linter reports the file
                key = Path(os.path.abspath(file))
            if key not in seen:
                seen.add(key)
                files[file] = None
    return list(files), empty


def _plan_files_under(directory: str) -> list[str]:
    found: list[str] = []
    for parent, subdirs, names in os.walk(directory):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        found += [os.path.join(parent, n) for n in sorted(names) if n.endswith(PLAN_SUFFIX)]
    return found


def use_color(choice: str, stream: TextIO) -> bool:
    """``always``/``never`` as said. ``auto`` as ruff, pytest and rich read the environment
    (no-color.org, force-color.org): no colour when ``NO_COLOR`` is set and not empty, colour
    when ``FORCE_COLOR`` is (a CI log, which is no terminal, but shows colours), else colour on
    a terminal only. Read here, at the command line's edge, and passed on as a flag."""
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _write(stream: TextIO, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        # The reader went away (``tvp lint ... | head``): nothing left to say.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
