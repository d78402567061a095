"""JSON output: one document, stable schema (bump ``JSON_SCHEMA_VERSION`` on any change).

::

    {
      "version": 2,
      "tool": {"name": "tvp", "version": "0.1.0"},
      "diagnostics": [
        {
          "code": "TVP203", "name": "unknown-mesh-axis", "severity": "error",
          "message": "unknown mesh axis 'tq'",
          "file": "plans/a.tvp", "line": 3, "column": 10, "end_line": 3, "end_column": 12,
          "notes": ["..."], "help": "did you mean 'tp'?" | null,
          "related": [{"file": ..., "line": ..., "column": ..., "end_line": ...,
                       "end_column": ..., "message": "mesh declared here"}]
        }
      ],
      "files": ["plans/a.tvp", "plans/b.tvp"],
      "internal_errors": [],
      "summary": {"files": 2, "files_with_findings": 1, "errors": 1, "warnings": 0,
                  "notes": 0, "internal_errors": 0}
    }

Lines and columns are 1-based, counted in Unicode code points; ``end_column`` is exclusive
(the column just after the span), as in ``Span``. Diagnostics are sorted by file, line,
column, code. ``severity`` is ``error``, ``warning`` or ``note``.

``internal_errors`` lists the files the linter crashed on, as
``{"file": "plans/b.tvp", "message": "RuntimeError: ..."}``: nothing was checked in them, so
``summary.errors`` counts them too (and ``summary.internal_errors`` says how many of the
errors they are). A document with ``summary.errors == 0`` is a clean run; anything else is
not, whatever ``diagnostics`` holds.

Version 2 added ``internal_errors`` and ``summary.internal_errors`` (version 1 reported a
crash nowhere in the document).
"""

from __future__ import annotations

import json
from typing import Any

from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.render import LintReport, summarize
from trainverify_dsl.report.span import Span

JSON_SCHEMA_VERSION = 2


def render_json(report: LintReport) -> str:
    return json.dumps(report_to_json(report), indent=2, ensure_ascii=False) + "\n"


def report_to_json(report: LintReport) -> dict[str, Any]:
    from trainverify_dsl import __version__

    summary = summarize(report)
    return {
        "version": JSON_SCHEMA_VERSION,
        "tool": {"name": "tvp", "version": __version__},
        "diagnostics": [diagnostic_to_json(d) for d in report.diagnostics],
        "files": list(report.files),
        "internal_errors": [{"file": failure.file, "message": failure.message}
                            for failure in report.internal_errors],
        "summary": {
            "files": summary.files_checked,
            "files_with_findings": summary.files_with_findings,
            "errors": summary.errors,
            "warnings": summary.warnings,
            "notes": summary.notes,
            "internal_errors": summary.internal_errors,
        },
    }


def diagnostic_to_json(diagnostic: Diagnostic) -> dict[str, Any]:
    return {
        "code": diagnostic.code.id,
        "name": diagnostic.code.name,
        "severity": diagnostic.severity.value,
        "message": diagnostic.message,
        **span_to_json(diagnostic.span),
        "notes": list(diagnostic.notes),
        "help": diagnostic.help,
        "related": [{**span_to_json(span), "message": message}
                    for span, message in diagnostic.related],
    }


def span_to_json(span: Span) -> dict[str, Any]:
    return {
        "file": span.file,
        "line": span.line,
        "column": span.col,
        "end_line": span.end_line,
        "end_column": span.end_col,
    }
