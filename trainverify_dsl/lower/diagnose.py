"""A lowering finding as a diagnostic (its registered TVP4xx code, the plan line, the module
of the spec model). The driver that lowers a plan file and reports them is
``trainverify_dsl.api.layout_diagnostics``."""

from __future__ import annotations

from trainverify_dsl.lower.findings import Finding
from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.span import Span


def to_diagnostic(finding: Finding, fallback: Span) -> Diagnostic:
    code = finding.code
    notes = (f"in the spec model at `{finding.where}`",) if finding.where else ()
    return Diagnostic(code, finding.message, finding.span or fallback,
                      finding.notes + notes, finding.help)
