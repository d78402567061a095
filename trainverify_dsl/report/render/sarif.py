"""SARIF 2.1.0 output, for GitHub code scanning and other static-analysis dashboards.

One run whose ``tool.driver`` is ``tvp``; ``rules`` lists every code in the registry (id =
code id, name = kebab-case name, descriptions and help from the registry), followed by any
code a diagnostic uses that the registry lacks, so every ``ruleIndex`` points at its rule.
Each result carries ``ruleId``, ``ruleIndex``, ``level`` (``error``/``warning``/``note``),
``message.text`` (the message, then notes and help on their own lines), one physical location
and the related locations.

Locations: ``artifactLocation.uri`` is relative with forward slashes and percent-encoding,
``uriBaseId`` ``%SRCROOT%`` (the directory the run started from, passed as ``root``); a file
outside ``root`` gets an absolute ``file://`` URI instead. ``artifacts`` lists every file
checked, and ``artifactLocation.index`` points into it. Regions are 1-based, ``endColumn``
exclusive, and columns count Unicode code points (``columnKind: unicodeCodePoints``).

Each result has ``partialFingerprints``: ``primaryLocationLineHash`` (the value GitHub's
upload-sarif action computes for it, from the text at and after the offending line) and
``tvp/v1`` (a SHA-256 of the code, the file's URI, the offending line's text and its rank among
identical ones). No line or column number enters either, so a result keeps them when lines are
inserted above it and GitHub code scanning matches it to the alert of an earlier run instead of
opening a new one (``report.render.fingerprints``).

``invocations[0].executionSuccessful`` is ``false`` when the linter crashed on a file; each
crash is a ``toolExecutionNotifications`` entry (level ``error``, the message, the file as its
location), so a consumer never takes a crashed run for a clean one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import PurePath
from typing import Any
from urllib.parse import quote

from trainverify_dsl.report.diagnostics import Code, Diagnostic, Severity
from trainverify_dsl.report.render import InternalError, LintReport, SourceLookup, no_sources
from trainverify_dsl.report.render.fingerprints import add_fingerprints
from trainverify_dsl.report.span import Span

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"
SRCROOT = "%SRCROOT%"

_LEVELS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "note"}


def render_sarif(report: LintReport, *, rules: Sequence[Code] | None = None,
                 root: str | None = None, sources: SourceLookup = no_sources) -> str:
    return json.dumps(report_to_sarif(report, rules=rules, root=root, sources=sources),
                      indent=2, ensure_ascii=False) + "\n"


def report_to_sarif(report: LintReport, *, rules: Sequence[Code] | None = None,
                    root: str | None = None,
                    sources: SourceLookup = no_sources) -> dict[str, Any]:
    """The SARIF log as plain data; ``rules`` defaults to the whole code registry;
    ``sources`` gives the files' text for the fingerprints (without it ``tvp/v1`` rests on
    the code, the file and the message, and there is no ``primaryLocationLineHash``)."""
    codes = _rule_codes(rules, report.diagnostics)
    rule_index = {code.id: index for index, code in enumerate(codes)}
    artifacts = _artifact_files(report)
    artifact_index = {file: index for index, file in enumerate(artifacts)}
    locate = _Locator(root, artifact_index)
    results = [_result(d, rule_index[d.code.id], locate) for d in report.diagnostics]
    add_fingerprints(results, report.diagnostics, sources)
    return {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [{
            "tool": {"driver": _driver(codes)},
            "invocations": [_invocation(report.internal_errors, locate)],
            "columnKind": "unicodeCodePoints",
            "artifacts": [{"location": locate.artifact(file)} for file in artifacts],
            "results": results,
        }],
    }


def _rule_codes(rules: Sequence[Code] | None, diagnostics: Iterable[Diagnostic]) -> list[Code]:
    if rules is None:
        from trainverify_dsl.report.codes import ALL_CODES

        rules = ALL_CODES
    codes = list(rules)
    known = {code.id for code in codes}
    for diagnostic in diagnostics:
        if diagnostic.code.id not in known:
            known.add(diagnostic.code.id)
            codes.append(diagnostic.code)
    return codes


def _artifact_files(report: LintReport) -> list[str]:
    files = dict.fromkeys(report.files)
    for failure in report.internal_errors:
        files.setdefault(failure.file)
    for diagnostic in report.diagnostics:
        files.setdefault(diagnostic.span.file)
        for span, _ in diagnostic.related:
            files.setdefault(span.file)
    return list(files)


def _driver(codes: Sequence[Code]) -> dict[str, Any]:
    from trainverify_dsl import __version__

    return {
        "name": "tvp",
        "fullName": "trainverify_dsl plan linter",
        "version": __version__,
        "semanticVersion": __version__,
        "rules": [_rule(code) for code in codes],
    }


def _rule(code: Code) -> dict[str, Any]:
    help_text = (f"{code.what}\n\nWhy is this bad: {code.why}\n\nExample:\n{code.example}"
                 f"\n\nUse instead:\n{code.fix}")
    help_markdown = (f"{code.what}\n\n**Why is this bad?** {code.why}\n\n**Example**\n\n"
                     f"```\n{code.example.rstrip()}\n```\n\n**Use instead**\n\n"
                     f"```\n{code.fix.rstrip()}\n```\n")
    return {
        "id": code.id,
        "name": code.name,
        "shortDescription": {"text": code.summary or code.name},
        "fullDescription": {"text": f"{code.what} {code.why}".strip() or code.name},
        "help": {"text": help_text, "markdown": help_markdown},
        "defaultConfiguration": {"level": _LEVELS[code.severity]},
    }


def _invocation(failures: Sequence[InternalError], locate: _Locator) -> dict[str, Any]:
    """One invocation; unsuccessful when the linter crashed on a file."""
    return {
        "executionSuccessful": not failures,
        "toolExecutionNotifications": [_notification(failure, locate) for failure in failures],
    }


def _notification(failure: InternalError, locate: _Locator) -> dict[str, Any]:
    text = f"internal error while linting {failure.file}: {failure.message}"
    location = {"physicalLocation": {"artifactLocation": locate.indexed(failure.file)}}
    return {"level": "error", "message": {"text": text}, "locations": [location]}


def _result(diagnostic: Diagnostic, rule_index: int, locate: _Locator) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": diagnostic.code.id,
        "ruleIndex": rule_index,
        "level": _LEVELS[diagnostic.severity],
        "message": {"text": _message_text(diagnostic)},
        "locations": [{"physicalLocation": locate.physical(diagnostic.span)}],
    }
    if diagnostic.related:
        result["relatedLocations"] = [
            {"id": number, "physicalLocation": locate.physical(span), "message": {"text": text}}
            for number, (span, text) in enumerate(diagnostic.related, start=1)
        ]
    return result


def _message_text(diagnostic: Diagnostic) -> str:
    lines = [diagnostic.message]
    lines += [f"note: {note}" for note in diagnostic.notes]
    if diagnostic.help:
        lines.append(f"help: {diagnostic.help}")
    return "\n".join(lines)


class _Locator:
    """Builds artifact locations and regions; ``root`` anchors relative URIs."""

    def __init__(self, root: str | None, artifact_index: dict[str, int]) -> None:
        self.root = PurePath(root) if root is not None else None
        self.artifact_index = artifact_index

    def artifact(self, file: str) -> dict[str, Any]:
        return artifact_location(file, self.root)

    def indexed(self, file: str) -> dict[str, Any]:
        """The artifact location of ``file`` with its index into ``artifacts``."""
        location = self.artifact(file)
        if file in self.artifact_index:
            location["index"] = self.artifact_index[file]
        return location

    def physical(self, span: Span) -> dict[str, Any]:
        return {"artifactLocation": self.indexed(span.file), "region": region(span)}


def artifact_location(file: str, root: PurePath | None) -> dict[str, Any]:
    """``{"uri": "plans/a.tvp", "uriBaseId": "%SRCROOT%"}``, or an absolute ``file://`` URI."""
    path = PurePath(file)
    if path.is_absolute():
        if root is None or not path.is_relative_to(root):
            return {"uri": path.as_uri()}
        path = path.relative_to(root)
    posix = path.as_posix()
    return {"uri": quote(posix.removeprefix("./"), safe="/"), "uriBaseId": SRCROOT}


def region(span: Span) -> dict[str, int]:
    """1-based region; end clamped so it never precedes the start."""
    start_line, start_column = max(span.line, 1), max(span.col, 1)
    end_line = max(span.end_line, start_line)
    end_column = span.end_col if end_line > start_line else max(span.end_col, start_column)
    return {"startLine": start_line, "startColumn": start_column,
            "endLine": end_line, "endColumn": max(end_column, 1)}
