"""Diagnostic codes of the plan stage (see report/codes.py for id ranges)."""

from trainverify_dsl.report.diagnostics import Code, Severity  # noqa: F401

CODES: tuple[Code, ...] = ()
