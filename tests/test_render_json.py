"""JSON renderer: the documented schema, field by field."""

from __future__ import annotations

import json

from test_render_support import FILE, TEST_ERROR, error, warning

from trainverify_dsl import __version__
from trainverify_dsl.report.render import LintReport
from trainverify_dsl.report.render.json_format import JSON_SCHEMA_VERSION, render_json
from trainverify_dsl.report.span import Span

DIAGNOSTIC_KEYS = {"code", "name", "severity", "message", "file", "line", "column", "end_line",
                   "end_column", "notes", "help", "related"}


def test_document_shape_and_summary() -> None:
    report = LintReport.of([error(), warning("w", file="b.tvp")], [FILE, "b.tvp", "c.tvp"])
    document = json.loads(render_json(report))
    assert set(document) == {"version", "tool", "diagnostics", "files", "internal_errors",
                             "summary"}
    assert document["version"] == JSON_SCHEMA_VERSION == 2
    assert document["tool"] == {"name": "tvp", "version": __version__}
    assert document["files"] == [FILE, "b.tvp", "c.tvp"]
    assert document["internal_errors"] == []
    assert document["summary"] == {"files": 3, "files_with_findings": 2, "errors": 1,
                                   "warnings": 1, "notes": 0, "internal_errors": 0}


def test_diagnostic_fields() -> None:
    related = ((Span(FILE, 2, 1, 2, 22), "mesh declared here"),)
    diagnostic = error(notes=("n1", "n2"), help="did you mean 'tp'?", related=related)
    (entry,) = json.loads(render_json(LintReport.of([diagnostic], [FILE])))["diagnostics"]
    assert set(entry) == DIAGNOSTIC_KEYS
    assert entry == {
        "code": TEST_ERROR.id, "name": TEST_ERROR.name, "severity": "error",
        "message": "unknown mesh axis 'tq'", "file": FILE, "line": 3, "column": 10,
        "end_line": 3, "end_column": 12, "notes": ["n1", "n2"], "help": "did you mean 'tp'?",
        "related": [{"file": FILE, "line": 2, "column": 1, "end_line": 2, "end_column": 22,
                     "message": "mesh declared here"}],
    }


def test_help_is_null_when_absent_and_unicode_is_kept() -> None:
    (entry,) = json.loads(render_json(LintReport.of([error("axe «tq»")], [FILE])))["diagnostics"]
    assert entry["help"] is None
    assert entry["message"] == "axe «tq»"


def test_clean_report() -> None:
    document = json.loads(render_json(LintReport.of([], ["a.tvp"])))
    assert document["diagnostics"] == []
    assert document["summary"]["errors"] == 0
    assert document["summary"]["files"] == 1
