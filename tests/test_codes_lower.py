"""Every TVP4xx (layout pass) code: its example, linted with the layout pass against the spec
model it names, produces the code; its fix does not (and lints clean without the pass), and
the fix is a correct plan: its simulation agrees with the spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl.api import simulate_file
from trainverify_dsl.cli.lint_cmd import with_layout_pass
from trainverify_dsl.plan import lint_file
from trainverify_dsl.report.codes_lower import CODES
from trainverify_dsl.report.diagnostics import Code, Severity


def _ids(tmp_path: Path, text: str) -> tuple[set[str], set[str]]:
    path = tmp_path / "example.tvp"
    path.write_text(text, encoding="utf-8")
    plain = {d.code.id for d in lint_file(str(path)) if d.severity is Severity.ERROR}
    full = {d.code.id for d in with_layout_pass(lint_file)(str(path))}
    return plain, full


@pytest.mark.parametrize("code", CODES, ids=lambda c: f"{c.id}-{c.name}")
def test_example_and_fix(code: Code, tmp_path: Path) -> None:
    plain, found = _ids(tmp_path, code.example)
    assert not plain, f"{code.id}: the example must pass plain lint, got {sorted(plain)}"
    assert code.id in found, f"{code.id}: example produced {sorted(found)}"
    plain, found = _ids(tmp_path, code.fix)
    assert not plain and code.id not in found, f"{code.id}: fix produced {sorted(found)}"


@pytest.mark.parametrize("code", CODES, ids=lambda c: f"{c.id}-{c.name}")
def test_fix_is_a_correct_plan(code: Code, tmp_path: Path) -> None:
    path = tmp_path / "fix.tvp"
    path.write_text(code.fix, encoding="utf-8")
    result = simulate_file(path)
    assert result.agrees, result.mismatches[:3]
