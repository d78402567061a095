"""What the lowering and its layout pass find, before they become diagnostics.

A ``Finding`` has a short code key (``partial-nonlinear``, ``collective``, ...; the report
layer maps each to a registered TVP4xx code), a message, the plan span it is about (the
statement that caused it, when known) and where in the spec model it shows (module path).
``LoweringError`` stops the lowering: the plan has no local program (names that do not
bind, operands split incompatibly, a stage order against the data flow).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainverify_dsl.report.span import Span


@dataclass(frozen=True, slots=True)
class Finding:
    code: str
    message: str
    span: Span | None
    where: str
    help: str | None = None


class LoweringError(Exception):
    def __init__(self, *findings: Finding) -> None:
        super().__init__("; ".join(f.message for f in findings))
        self.findings = findings
