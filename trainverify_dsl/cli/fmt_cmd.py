"""``tvp fmt FILE_OR_DIR... [--check] [--diff] [--force]``: canonical formatting, comments kept.

Without flags every file that is not canonical is rewritten in place, LF line endings.
``--check`` writes nothing and lists each file that would change; ``--diff`` writes nothing
and prints a unified diff to stdout; both may be combined. ``-`` reads a plan from stdin and
prints the formatted text to stdout. A file with syntax errors is never touched: its
diagnostics are printed (text format, on stderr) and it counts as failed. Before anything is
written, the formatted text is parsed again and must give the same AST as the original (spans
and comments aside); if not, the file is left alone and counts as failed.

Rewriting respects the file (``write_atomically``):

- a read-only file (no write permission in its mode, or none for this user) is refused with
  a located one-line error and counts as failed, unless ``--force`` is given; with
  ``--force`` it is rewritten and stays read-only;
- a symlink is written through: its target is reformatted and the link stays a link;
- the file keeps its inode, so hard links keep sharing the new text, and keeps its mode,
  owner, group and extended attributes: the new text is first written to a temporary file
  next to the target and fsynced, then copied into the original file, which is fsynced too.
  If that copy fails (a full disk), the original bytes are written back; a crash in the
  middle leaves the new text in the temporary ``.NAME.*`` file beside it.

Status lines (``reformatted F``, ``would reformat F``) and the summary line go to stderr,
so stdout holds only diffs or the formatted stdin.

Exit codes: 0 nothing to do (or everything rewritten), 1 a file failed (syntax error,
unreadable, read-only without ``--force``, cannot be written) or, under
``--check``/``--diff``, a file would change; 2 usage error.
"""
from __future__ import annotations

import argparse
import difflib
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import BinaryIO

from trainverify_dsl.cli.lint_cmd import PLAN_SUFFIX, collect_plan_files
from trainverify_dsl.report.render import LintReport, plural
from trainverify_dsl.report.render.text import render_diagnostic

EXIT_OK = 0
EXIT_CHANGES = 1
EXIT_USAGE = 2
STDIN = "-"


class Outcome(Enum):
    UNCHANGED = "unchanged"
    CHANGED = "changed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class FormatOptions:
    check: bool
    diff: bool
    #: Rewrite read-only files too.
    force: bool = False

    @property
    def writes(self) -> bool:
        return not (self.check or self.diff)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="FILE_OR_DIR",
                        help=f"plan files, directories searched for *{PLAN_SUFFIX}, or - (stdin)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if any file would be reformatted")
    parser.add_argument("--diff", action="store_true",
                        help="write nothing; print a unified diff of the changes")
    parser.add_argument("--force", action="store_true",
                        help="also rewrite read-only files (they stay read-only)")


def run(args: argparse.Namespace) -> int:
    options = FormatOptions(check=args.check, diff=args.diff, force=args.force)
    files, empty_dirs = collect_plan_files(p for p in args.paths if p != STDIN)
    for directory in empty_dirs:
        print(f"tvp fmt: no {PLAN_SUFFIX} files under {directory}", file=sys.stderr)
    outcomes = [format_stdin(options)] if STDIN in args.paths else []
    if not files and not outcomes:
        return EXIT_USAGE
    outcomes += [format_path(file, options) for file in files]
    print(fmt_summary(outcomes, options), file=sys.stderr)
    return fmt_exit_code(outcomes, options)


def fmt_exit_code(outcomes: list[Outcome], options: FormatOptions) -> int:
    if Outcome.FAILED in outcomes:
        return EXIT_CHANGES
    if Outcome.CHANGED in outcomes and not options.writes:
        return EXIT_CHANGES
    return EXIT_OK


def fmt_summary(outcomes: list[Outcome], options: FormatOptions) -> str:
    changed = outcomes.count(Outcome.CHANGED)
    unchanged = outcomes.count(Outcome.UNCHANGED)
    failed = outcomes.count(Outcome.FAILED)
    verb = "reformatted" if options.writes else "would be reformatted"
    parts = [f"{plural(changed, 'file')} {verb}", f"{plural(unchanged, 'file')} unchanged"]
    if failed:
        parts.append(f"{plural(failed, 'file')} failed")
    return ", ".join(parts)


def format_path(file: str, options: FormatOptions) -> Outcome:
    original = read_plan(file)
    if original is None:
        return Outcome.FAILED
    formatted = format_text(original, file)
    if formatted is None:
        return Outcome.FAILED
    if formatted == original:
        return Outcome.UNCHANGED
    if options.diff:
        sys.stdout.write(unified_diff(original, formatted, file))
    if options.check:
        print(f"would reformat {file}", file=sys.stderr)
    if options.writes:
        return write_formatted(file, formatted, options)
    return Outcome.CHANGED


