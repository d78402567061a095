"""The golden harness: every ``tests/golden/**/*.tvp`` carries its expected diagnostics inline.

Annotation syntax (at the end of the line the diagnostic is reported on)::

    split tokens [dq, -]          # E: unknown mesh axis 'dq' [TVP207]
    split x [tp, tp]              # E: axis 'tp' [TVP230] # W: [TVP233]
    mesh dp=2  # a plain comment may come first # E: mesh [TVP204]

- ``# E:`` expects an error, ``# W:`` a warning, ``# N:`` a note;
- the text up to ``[TVPnnn]`` is a substring the message must contain (it may be empty);
- several annotations may follow each other on one line; a plain comment may precede them;
- a diagnostic matches when its file is the golden file and line, severity and code are
  equal and its message contains the substring; a diagnostic reported past the last line
  (end of file) is matched against the last line;
- every produced diagnostic must be expected and every expectation produced: a file without
  annotations must lint clean.

Files are linted with ``trainverify_dsl.plan.lint_file`` (parse + resolve + semantic checks),
falling back to ``trainverify_dsl.parse.parse_file`` while the plan stage is missing. Only
``*.tvp`` files count (``tests/golden/ir/`` holds other golden data).

Regenerate after a deliberate change and review the result with ``git diff``::

    python tests/test_golden.py --update [FILE_OR_DIR ...]   # default: all golden files
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
ROOT = GOLDEN_DIR.parent.parent
if str(ROOT) not in sys.path:  # when run as a script
    sys.path.insert(0, str(ROOT))

from trainverify_dsl.report.diagnostics import Diagnostic, Severity  # noqa: E402

ANNOTATION = re.compile(r"#\s*(?P<kind>[EWN]):\s*(?P<text>.*?)\s*\[(?P<code>TVP\d{3})\]")
#: The run of annotations ending a line (after any plain comment).
ANNOTATION_TAIL = re.compile(r"\s*(?:#\s*[EWN]:.*?\[TVP\d{3}\]\s*)+$")
KINDS = {"E": Severity.ERROR, "W": Severity.WARNING, "N": Severity.NOTE}
LETTERS = {severity: kind for kind, severity in KINDS.items()}


@dataclass(frozen=True, slots=True)
class Expectation:
    line: int
    severity: Severity
    code: str
    text: str

    def __str__(self) -> str:
        return f"line {self.line}: # {LETTERS[self.severity]}: {self.text} [{self.code}]"

    def matches(self, diagnostic: Diagnostic, line: int) -> bool:
        return (line == self.line and diagnostic.severity is self.severity
                and diagnostic.code.id == self.code and self.text in diagnostic.message)


def parse_expectations(text: str) -> list[Expectation]:
    found = []
    for number, line in enumerate(text.split("\n"), start=1):
        tail = ANNOTATION_TAIL.search(line)
        if tail is None:
            continue
        for match in ANNOTATION.finditer(tail.group()):
            found.append(Expectation(number, KINDS[match["kind"]], match["code"],
                                     match["text"]))
    return found


def last_line(text: str) -> int:
    return max(1, len(text.rstrip("\n").split("\n")))


def diagnostic_line(diagnostic: Diagnostic, text: str) -> int:
    return min(diagnostic.span.line, last_line(text))


def compare(path: Path, text: str, diagnostics: Sequence[Diagnostic]) -> list[str]:
    """Mismatches as readable lines; empty when the diagnostics are exactly as annotated."""
    expected = parse_expectations(text)
    problems = []
    for diagnostic in diagnostics:
        if not _same_file(diagnostic.span.file, path):
            problems.append(f"unexpected (in another file): {_describe(diagnostic)}")
            continue
        line = diagnostic_line(diagnostic, text)
        match = next((e for e in expected if e.matches(diagnostic, line)), None)
        if match is None:
            problems.append(f"unexpected: {_describe(diagnostic)}")
        else:
            expected.remove(match)
    problems += [f"missing: {expectation}" for expectation in expected]
    return problems


def _same_file(file: str, path: Path) -> bool:
    try:
        return Path(file).resolve() == path.resolve()
    except OSError:
        return False


def _describe(diagnostic: Diagnostic) -> str:
    letter = LETTERS[diagnostic.severity]
    return f"{diagnostic.span}: # {letter}: {diagnostic.message} [{diagnostic.code.id}]"


def linter() -> Callable[[str], Sequence[Diagnostic]] | None:
    try:
        from trainverify_dsl.plan import lint_file
    except ImportError:
        try:
            from trainverify_dsl.parse import parse_file
        except ImportError:
            return None
        return lambda file: parse_file(file).diagnostics
    return lint_file


def golden_files(under: Path = GOLDEN_DIR) -> list[Path]:
    return sorted(p for p in under.rglob("*.tvp") if "ir" not in p.relative_to(under).parts[:1])


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: str(p.relative_to(GOLDEN_DIR)))
def test_golden_file(path: Path) -> None:
    lint = linter()
    if lint is None:
        pytest.skip("neither trainverify_dsl.plan.lint_file nor parse.parse_file exists yet")
    text = path.read_text(encoding="utf-8")
    problems = compare(path, text, lint(str(path)))
    assert not problems, f"{path}:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------- the harness itself


def _diagnostic(line: int, code_id: str, message: str, severity: Severity = Severity.ERROR,
                file: str = "g.tvp") -> Diagnostic:
    from trainverify_dsl.report.diagnostics import Code
    from trainverify_dsl.report.span import Span

    code = Code(code_id, "test", severity, "s", "w", "y", "e", "f")
    return Diagnostic(code, message, Span(file, line, 1, line, 2))


def test_annotations_parse_with_plain_comments_and_several_per_line() -> None:
    text = ("plan a\n"
            "mesh dp=2  # comment # E: first [TVP101] #W: [TVP102]\n"
            "split x # not an annotation\n"
            "x  # N: a note: with colon [TVP999]\n")
    assert parse_expectations(text) == [
        Expectation(2, Severity.ERROR, "TVP101", "first"),
        Expectation(2, Severity.WARNING, "TVP102", ""),
        Expectation(4, Severity.NOTE, "TVP999", "a note: with colon"),
    ]


def test_compare_reports_unexpected_and_missing(tmp_path: Path) -> None:
    path = tmp_path / "g.tvp"
    text = "plan a  # E: bad plan [TVP101]\nmesh  # W: [TVP102]\n"
    found = [_diagnostic(1, "TVP101", "a bad plan", file=str(path)),
             _diagnostic(2, "TVP102", "x", Severity.ERROR, file=str(path)),
             _diagnostic(1, "TVP103", "elsewhere", file="other.tvp")]
    assert compare(path, text, found) == [
        f"unexpected: {path}:2:1: # E: x [TVP102]",
        "unexpected (in another file): other.tvp:1:1: # E: elsewhere [TVP103]",
        "missing: line 2: # W:  [TVP102]",
    ]


def test_compare_accepts_exact_matches_and_end_of_file(tmp_path: Path) -> None:
    path = tmp_path / "g.tvp"
    text = "plan a\nmesh  # E: end [TVP101] # E: end [TVP101]\n"
    found = [_diagnostic(3, "TVP101", "unexpected end", file=str(path)),
             _diagnostic(2, "TVP101", "end of input", file=str(path))]
    assert compare(path, text, found) == []
    assert compare(path, "plan a\n", []) == []
    assert compare(path, "plan a\n", found[:1]) != []


def test_update_rewrites_annotations() -> None:
    text = "plan a  # old # E: stale [TVP101]\nmesh\n"
    found = [_diagnostic(2, "TVP102", "fresh\nsecond line", Severity.WARNING)]
    assert annotate(text, found) == "plan a  # old\nmesh  # W: fresh [TVP102]\n"


# ---------------------------------------------------------------- --update


def annotate(text: str, diagnostics: Sequence[Diagnostic]) -> str:
    """``text`` with its annotations replaced by ones describing ``diagnostics``."""
    lines = text.split("\n")
    wanted: dict[int, list[str]] = {}
    for d in diagnostics:
        message = d.message.split("\n")[0]
        wanted.setdefault(diagnostic_line(d, text), []).append(
            f"# {LETTERS[d.severity]}: {message} [{d.code.id}]")
    for index, line in enumerate(lines):
        bare = ANNOTATION_TAIL.sub("", line).rstrip() if ANNOTATION_TAIL.search(line) else line
        notes = wanted.get(index + 1)
        lines[index] = f"{bare}  {' '.join(notes)}" if notes else bare
    return "\n".join(lines)


def update(paths: Sequence[str]) -> int:
    lint = linter()
    if lint is None:
        print("no linter available", file=sys.stderr)
        return 2
    targets = [Path(p) for p in paths] or [GOLDEN_DIR]
    files = [f for t in targets for f in (golden_files(t) if t.is_dir() else [t])]
    for file in files:
        text = file.read_text(encoding="utf-8")
        new = annotate(text, [d for d in lint(str(file)) if _same_file(d.span.file, file)])
        if new != text:
            file.write_text(new, encoding="utf-8")
            print(f"updated {file}")
    return 0


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if not arguments or arguments[0] != "--update":
        print(__doc__)
        sys.exit(2)
    sys.exit(update(arguments[1:]))
