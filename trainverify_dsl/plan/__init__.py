"""The plan stage: resolve a parsed ``.tvp`` file into a flat, exact ``Plan`` and lint it.

Never imports torch or z3 (``tvp lint`` runs in milliseconds).
"""

from __future__ import annotations

from pathlib import Path

import trainverify_dsl
from trainverify_dsl.plan.model import Plan, TensorPattern, parse_pattern, plan_to_dict
from trainverify_dsl.plan.resolve import (
    ResolveResult,
    resolve_file,
    resolve_plan_file,
    resolve_source,
)
from trainverify_dsl.report.diagnostics import Diagnostic

__all__ = [
    "Plan",
    "ResolveResult",
    "TensorPattern",
    "lint_file",
    "lint_source",
    "parse_pattern",
    "plan_to_dict",
    "resolve_file",
    "resolve_plan_file",
    "resolve_source",
]


def lint_file(path: str | Path, *,
              project_root: Path = trainverify_dsl.PROJECT_ROOT) -> tuple[Diagnostic, ...]:
    """Parse, resolve and check one main plan file: every diagnostic, sorted by location.
    A missing or unreadable file is a diagnostic, not an exception."""
    return resolve_file(path, project_root=project_root).diagnostics


def lint_source(text: str, path: str | Path, *,
                project_root: Path = trainverify_dsl.PROJECT_ROOT) -> tuple[Diagnostic, ...]:
    """``lint_file`` for ``text`` standing in for the file at ``path`` (an editor's unsaved
    buffer): the same checks and diagnostics; ``use``d files are read from disk."""
    return resolve_source(text, path, project_root=project_root).diagnostics
