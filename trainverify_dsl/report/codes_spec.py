"""Diagnostic codes of the spec stage (see report/codes.py for id ranges)."""

from trainverify_dsl.report.diagnostics import Code, Severity  # noqa: F401

CODES: tuple[Code, ...] = ()
