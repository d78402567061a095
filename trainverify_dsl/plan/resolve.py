"""Resolution: a parsed ``.tvp`` file (and everything it ``use``s) -> a flat ``Plan``.

Three steps, each collecting diagnostics instead of raising: ``expand`` (imports, templates,
loops; iterative and bounded), ``build`` (exact evaluation, per-statement checks, layouts),
``checks`` (whole-plan checks: divisibility, pipeline stages). The plan is returned even when
there are errors, so tools can show what resolved; ``None`` only when nothing could be read.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import trainverify_dsl
from trainverify_dsl.parse import ast, parse_file, parse_source
from trainverify_dsl.plan import messages
from trainverify_dsl.plan.build import Builder
from trainverify_dsl.plan.checks import check_plan
from trainverify_dsl.plan.expand import Expander, Loader
from trainverify_dsl.plan.model import Origin, Plan
from trainverify_dsl.report import codes_plan as codes
from trainverify_dsl.report import codes_syntax
from trainverify_dsl.report.diagnostics import Collector, Diagnostic, Severity
from trainverify_dsl.report.span import Span


@dataclass(frozen=True, slots=True)
class ResolveResult:
    plan: Plan | None
    diagnostics: tuple[Diagnostic, ...]

    @property
    def ok(self) -> bool:
        return self.plan is not None and not any(
            d.severity == "error" for d in self.diagnostics)


def parse_loader(path: Path, display: str) -> tuple[ast.PlanFile | None, tuple[Diagnostic, ...]]:
    """The default loader: ``parse.parse_file`` (unreadable files and bad UTF-8 are its
    diagnostics). ``display`` names the file in spans: relative to the working directory or
    absolute, so it is also a readable path."""
    result = parse_file(display if Path(display).resolve() == path else path)
    return result.plan_file, tuple(result.diagnostics)


def unreadable(display: str) -> Diagnostic:
    return messages.at(codes_syntax.UNREADABLE_FILE, f"cannot read '{display}': no such file",
                       Origin(Span.point(display, 1, 1)), help="check the path")


def resolve_plan_file(plan_file: ast.PlanFile, *,
                      project_root: Path = trainverify_dsl.PROJECT_ROOT,
                      loader: Loader | None = None,
                      parse_errors: bool = False,
                      sizes: Mapping[str, int] | None = None) -> ResolveResult:
    """Resolve an already parsed main file. ``loader`` reads ``use``d files (default: read
    and parse from disk); tests pass an in-memory one. ``parse_errors``: the parser could
    not read some statements of the main file (checks that a statement is missing wait).
    ``sizes``: the plan with these counts in place of its statements' — ``microbatches``
    and mesh axes by name, every expression naming one evaluated with it (the checker's
    fewer microbatches and fewer data-parallel ranks, docs/checking.md)."""
    collector = Collector()
    try:
        expansion = Expander(plan_file, loader or parse_loader, Path(project_root),
                             collector).expand()
    except RecursionError:
        collector.add(_too_deep(plan_file))
        return ResolveResult(None, _sorted(collector))
    if expansion.truncated:
        return ResolveResult(None, _sorted(collector))
    has_header = any(isinstance(s, ast.PlanHeader) for s in plan_file.statements)
    try:
        plan = Builder(expansion.leaves, plan_file.path, expansion.files, collector,
                       has_header=has_header, sizes=sizes).build()
        check_plan(plan, collector, Path(project_root), parse_errors)
    except RecursionError:
        collector.add(_too_deep(plan_file))
        return ResolveResult(None, _sorted(collector))
    return ResolveResult(plan, _sorted(collector))


def resolve_file(path: str | Path, *, project_root: Path = trainverify_dsl.PROJECT_ROOT,
                 loader: Loader | None = None, sizes: Mapping[str, int] | None = None
                 ) -> ResolveResult:
    """Parse and resolve the main plan file at ``path``; syntax diagnostics are included.
    ``sizes``: as ``resolve_plan_file``'s."""
    with collector_paused():
        return _resolve_file(path, project_root, loader, sizes)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the duration (and on again after, if it was
    on). A plan's AST and resolved plan are hundreds of thousands of long-lived objects and
    hold no reference cycles, so collecting while they are built finds nothing, yet every
    full collection walks them all: a third of the time of a 10,000-line plan. Acyclic
    garbage is still freed at once by reference counting; anything cyclic waits for the next
    collection after. (mypy raises its collector's thresholds for the same reason.)"""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _resolve_file(path: str | Path, project_root: Path,
                  loader: Loader | None, sizes: Mapping[str, int] | None = None
                  ) -> ResolveResult:
    display = str(path)
    if loader is None:
        parsed = parse_file(path)
        plan_file, diagnostics = parsed.plan_file, tuple(parsed.diagnostics)
    elif not Path(path).is_file():
        return ResolveResult(None, (unreadable(display),))
    else:
        plan_file, diagnostics = loader(Path(path).resolve(), display)
    return _resolve_parsed(plan_file, diagnostics, project_root, loader, sizes)


def resolve_source(text: str, path: str | Path, *,
                   project_root: Path = trainverify_dsl.PROJECT_ROOT) -> ResolveResult:
    """``resolve_file`` for text that is not (yet) the file's content on disk, such as an
    editor's unsaved buffer: ``path`` names it in spans and places it (``use`` paths are
    relative to its folder when it exists on disk); the files it ``use``s are read from disk."""
    from trainverify_dsl.parse.parser import binary_text

    binary = binary_text(text, str(path))
    if binary is not None:  # as lint says of the file on disk
        return ResolveResult(None, (binary,))
    parsed = parse_source(text, str(path))
    return _resolve_parsed(parsed.plan_file, tuple(parsed.diagnostics), project_root, None)


def _resolve_parsed(plan_file: ast.PlanFile | None, diagnostics: tuple[Diagnostic, ...],
                    project_root: Path, loader: Loader | None,
                    sizes: Mapping[str, int] | None = None) -> ResolveResult:
    if plan_file is None:
        return ResolveResult(None, _sorted_list(diagnostics))
    result = resolve_plan_file(plan_file, project_root=project_root, loader=loader,
                               parse_errors=any(d.severity is Severity.ERROR
                                                for d in diagnostics),
                               sizes=sizes)
    return ResolveResult(result.plan, _sorted_list(diagnostics + result.diagnostics))


def _too_deep(plan_file: ast.PlanFile) -> Diagnostic:
    return messages.at(codes.EXPANSION_LIMIT, "plan expansion stopped: nesting too deep",
                       Origin(plan_file.span),
                       help="reduce the nesting of expressions, templates and loops")


def _sorted(collector: Collector) -> tuple[Diagnostic, ...]:
    return _sorted_list(tuple(collector.items))


def _sorted_list(diagnostics: tuple[Diagnostic, ...]) -> tuple[Diagnostic, ...]:
    """Sorted by location and code, exact repeats (e.g. one template applied twice) once."""
    unique = dict.fromkeys(diagnostics)
    return tuple(sorted(unique, key=lambda d: (d.span.file, d.span.line, d.span.col,
                                               d.code.id, d.message)))
