"""The code registry: well-formed entries, and every example/fix pair proven by the linter.

For every lint code (TVP1xx syntax, TVP2xx plan) the ``example`` is written to a temporary
``example.tvp`` and linted: it must produce the code; the ``fix`` must not. An example that
needs more files names them in ``what`` in the form "`frag.tvp` holding `plan other`"; they
are written next to it. An example that is a command line, ``tvp lint PATH...`` (say, a missing
file), lints those paths inside the temporary directory instead. TVP3xx codes (spec tracing)
are not lint codes: only their text is checked. TVP4xx (layout pass) examples need the spec
model: tests/test_codes_lower.py runs them through ``tvp lint --spec``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from test_golden import linter

from trainverify_dsl.report import (
    codes_import,
    codes_lower,
    codes_plan,
    codes_run,
    codes_spec,
    codes_syntax,
)
from trainverify_dsl.report.codes import ALL_CODES, lookup
from trainverify_dsl.report.diagnostics import Code, Severity

ID = re.compile(r"TVP\d{3}")
KEBAB = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
EXTRA_FILE = re.compile(r"`(?P<name>[\w.-]+\.tvp)` holding `(?P<text>[^`]*)`")
TABLES = {"1": codes_syntax.CODES, "2": codes_plan.CODES, "3": codes_spec.CODES,
          "4": codes_lower.CODES, "5": codes_run.CODES, "6": codes_import.CODES}
COMMAND = "tvp lint "
LINT_CODES = [c for c in ALL_CODES if c.id[3] in "12"]


def by_id(code: Code) -> str:
    return f"{code.id}-{code.name}"


def test_registry_is_unique_and_indexed() -> None:
    ids = [c.id for c in ALL_CODES]
    names = [c.name for c in ALL_CODES]
    assert len(ids) == len(set(ids)), "duplicate code ids"
    assert len(names) == len(set(names)), "duplicate code names"
    assert not set(ids) & set(names)
    for code in ALL_CODES:
        assert lookup(code.id) is code and lookup(code.name) is code
        assert lookup(code.id.lower()) is code


@pytest.mark.parametrize("code", ALL_CODES, ids=by_id)
def test_code_is_well_formed(code: Code) -> None:
    assert ID.fullmatch(code.id), code.id
    assert KEBAB.fullmatch(code.name), code.name
    assert isinstance(code.severity, Severity)
    for field in ("summary", "what", "why", "example", "fix"):
        assert getattr(code, field).strip(), f"{code.id}: empty {field}"
    assert code.example != code.fix
    assert code in TABLES[code.id[3]], f"{code.id} is not in its range's table"


def lint_snippet(directory: Path, code: Code, snippet: str) -> set[str]:
    lint = linter()
    if lint is None:
        pytest.skip("no linter available yet")
    for extra in EXTRA_FILE.finditer(code.what):
        (directory / extra["name"]).write_text(extra["text"] + "\n", encoding="utf-8")
    if snippet.startswith(COMMAND):
        paths = [directory / name for name in shlex.split(snippet)[len(COMMAND.split()):]]
    else:
        paths = [directory / "example.tvp"]
        paths[0].write_text(snippet, encoding="utf-8")
    return {d.code.id for path in paths for d in lint(str(path))}


@pytest.mark.parametrize("code", LINT_CODES, ids=by_id)
def test_example_produces_the_code(code: Code, tmp_path: Path) -> None:
    produced = lint_snippet(tmp_path, code, code.example)
    assert code.id in produced, f"example of {code.id} produced {sorted(produced)}"


@pytest.mark.parametrize("code", LINT_CODES, ids=by_id)
def test_fix_does_not_produce_the_code(code: Code, tmp_path: Path) -> None:
    produced = lint_snippet(tmp_path, code, code.fix)
    assert code.id not in produced, f"fix of {code.id} still produces it"


def test_extra_file_convention() -> None:
    what = 'needs `a.tvp` holding `use "b.tvp"` and `b.tvp` holding `plan other`.'
    assert [(m["name"], m["text"]) for m in EXTRA_FILE.finditer(what)] == [
        ("a.tvp", 'use "b.tvp"'), ("b.tvp", "plan other")]
