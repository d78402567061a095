"""``tvp fmt``: print a `.tvp` AST back as canonical text, keeping every comment.

Canonical style:

- one statement per line, indented 4 spaces per block level; single spaces between words;
  ``key=value`` without spaces; ``, `` after every comma; ``[dp, -]``, ``(dp, cp)``,
  ``grad(x)``; ``over dp, cp`` (never the parenthesised form);
- expressions: ``+``/``-`` with spaces, ``*``/``/`` without (``1/microbatches``,
  ``batch - 1``); only the parentheses precedence needs; numbers keep their written text;
- paths: ``layers.3`` for indices, ``layers[0:8]`` for slices; placements in short form
  (``S(0)``, ``R``, ``P(sum)``, bare ``P`` for the default op);
- collectives print their options before ``backward``; ``shard over`` ends ``optimizer``;
- blank lines: runs of blank lines shrink to one; none at the start of the file or right
  after a block header; a top-level ``for``/``template`` block always has a blank line
  before it (unless a comment sits directly above it) and after it;
- comments stay where they were: a trailing comment stays on its statement's line, two
  spaces after the code; an own-line comment stays before the statement it preceded, at
  that statement's indentation (or at the end of the block it was indented into).

Formatting is idempotent, and re-parsing the output gives the same AST (spans aside).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from trainverify_dsl.parse import ast
from trainverify_dsl.parse.parser import parse_source
from trainverify_dsl.report.diagnostics import Diagnostic, Severity

INDENT = "    "
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_NEG_PRECEDENCE = 3


@dataclass(frozen=True, slots=True)
class FormatResult:
    """``text`` is the formatted file, or ``None`` when the file has syntax errors."""

    text: str | None
    diagnostics: tuple[Diagnostic, ...]


def format_source(text: str, file: str = "<string>") -> FormatResult:
    result = parse_source(text, file)
    has_errors = any(d.severity is Severity.ERROR for d in result.diagnostics)
    if has_errors or result.plan_file is None:
        return FormatResult(None, result.diagnostics)
    return FormatResult(format_plan(result.plan_file), result.diagnostics)


def same_meaning(original: str, formatted: str, file: str) -> bool:
    """Both texts parse to the same AST, spans and comments aside (black's safety check):
    ``tvp fmt`` and the editor's formatting refuse a result for which this is false."""
    before, after = parse_source(original, file), parse_source(formatted, file)
    if after.diagnostics or before.plan_file is None or after.plan_file is None:
        return False
    return bool(ast.strip_spans(before.plan_file) == ast.strip_spans(after.plan_file))


def format_plan(plan_file: ast.PlanFile) -> str:
    printer = _Printer(plan_file)
    printer.block(plan_file.statements, 0)
    printer.remaining_comments()
    return "\n".join(printer.lines) + "\n" if printer.lines else ""


# ---------------------------------------------------------------- layout of lines


def _walk(statements: tuple[ast.Statement, ...]) -> Iterator[ast.Statement]:
    for statement in statements:
        yield statement
        if isinstance(statement, ast.ForStmt | ast.TemplateDef):
            yield from _walk(statement.body)


class _Printer:
    """Emits statements and comments in source order, deciding indentation and blanks."""

    def __init__(self, plan_file: ast.PlanFile) -> None:
        header_lines = {s.span.line for s in _walk(plan_file.statements)}
        comments = sorted(plan_file.comments, key=lambda c: (c.span.line, c.span.col))
        self.trailing = {c.span.line: c for c in comments if c.span.line in header_lines}
        self.pending = [c for c in comments if c.span.line not in header_lines]
        self.lines: list[str] = []
        self.last_line = 0
        self.depth_columns: dict[int, int] = {}
        self.prev_depth = 0
        self.just_opened = False
        self.after_top_block = False
        self.prev_was_comment = False

    def block(self, statements: tuple[ast.Statement, ...], depth: int) -> None:
        for statement in statements:
            self.statement(statement, depth)

    def statement(self, statement: ast.Statement, depth: int) -> None:
        self._comments_before(statement.span.line, statement.span.col, depth)
        is_block = isinstance(statement, ast.ForStmt | ast.TemplateDef)
        forced = depth == 0 and is_block and not self.prev_was_comment
        self._separate(statement.span.line, depth, forced)
        text = INDENT * depth + statement_text(statement)
        trailing = self.trailing.get(statement.span.line)
        if trailing is not None and statement.span.line > 0:
            text += "  " + trailing.text
        self._emit(text, statement.span.line, depth, is_comment=False)
        self.depth_columns[depth] = statement.span.col
        if is_block:
            self.just_opened = True
            self.block(statement.body, depth + 1)
            self.just_opened = False
            self.after_top_block = self.after_top_block or depth == 0

    def remaining_comments(self) -> None:
        self._comments_before(None, 1, 0)

    def _comments_before(self, line: int | None, col: int, depth: int) -> None:
        while self.pending and (line is None or self.pending[0].span.line < line):
            comment = self.pending.pop(0)
            comment_depth = self._comment_depth(comment, col, depth)
            self._separate(comment.span.line, comment_depth, False)
            self._emit(INDENT * comment_depth + comment.text, comment.span.line,
                       comment_depth, is_comment=True)

    def _comment_depth(self, comment: ast.Comment, next_col: int, depth: int) -> int:
        """A comment indented deeper than the next statement stays in the block that
        just ended (at the deepest level whose column it reaches)."""
        if comment.span.col <= next_col:
            return depth
        for level in range(self.prev_depth, depth, -1):
            if self.depth_columns.get(level, 1) <= comment.span.col:
                return level
        return depth

    def _separate(self, line: int, depth: int, forced: bool) -> None:
        if not self.lines or self.just_opened:
            return
        after_block = depth == 0 and self.after_top_block
        if forced or after_block or line - self.last_line > 1:
            self.lines.append("")

    def _emit(self, text: str, line: int, depth: int, is_comment: bool) -> None:
        self.lines.append(text.rstrip())
        self.last_line = max(self.last_line, line)
        self.prev_depth = depth
        self.just_opened = False
        self.prev_was_comment = is_comment
        if depth == 0:
            self.after_top_block = False


# ---------------------------------------------------------------- statements


def statement_text(statement: ast.Statement) -> str:
    """The canonical one-line text of a statement (a block statement: its header)."""
    return _STATEMENT_PRINTERS[type(statement)](statement)


def _plan_header(s: ast.PlanHeader) -> str:
    return f"plan {s.name.name}"


def _spec_decl(s: ast.SpecDecl) -> str:
    settings = "".join(f" {o.key.name} {value_text(o.value)}" for o in s.settings)
    return f"spec {quote(s.model)}{settings}"


def _mesh_decl(s: ast.MeshDecl) -> str:
    return "mesh " + ", ".join(f"{a.name.name}={expr_text(a.size)}" for a in s.axes)


def _microbatches_decl(s: ast.MicrobatchesDecl) -> str:
    schedule = f" schedule {s.schedule.name}" if s.schedule is not None else ""
    return f"microbatches {expr_text(s.count)}{schedule}"


def _loss_scale_decl(s: ast.LossScaleDecl) -> str:
    return f"loss-scale {expr_text(s.value)}"


def _use_decl(s: ast.UseDecl) -> str:
    return f"use {quote(s.path)}"


def _split_stmt(s: ast.SplitStmt) -> str:
    return f"split {target_text(s.target)} [{', '.join(_dim_text(d) for d in s.dims)}]"


def _dim_text(entry: ast.DimEntry) -> str:
    if entry.order is not None:
        return f"{entry.order.name}({_names(entry.axes)})"
    if not entry.axes:
        return "-"
    if len(entry.axes) == 1:
        return entry.axes[0].name
    return "(" + _names(entry.axes) + ")"


def _replicate_stmt(s: ast.ReplicateStmt) -> str:
    axes = _over(s.axes) if s.axes else ""
    return f"replicate {target_text(s.target)}{axes}"


def _partial_stmt(s: ast.PartialStmt) -> str:
    return f"partial {target_text(s.target)}{_over(s.axes)}{_options(s.options)}"


def _place_stmt(s: ast.PlaceStmt) -> str:
    return f"place {target_text(s.target)} [{', '.join(_placement(p) for p in s.placements)}]"


def _placement(p: ast.Placement) -> str:
    if p.kind == "shard":
        text = f"S({p.dim})"
    elif p.kind == "partial":
        text = f"P({p.op.name})" if p.op is not None else "P"
    else:
        text = "R"
    return f"{p.axis.name}={text}" if p.axis is not None else text


def _collective_stmt(s: ast.CollectiveStmt) -> str:
    backward = f" backward {s.backward.name}" if s.backward is not None else ""
    return f"{s.kind} {target_text(s.target)}{_over(s.axes)}{_options(s.options)}{backward}"


def _send_stmt(s: ast.SendStmt) -> str:
    return f"send {target_text(s.target)} from {expr_text(s.source)} to {expr_text(s.dest)}"


def _pipeline_stage_stmt(s: ast.PipelineStageStmt) -> str:
    members = ", ".join(path_text(m) for m in s.members)
    return f"pipeline-stage {expr_text(s.index)}: {members}"


def _spec_optimizer_decl(s: ast.SpecOptimizerDecl) -> str:
    return f"spec-optimizer {s.kind.name}{_options(s.options)}"


def _optimizer_decl(s: ast.OptimizerDecl) -> str:
    shard = f" shard{_over(s.shard_axes)}" if s.shard_axes else ""
    return f"optimizer {s.kind.name}{_options(s.options)}{shard}"


def _on_stmt(s: ast.OnStmt) -> str:
    items = [f"{c.axis.name}={expr_text(c.value)}" for c in s.coords] + \
        [path_text(t) for t in s.targets]
    body = _spec_optimizer_decl(s.body) if isinstance(s.body, ast.SpecOptimizerDecl) else \
        _optimizer_decl(s.body)
    return f"on {', '.join(items)}: {body}"


def _loss_reduction_decl(s: ast.LossReductionDecl) -> str:
    axes = _over(s.axes) if s.axes else ""
    return f"loss-reduction {s.mode.name}{axes}{_options(s.options)}"


def _clip_grad_norm_decl(s: ast.ClipGradNormDecl) -> str:
    axes = _over(s.axes) if s.axes else ""
    return f"clip-grad-norm {expr_text(s.max_norm)}{axes}{_options(s.options)}"


def _algorithm_stmt(s: ast.AlgorithmStmt) -> str:
    targets = ", ".join(target_text(t) for t in s.targets)
    axes = _over(s.axes) if s.axes else ""
    return f"algorithm {s.name.name} for {targets}{axes}{_options(s.options)}"


def _template_def(s: ast.TemplateDef) -> str:
    params = ", ".join(_param(p) for p in s.params)
    return f"template {s.name.name}({params}):"


def _param(p: ast.Param) -> str:
    return p.name.name if p.default is None else f"{p.name.name}={value_text(p.default)}"


def _apply_stmt(s: ast.ApplyStmt) -> str:
    arguments = [value_text(a) for a in s.args] + [_option(o) for o in s.kwargs]
    return f"apply {s.name.name}({', '.join(arguments)})"


def _for_stmt(s: ast.ForStmt) -> str:
    return f"for {s.var.name} in {', '.join(path_text(p) for p in s.iterables)}:"


_STATEMENT_PRINTERS = {
    ast.PlanHeader: _plan_header, ast.SpecDecl: _spec_decl, ast.MeshDecl: _mesh_decl,
    ast.MicrobatchesDecl: _microbatches_decl, ast.LossScaleDecl: _loss_scale_decl,
    ast.LossReductionDecl: _loss_reduction_decl, ast.OnStmt: _on_stmt,
    ast.UseDecl: _use_decl, ast.SplitStmt: _split_stmt, ast.ReplicateStmt: _replicate_stmt,
    ast.PartialStmt: _partial_stmt, ast.PlaceStmt: _place_stmt,
    ast.CollectiveStmt: _collective_stmt, ast.SendStmt: _send_stmt,
    ast.PipelineStageStmt: _pipeline_stage_stmt, ast.OptimizerDecl: _optimizer_decl,
    ast.SpecOptimizerDecl: _spec_optimizer_decl,
    ast.ClipGradNormDecl: _clip_grad_norm_decl, ast.AlgorithmStmt: _algorithm_stmt,
    ast.TemplateDef: _template_def, ast.ApplyStmt: _apply_stmt, ast.ForStmt: _for_stmt,
}

# ---------------------------------------------------------------- pieces


def _names(idents: tuple[ast.Ident, ...]) -> str:
    return ", ".join(i.name for i in idents)


def _over(axes: tuple[ast.Ident, ...]) -> str:
    return f" over {_names(axes)}"


def _option(option: ast.Option) -> str:
    return f"{option.key.name}={value_text(option.value)}"


def _options(options: tuple[ast.Option, ...]) -> str:
    return "".join(" " + _option(o) for o in options)


def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def target_text(target: ast.Target) -> str:
    if isinstance(target, ast.GradRef):
        return f"grad({path_text(target.path)})"
    return path_text(target)


def path_text(path: ast.Path) -> str:
    parts = []
    for index, segment in enumerate(path.segments):
        text = _segment_text(segment)
        if isinstance(segment, ast.Index) and segment.index < 0:
            text = f"[{text}]"  # `layers.-1` does not parse; `layers[-1]` does
        bracketed = isinstance(segment, ast.Slice) or text.startswith("[")
        parts.append(text if index == 0 or bracketed else "." + text)
    return "".join(parts)


def _segment_text(segment: ast.Segment) -> str:
    if isinstance(segment, ast.Name):
        return segment.name
    if isinstance(segment, ast.Glob):
        return segment.pattern
    if isinstance(segment, ast.Index):
        return str(segment.index)
    bounds = ["" if b is None else str(b) for b in (segment.start, segment.stop)]
    step = "" if segment.step is None else f":{segment.step}"
    return f"[{bounds[0]}:{bounds[1]}{step}]"


def value_text(value: ast.Value) -> str:
    if isinstance(value, ast.Path):
        return path_text(value)
    if isinstance(value, ast.TupleValue):
        items = [value_text(v) for v in value.items]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    return expr_text(value)


def expr_text(expr: ast.Expr, parent: int = 0, right_operand: bool = False) -> str:
    """Expression text with the parentheses precedence and left associativity need."""
    if isinstance(expr, ast.Num):
        return expr.text
    if isinstance(expr, ast.NameRef):
        return expr.name
    if isinstance(expr, ast.Neg):
        return "-" + expr_text(expr.operand, _NEG_PRECEDENCE)
    if isinstance(expr, ast.BinOp):
        precedence = _PRECEDENCE[expr.op]
        left = expr_text(expr.left, precedence)
        right = expr_text(expr.right, precedence, right_operand=True)
        text = f"{left} {expr.op} {right}" if precedence == 1 else f"{left}{expr.op}{right}"
        needs_parens = precedence < parent or (precedence == parent and right_operand)
        return f"({text})" if needs_parens else text
    return value_text(expr)