def write_formatted(file: str, formatted: str, options: FormatOptions) -> Outcome:
    """Rewrite ``file``; a read-only file only under ``--force``."""
    if not options.force and is_read_only(Path(file)):
        print(f"{file}:1:1: error: the file is read-only; not reformatted "
              "(--force rewrites it)", file=sys.stderr)
        return Outcome.FAILED
    try:
        write_atomically(Path(file), formatted)
    except OSError as error:
        print(f"tvp fmt: cannot write {file}: {_reason(error)}", file=sys.stderr)
        return Outcome.FAILED
    print(f"reformatted {file}", file=sys.stderr)
    return Outcome.CHANGED


def is_read_only(path: Path) -> bool:
    """No write bit in the target's mode, or no write access for this user. The mode is
    checked as well because ``os.access`` says yes to root for any file."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False  # the write reports why
    return not stat.S_IMODE(mode) & 0o222 or not os.access(path, os.W_OK)


def read_plan(file: str) -> str | None:
    """The file's text with universal newlines, or ``None`` after printing why it cannot be
    formatted (missing, not a regular file, binary, not UTF-8), located like lint does."""
    from trainverify_dsl.parse import read_source

    text, problems = read_source(file)
    if problems:
        sources = {file: text}.get
        for diagnostic in problems:
            sys.stderr.write(render_diagnostic(diagnostic, sources, color=False))
        print(f"tvp fmt: cannot read {file}", file=sys.stderr)
        return None
    assert text is not None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def format_stdin(options: FormatOptions) -> Outcome:
    original = sys.stdin.read()
    formatted = format_text(original, "<stdin>")
    if formatted is None:
        return Outcome.FAILED
    if options.diff and formatted != original:
        sys.stdout.write(unified_diff(original, formatted, "<stdin>"))
    elif not options.check:
        sys.stdout.write(formatted)
    return Outcome.UNCHANGED if formatted == original else Outcome.CHANGED


def format_text(text: str, file: str) -> str | None:
    """The canonical text, or ``None`` after saying on stderr why there is none."""
    from trainverify_dsl.parse import format_source
    from trainverify_dsl.parse.format import same_meaning

    result = format_source(text, file)
    if result.text is None:
        sources = {file: text}.get
        for diagnostic in LintReport.of(result.diagnostics, [file]).diagnostics:
            sys.stderr.write(render_diagnostic(diagnostic, sources, color=False))
        print(f"tvp fmt: {file} not formatted: it has syntax errors", file=sys.stderr)
        return None
    if result.text != text and not same_meaning(text, result.text, file):
        print(f"tvp fmt: internal error: formatting {file} would change its meaning; "
              "left unchanged (please report this plan)", file=sys.stderr)
        return None
    return result.text


def unified_diff(original: str, formatted: str, file: str) -> str:
    lines = difflib.unified_diff(original.splitlines(keepends=True),
                                 formatted.splitlines(keepends=True),
                                 fromfile=_diff_name("a", file), tofile=_diff_name("b", file))
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)


def _diff_name(prefix: str, file: str) -> str:
    """``a/plans/x.tvp`` for relative paths (``patch -p1`` style); absolute paths as given."""
    return file if os.path.isabs(file) else f"{prefix}/{file}"


def write_atomically(path: Path, text: str) -> None:
    """Replace the content of ``path`` (or of the file a symlink points to) with ``text``,
    keeping the inode: hard links, mode, owner and extended attributes survive. Never called
    before formatting succeeded. The new bytes go to a temporary file beside the target and
    are fsynced first; then they are copied over the original, which is fsynced. A failed copy
    writes the original bytes back; a crash during it leaves the temporary file behind."""
    target = Path(os.path.realpath(path))
    data = text.encode("utf-8")
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        with _writable(target):
            _overwrite(target, data)
    finally:
        Path(temporary).unlink(missing_ok=True)


def _overwrite(target: Path, data: bytes) -> None:
    with open(target, "r+b") as handle:
        original = handle.read()
        try:
            _put(handle, data)
        except BaseException:
            _put(handle, original)
            raise


def _put(handle: BinaryIO, data: bytes) -> None:
    handle.seek(0)
    handle.write(data)
    handle.truncate()
    handle.flush()
    os.fsync(handle.fileno())


@contextmanager
def _writable(target: Path) -> Iterator[None]:
    """Give the owner write permission for the copy (only needed under ``--force``), then
    restore the mode exactly."""
    mode = stat.S_IMODE(target.stat().st_mode)
    if mode & stat.S_IWUSR:
        yield
        return
    os.chmod(target, mode | stat.S_IWUSR)
    try:
        yield
    finally:
        os.chmod(target, mode)


def _reason(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error)
