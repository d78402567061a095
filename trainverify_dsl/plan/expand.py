"""Expansion: follow ``use``, expand ``apply``, unroll ``for`` into patterns.

The walk is iterative (an explicit stack of frames), bounded in depth and in total work, so
adversarial plans end with a diagnostic, never a ``RecursionError``. The result is a flat list
of leaf statements in program order, each substituted and paired with its ``Origin``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from trainverify_dsl.parse import ast
from trainverify_dsl.plan import messages, substitute
from trainverify_dsl.plan.model import ExpansionSite, Origin
from trainverify_dsl.report import codes_plan as codes
from trainverify_dsl.report.diagnostics import Collector, Diagnostic
from trainverify_dsl.report.span import Span

#: Reads and parses one file: (AST or None, diagnostics). The resolver reports missing files
#: itself, so a loader is only called on existing files.
Loader = Callable[[Path, str], tuple[ast.PlanFile | None, tuple[Diagnostic, ...]]]

MAX_DEPTH = 200
MAX_WORK = 100_000

_BLOCK_ONLY_AT_TOP = (ast.UseDecl, ast.TemplateDef, ast.PlanHeader)
#: Statements ``_step`` hands to ``_leaf`` wherever they stand: all but use, template,
#: plan, for and apply.
_PLAIN_LEAVES = frozenset({
    ast.SpecDecl, ast.MeshDecl, ast.MicrobatchesDecl, ast.LossScaleDecl,
    ast.LossReductionDecl, ast.SplitStmt,
    ast.ReplicateStmt, ast.PartialStmt, ast.PlaceStmt, ast.CollectiveStmt, ast.SendStmt,
    ast.PipelineStageStmt, ast.OptimizerDecl, ast.SpecOptimizerDecl, ast.ClipGradNormDecl,
    ast.OnStmt, ast.AlgorithmStmt})


@dataclass(frozen=True, slots=True)
class Leaf:
    """One flat statement (no ``use``/``for``/``apply``/``template``) and where it came from."""

    stmt: ast.Statement
    origin: Origin


@dataclass(frozen=True, slots=True)
class Template:
    definition: ast.TemplateDef
    file: str


@dataclass(slots=True)
class _Frame:
    statements: tuple
    env: substitute.Env
    trail: tuple[ExpansionSite, ...]
    #: The resolved file whose top level this frame walks (``None`` inside blocks).
    file_key: Path | None
    template: str | None = None
    index: int = 0
    #: Names in ``env`` bound by an enclosing ``for`` (the rest are template parameters).
    loop_vars: frozenset[str] = frozenset()

    @property
    def top_level(self) -> bool:
        return self.file_key is not None


@dataclass(slots=True)
class Expansion:
    leaves: list[Leaf] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    templates: dict[str, Template] = field(default_factory=dict)
    #: The file each ``use`` statement names (its span -> the resolved path), for every
    #: ``use`` that names an existing file inside the roots, included before or not.
    used_files: dict[Span, Path] = field(default_factory=dict)
    #: Set when a limit stopped the walk: the leaves are then incomplete.
    truncated: bool = False


class Expander:
    """Walks a main ``PlanFile``; ``expand()`` returns the flat leaves and the files read."""

    def __init__(self, main: ast.PlanFile, loader: Loader, project_root: Path,
                 collector: Collector):
        self.loader, self.collector = loader, collector
        self.project_root = project_root.resolve()
        self.main_key = _file_key(main.path)
        main_dir = self.main_key.parent if self.main_key is not None else self.project_root
        self.roots = (self.project_root, main_dir)
        self.result = Expansion()
        self.included: set[Path] = set()
        self.stack: list[_Frame] = []
        self.work = 0
        self._start(main)

    def _start(self, main: ast.PlanFile) -> None:
        key = self.main_key or Path(f"<main:{main.path}>")
        self.included.add(key)
        self.result.files.append(main.path)
        self._check_header(main, is_main=True)
        self._collect_templates(main)
        self.stack.append(_Frame(main.statements, {}, (), key))

    def expand(self) -> Expansion:
        while self.stack:
            frame = self.stack[-1]
            if frame.index >= len(frame.statements):
                self.stack.pop()
                continue
            stmt = frame.statements[frame.index]
            frame.index += 1
            self.work += 1
            if self.work > MAX_WORK:
                self._limit(stmt, frame, f"more than {MAX_WORK:,} expansion steps (statements, "
                            "loop bodies, template applications)",
                            "a plan states each layer's pattern once: use a template applied "
                            "in a `for` loop instead of writing statements out, and loop over "
                            "fewer elements")
                break
            self._step(stmt, frame)
        return self.result

    def _step(self, stmt: ast.Statement, frame: _Frame) -> None:
        if type(stmt) in _PLAIN_LEAVES:  # nearly every statement: skip the match below
            self._leaf(stmt, frame)
            return
        if isinstance(stmt, _BLOCK_ONLY_AT_TOP) and not frame.top_level:
            keyword = {ast.UseDecl: "use", ast.TemplateDef: "template"}.get(type(stmt), "plan")
            self.collector.add(messages.at(
                codes.MISPLACED_STATEMENT, f"'{keyword}' is not allowed inside a block",
                Origin(stmt.span, frame.trail),
                help=f"move the '{keyword}' statement to the top level of the file"))
            return
        match stmt:
            case ast.TemplateDef() | ast.PlanHeader() if frame.top_level:
                if isinstance(stmt, ast.PlanHeader) and frame is self.stack[0]:
                    self.result.leaves.append(Leaf(stmt, Origin(stmt.span, frame.trail)))
            case ast.UseDecl():
                self._use(stmt, frame)
            case ast.ForStmt():
                self._for(stmt, frame)
            case ast.ApplyStmt():
                self._apply(stmt, frame)
            case _:
                self._leaf(stmt, frame)

    def _leaf(self, stmt: ast.Statement, frame: _Frame) -> None:
        origin = Origin(stmt.span, frame.trail)
        try:
            flat = substitute.statement(stmt, frame.env)
        except substitute.KindError as err:
            self.collector.add(messages.expected_kind(err.param, err.expected, err.got, origin,
                                                      loop_variable=err.param in frame.loop_vars))
            return
        self.result.leaves.append(Leaf(flat, origin))

    def _push(self, frame: _Frame, stmt: ast.Statement) -> bool:
        if len(self.stack) >= MAX_DEPTH:
            self._limit(stmt, self.stack[-1], f"nesting deeper than {MAX_DEPTH} levels",
                        "reduce nested templates and loops; a plan needs few expansion levels")
            self.stack.clear()
            return False
        self.stack.append(frame)
        return True

    def _limit(self, stmt: ast.Statement, frame: _Frame, reason: str, help: str) -> None:
        self.collector.add(messages.at(
            codes.EXPANSION_LIMIT, f"plan expansion stopped: {reason}",
            Origin(stmt.span, frame.trail), help=help))
        self.result.truncated = True
        self.stack.clear()

    # ------------------------------------------------------------ for

    def _for(self, stmt: ast.ForStmt, frame: _Frame) -> None:
        site = ExpansionSite("for", stmt.var.name, stmt.span)
        frames = []
        for iterable in stmt.iterables:
            try:
                elements = _loop_elements(substitute.path(iterable, frame.env))
            except substitute.KindError as err:
                origin = Origin(stmt.span, frame.trail)
                self.collector.add(messages.expected_kind(
                    err.param, err.expected, err.got, origin,
                    loop_variable=err.param in frame.loop_vars))
                continue
            env = {**frame.env, stmt.var.name: elements}
            frames.append(_Frame(stmt.body, env, frame.trail + (site,), None, frame.template,
                                 loop_vars=frame.loop_vars | {stmt.var.name}))
        for body_frame in reversed(frames):
            if not self._push(body_frame, stmt):
                return

    # ------------------------------------------------------------ apply

    def _apply(self, stmt: ast.ApplyStmt, frame: _Frame) -> None:
        origin = Origin(stmt.span, frame.trail)
        template = self.result.templates.get(stmt.name.name)
        if template is None:
            self.collector.add(messages.unknown_name(
                codes.UNKNOWN_TEMPLATE, "template", stmt.name.name,
                sorted(self.result.templates), origin))
            return
        active = [site.name for site in frame.trail if site.kind == "apply"]
        if stmt.name.name in active:
            chain = " -> ".join([*active, stmt.name.name])
            self.collector.add(messages.at(
                codes.TEMPLATE_RECURSION, f"template '{stmt.name.name}' applies itself",
                origin, notes=[f"expansion chain: {chain}"],
                help="templates cannot recurse; apply a different template"))
            return
        env = self._bind(stmt, template.definition, frame, origin)
        if env is None:
            return
        site = ExpansionSite("apply", stmt.name.name, stmt.span)
        self._push(_Frame(template.definition.body, env, frame.trail + (site,), None,
                          stmt.name.name), stmt)

    def _bind(self, stmt: ast.ApplyStmt, definition: ast.TemplateDef, frame: _Frame,
              origin: Origin) -> substitute.Env | None:
        """Close each argument (or default) over the caller's environment; ``None`` after
        reporting wrong arguments."""
        params = [p.name.name for p in definition.params]
        given, problems = _arguments(stmt, params)
        env: substitute.Env = {}
        for param in definition.params:
            value = given.get(param.name.name, param.default)
            if value is None:
                problems.append(f"parameter '{param.name.name}' has no argument and no default")
                continue
            try:
                scope = frame.env if param.name.name in given else {}
                env[param.name.name] = substitute.value(value, scope)
            except substitute.KindError as err:
                self.collector.add(messages.expected_kind(
                    err.param, err.expected, err.got, origin,
                    loop_variable=err.param in frame.loop_vars and param.name.name in given))
                return None
        if problems:
            signature = f"{definition.name.name}({', '.join(params)})"
            self.collector.add(messages.at(
                codes.TEMPLATE_ARGUMENTS,
                f"wrong arguments for template '{definition.name.name}'", origin,
                notes=[f"template {signature} {p}" for p in problems]
                + [f"defined at {definition.span}"],
                help=f"call it as apply {signature}"))
            return None
        return env

    # ------------------------------------------------------------ use

    def _use(self, stmt: ast.UseDecl, frame: _Frame) -> None:
        origin = Origin(stmt.span, frame.trail)
        assert frame.file_key is not None
        found = self._locate(stmt, frame.file_key, origin)
        if found is None:
            return
        key, display = found
        self.result.used_files[stmt.span] = key
        chain = [f for f in self.stack if f.file_key is not None]
        if any(f.file_key == key for f in chain):
            names = [str(f.file_key) for f in chain] + [str(key)]
            self.collector.add(messages.at(
                codes.USE_CYCLE, f"'use \"{stmt.path}\"' closes an include cycle", origin,
                notes=["include chain: " + " -> ".join(display_path(n) for n in names)],
                help="remove one of the 'use' statements of the cycle"))
            return
        if key in self.included:
            return
        self.included.add(key)
        plan_file, diagnostics = self.loader(key, display)
        # The used file's own problems (syntax, encoding) also say where it was used.
        used_at = f"in the file used at {origin.report_span}"
        self.collector.extend(replace(d, notes=(*d.notes, used_at))
                              for d in diagnostics)
        if plan_file is None:
            return
        self.result.files.append(display)
        self._check_header(plan_file, is_main=False, use_origin=origin)
        self._collect_templates(plan_file)
        site = ExpansionSite("use", display, stmt.span)
        self._push(_Frame(plan_file.statements, {}, frame.trail + (site,), key), stmt)

    def _locate(self, stmt: ast.UseDecl, including: Path,
                origin: Origin) -> tuple[Path, str] | None:
        base = including.parent if including.is_absolute() else self.project_root
        tried = []
        for folder in (base, self.project_root):
            candidate = folder / stmt.path
            tried.append(str(candidate) + _not_a_file(candidate))
            if not candidate.is_file():
                continue
            real = candidate.resolve()
            if not any(_within(real, root) for root in self.roots):
                self.collector.add(messages.at(
                    codes.USE_OUTSIDE_ROOT, f"'use \"{stmt.path}\"' leaves the project", origin,
                    notes=[f"it resolves to {real}",
                           "allowed roots: " + ", ".join(str(r) for r in self.roots)],
                    help="keep used fragments inside the project or the plan's folder"))
                return None
            return real, display_path(str(real))
        self.collector.add(messages.at(
            codes.USE_NOT_FOUND, f"'use \"{stmt.path}\"': no such file", origin,
            notes=[f"looked for {t}" for t in dict.fromkeys(tried)],
            help="paths are relative to the including file, then to the project root"))
        return None

    # ------------------------------------------------------------ per file

    def _check_header(self, plan_file: ast.PlanFile, *, is_main: bool,
                      use_origin: Origin | None = None) -> None:
        headers = [s for s in plan_file.statements if isinstance(s, ast.PlanHeader)]
        # A file without spec and mesh is a library (templates only): linting it alone is fine.
        is_plan_like = any(isinstance(s, ast.SpecDecl | ast.MeshDecl) for s in plan_file.statements)
        if is_main and not headers and is_plan_like:
            span = plan_file.statements[0].span if plan_file.statements else plan_file.span
            self.collector.add(messages.at(
                codes.MISSING_PLAN_HEADER, "the main plan file has no 'plan NAME' header",
                Origin(span), help="start the file with 'plan NAME'"))
        if not is_main and headers and use_origin is not None:
            self.collector.add(messages.at(
                codes.PLAN_HEADER_IN_FRAGMENT,
                f"'plan {headers[0].name.name}' in a file included with 'use'",
                Origin(headers[0].span), notes=[f"included at {use_origin.report_span}"],
                help="remove the 'plan' line from the fragment"))

    def _collect_templates(self, plan_file: ast.PlanFile) -> None:
        for stmt in plan_file.statements:
            if not isinstance(stmt, ast.TemplateDef):
                continue
            earlier = self.result.templates.get(stmt.name.name)
            if earlier is not None:
                self.collector.add(messages.conflict(
                    codes.DUPLICATE_TEMPLATE, f"template '{stmt.name.name}' is defined twice",
                    Origin(earlier.definition.span), Origin(stmt.span), [],
                    "rename one of the templates or remove the copy"))
                continue
            self.result.templates[stmt.name.name] = Template(stmt, plan_file.path)


def _arguments(stmt: ast.ApplyStmt, params: list[str]) -> tuple[dict[str, ast.Value], list[str]]:
    """Positional and keyword arguments by parameter name, and what is wrong with them."""
    problems: list[str] = []
    given: dict[str, ast.Value] = dict(zip(params, stmt.args, strict=False))
    if len(stmt.args) > len(params):
        problems.append(f"takes {len(params)} argument(s) but {len(stmt.args)} were given")
    for option in stmt.kwargs:
        key = option.key.name
        if key not in params:
            hint = messages.did_you_mean(key, params)
            problems.append(f"has no parameter '{key}'" + (f"; {hint}" if hint else ""))
        elif key in given:
            problems.append(f"parameter '{key}' is given twice")
        else:
            given[key] = option.value
    return given, problems


def _loop_elements(iterable: ast.Path) -> ast.Path:
    """``layers`` -> ``layers.*``; a path ending in a slice, glob or index is kept."""
    last = iterable.segments[-1] if iterable.segments else None
    if isinstance(last, ast.Name):
        return ast.Path(iterable.segments + (ast.Glob("*", last.span),), iterable.span)
    return iterable


def _file_key(path: str) -> Path | None:
    candidate = Path(path)
    return candidate.resolve() if candidate.is_file() else None


def _not_a_file(path: Path) -> str:
    """Why an existing ``path`` cannot be used (`` (a directory)``), or ``""``."""
    if path.is_dir():
        return " (a directory)"
    if path.is_symlink() and not path.exists():
        return " (a broken symbolic link)"
    if path.exists() and not path.is_file():
        return " (not a regular file)"
    return ""


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def display_path(path: str) -> str:
    """How a used file is named in diagnostics: relative to the working directory when inside
    it (clickable in editors and CI logs), else absolute."""
    cwd = Path.cwd()
    return os.path.relpath(path, cwd) if _within(Path(path), cwd) else path
