"""Lark reductions -> `.tvp` AST (``parse.ast``), one builder method per grammar rule/alias.

The builder runs *inside* the LALR parser (Lark's inline transformer): each reduction calls
the method named after the rule's alias, so no parse tree is built and nothing recurses, which
keeps parsing fast and makes any nesting the parser accepts safe. The grammar is compiled with
``keep_all_tokens`` so keywords and brackets reach the builder: a node's span runs from its
first token to its last. Each method gets ``(raw, parts)``: ``raw`` is every child (used only
for the span), ``parts`` the children that carry meaning (AST nodes and value tokens).
Expressions and blocks nested deeper than ``MAX_NESTING`` are refused with a diagnostic so
that later passes, which may recurse, never see them.

Spans: the builder works on one chunk of the file (the whole file, or one top-level statement
group during error recovery); ``reset`` sets the file and where the chunk starts. Columns need
no offset because chunks start at the beginning of a line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from lark import Token

from trainverify_dsl.parse import ast
from trainverify_dsl.report import codes_syntax as codes
from trainverify_dsl.report.diagnostics import Code
from trainverify_dsl.report.span import Span, new_span

#: Deepest nesting of expressions, tuples and blocks accepted.
MAX_NESTING = 100
#: Longest digit run / largest decimal exponent a number literal may have.
MAX_DIGITS = 1000
MAX_EXPONENT = 1000

#: Tokens that carry a value; every other token (keywords, brackets, newlines) is structure.
VALUE_TOKENS = frozenset({"NAME", "WORD", "PATH", "VALUE_PATH", "INT", "NUMBER", "STRING",
                          "COLLECTIVE"})

_NUMBER_PARTS = re.compile(r"([0-9_]*)(?:\.([0-9_]*))?(?:[eE]([+-]?[0-9]+))?")
_SLICE_PARTS = re.compile(r"-?[0-9]+|:")
_SEGMENT = re.compile(r"\.?(?P<word>[A-Za-z0-9_*?]+)|\[(?P<bracket>[^\]]*)\]")
_UNESCAPE = re.compile(r"\\(.)")

_SHARD_NAMES = ("S", "Shard")
_REPLICATE_NAMES = ("R", "Replicate")
_PARTIAL_NAMES = ("P", "Partial")


class BuildError(Exception):
    """A construct that parsed but is malformed (bad placement, number out of range...)."""

    def __init__(self, code: Code, message: str, span: Span) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.span = span


# Small carriers for clauses that only exist inside one statement.
@dataclass(frozen=True, slots=True)
class _Axes:
    axes: tuple[ast.Ident, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class _Backward:
    kind: ast.Ident
    span: Span


@dataclass(frozen=True, slots=True)
class _Shard:
    axes: tuple[ast.Ident, ...]
    span: Span


#: Told of every builder call, as ``observer(method, raw, parts, result)``.
Observer = Callable[[Callable[[list[Any], list[Any]], Any], list[Any], list[Any], Any], None]


class InlineCallbacks:
    """The object Lark calls on each reduction: ``rule(children)`` ->
    ``builder.rule(children, parts)``. An ``observer``, when set, is told of every call
    (``parse.shapes`` records a statement's builder calls with it)."""

    def __init__(self, builder: AstBuilder) -> None:
        self.observer: Observer | None = None
        for name in RULE_METHODS:
            setattr(self, name, _adapter(self, getattr(builder, name)))


def _adapter(callbacks: InlineCallbacks, method):
    def callback(children: list[Any]):
        parts = [c for c in children if not isinstance(c, Token) or c.type in VALUE_TOKENS]
        result = method(children, parts)
        if callbacks.observer is not None:
            callbacks.observer(method, children, parts, result)
        return result
    return callback


class AstBuilder:
    """One method per rule alias in ``grammar/tvp.lark``; each gets (raw, children): every
    child of the reduction (for the span) and the meaningful ones."""

    def __init__(self, file: str = "<string>", line_offset: int = 0, pos_offset: int = 0) -> None:
        self.reset(file, line_offset, pos_offset)

    def reset(self, file: str, line_offset: int = 0, pos_offset: int = 0) -> None:
        """Start a chunk: its file and where it starts (lines before it, characters before it)."""
        self.file = file
        self.line_offset = line_offset
        self.pos_offset = pos_offset
        self.depths: dict[int, int] = {}

    def span(self, where: Token | list[Any]) -> Span:
        """The file span of a token, or of a reduction's raw children (first to last)."""
        if isinstance(where, Token):
            return new_span(self.file, where.line + self.line_offset, where.column,
                            where.end_line + self.line_offset, where.end_column,
                            where.start_pos + self.pos_offset, where.end_pos + self.pos_offset)
        first, last = where[0], where[-1]
        if isinstance(first, Token):
            line, col, pos = first.line + self.line_offset, first.column, first.start_pos
            pos += self.pos_offset
        else:
            line, col, pos = first.span.line, first.span.col, first.span.start_pos
        if isinstance(last, Token):
            end_line, end_col = last.end_line + self.line_offset, last.end_column
            end_pos = last.end_pos + self.pos_offset
        else:
            end_line, end_col, end_pos = last.span.end_line, last.span.end_col, last.span.end_pos
        return new_span(self.file, line, col, end_line, end_col, pos, end_pos)

    def _nested(self, node: Any, *children: Any) -> Any:
        """Record ``node``'s nesting depth; refuse it beyond ``MAX_NESTING``."""
        depth = 1 + max((self.depths.get(id(c), 0) for c in children), default=0)
        if depth > MAX_NESTING:
            raise BuildError(codes.NESTING_TOO_DEEP,
                             f"nested too deeply (more than {MAX_NESTING} levels; each "
                             "operator of a chain `a + b + ...` is one)", node.span)
        self.depths[id(node)] = depth
        return node

    def ident(self, token: Token) -> ast.Ident:
        return ast.Ident(str(token), self.span(token))

    # ------------------------------------------------------------ file and header

    def plan_file(self, raw, children) -> tuple[ast.Statement, ...]:
        return tuple(children)

    def plan_header(self, raw, children) -> ast.PlanHeader:
        return ast.PlanHeader(self.ident(children[0]), self.span(raw))

    def spec_decl(self, raw, children) -> ast.SpecDecl:
        model = children[0]
        span = self.span(model)
        return ast.SpecDecl(_unquote(model, span), span, tuple(children[1:]),
                            self.span(raw))

    def setting(self, raw, children) -> ast.Option:
        return ast.Option(children[0], children[1], self.span(raw))

    def mesh_decl(self, raw, children) -> ast.MeshDecl:
        return ast.MeshDecl(tuple(children), self.span(raw))

    def mesh_axis(self, raw, children) -> ast.MeshAxis:
        return ast.MeshAxis(self.ident(children[0]), children[1], self.span(raw))

    def microbatches_decl(self, raw, children) -> ast.MicrobatchesDecl:
        schedule = children[1] if len(children) > 1 else None
        return ast.MicrobatchesDecl(children[0], schedule, self.span(raw))

    def loss_scale_decl(self, raw, children) -> ast.LossScaleDecl:
        return ast.LossScaleDecl(children[0], self.span(raw))

    def loss_reduction_decl(self, raw, children) -> ast.LossReductionDecl:
        mode, *rest = children
        axes = next((c.axes for c in rest if isinstance(c, _Axes)), ())
        options = tuple(c for c in rest if isinstance(c, ast.Option))
        return ast.LossReductionDecl(mode, options, self.span(raw), axes)

    def use_decl(self, raw, children) -> ast.UseDecl:
        path = children[0]
        return ast.UseDecl(_unquote(path, self.span(path)), self.span(path), self.span(raw))

    # ------------------------------------------------------------ layouts

    def split_stmt(self, raw, children) -> ast.SplitStmt:
        return ast.SplitStmt(children[0], tuple(children[1:]), self.span(raw))

    def dim_none(self, raw, children) -> ast.DimEntry:
        return ast.DimEntry((), self.span(raw))

    def dim_axis(self, raw, children) -> ast.DimEntry:
        return ast.DimEntry((self.ident(children[0]),), self.span(raw))

    def dim_axes(self, raw, children) -> ast.DimEntry:
        return ast.DimEntry(tuple(self.ident(t) for t in children), self.span(raw))

    def dim_ordered(self, raw, children) -> ast.DimEntry:
        return ast.DimEntry(tuple(self.ident(t) for t in children[1:]), self.span(raw),
                            self.ident(children[0]))

    def replicate_stmt(self, raw, children) -> ast.ReplicateStmt:
        axes = children[1].axes if len(children) > 1 else ()
        return ast.ReplicateStmt(children[0], axes, self.span(raw))

    def partial_stmt(self, raw, children) -> ast.PartialStmt:
        return ast.PartialStmt(children[0], children[1].axes, tuple(children[2:]),
                               self.span(raw))

    def place_stmt(self, raw, children) -> ast.PlaceStmt:
        return ast.PlaceStmt(children[0], tuple(children[1:]), self.span(raw))

    def named_placement(self, raw, children) -> ast.Placement:
        return replace(children[1], axis=self.ident(children[0]), span=self.span(raw))

    def positional_placement(self, raw, children) -> ast.Placement:
        return children[0]

    def place_bare(self, raw, children) -> ast.Placement:
        name = str(children[0])
        if name in _REPLICATE_NAMES:
            return ast.Placement("replicate", None, None, None, self.span(raw))
        if name in _PARTIAL_NAMES:
            return ast.Placement("partial", None, None, None, self.span(raw))
        if name in _SHARD_NAMES:
            raise self._placement_error(raw, f"'{name}' needs the tensor dimension: {name}(0)")
        raise self._placement_error(raw, f"unknown placement '{name}'")

    def place_empty(self, raw, children) -> ast.Placement:
        """``R()`` / ``Partial()``: the same meaning as the bare name."""
        return self.place_bare(raw, children)

    def place_dim(self, raw, children) -> ast.Placement:
        name, dim = str(children[0]), children[1]
        if name not in _SHARD_NAMES:
            raise self._placement_error(raw, f"'{name}(...)' does not take a dimension")
        return ast.Placement("shard", self._int(dim), None, None, self.span(raw))

    def place_op(self, raw, children) -> ast.Placement:
        name, op = str(children[0]), children[1]
        if name not in _PARTIAL_NAMES:
            raise self._placement_error(raw, f"'{name}(...)' does not take a reduce op")
        return ast.Placement("partial", None, self.ident(op), None, self.span(raw))

    def _placement_error(self, raw, message: str) -> BuildError:
        hint = "; expected S(dim), R or P(op) (or Shard(dim), Replicate(), Partial(op))"
        return BuildError(codes.BAD_PLACEMENT, message + hint, self.span(raw))

    # ------------------------------------------------------------ communication

    def collective_stmt(self, raw, children) -> ast.CollectiveStmt:
        kind, target, axes, *rest = children
        backward = self._single_backward(rest)
        options = tuple(item for item in rest if isinstance(item, ast.Option))
        return ast.CollectiveStmt(str(kind), self.span(kind), target, axes.axes, options,
                                  backward, self.span(raw))

    def _single_backward(self, items: list[Any]) -> ast.Ident | None:
        kinds = [item.kind for item in items if isinstance(item, _Backward)]
        if len(kinds) > 1:
            raise BuildError(codes.DUPLICATE_BACKWARD,
                             "a collective states its backward once; "
                             f"'backward {kinds[1].name}' repeats it", kinds[1].span)
        return kinds[0] if kinds else None

    def backward(self, raw, children) -> _Backward:
        return _Backward(children[0], self.span(raw))

    def send_stmt(self, raw, children) -> ast.SendStmt:
        return ast.SendStmt(children[0], children[1], children[2], self.span(raw))

    def pipeline_stage_stmt(self, raw, children) -> ast.PipelineStageStmt:
        return ast.PipelineStageStmt(children[0], tuple(children[1:]), self.span(raw))

    # ------------------------------------------------------------ optimizer, algorithms

    def optimizer_decl(self, raw, children) -> ast.OptimizerDecl:
        kind, *rest = children
        shard = rest.pop().axes if rest and isinstance(rest[-1], _Shard) else ()
        return ast.OptimizerDecl(kind, tuple(rest), shard, self.span(raw))

    def spec_optimizer_decl(self, raw, children) -> ast.SpecOptimizerDecl:
        kind, *rest = children
        return ast.SpecOptimizerDecl(kind, tuple(rest), self.span(raw))

    def shard(self, raw, children) -> _Shard:
        return _Shard(children[0].axes, self.span(raw))

    def on_stmt(self, raw, children) -> ast.OnStmt:
        *items, body = children
        coords = tuple(c for c in items if isinstance(c, ast.OnCoord))
        targets = tuple(c for c in items if isinstance(c, ast.Path))
        return ast.OnStmt(coords, body, self.span(raw), targets)

    def on_coord(self, raw, children) -> ast.OnCoord:
        path, value = children
        # a coordinate names a mesh axis: one plain name (the lexer reads it as a path, the
        # form an `on` statement's parameter targets take)
        if len(path.segments) != 1 or not isinstance(path.segments[0], ast.Name):
            raise BuildError(codes.UNEXPECTED_TOKEN, "a coordinate of `on` names a mesh axis "
                             "(`on dp=1: ...`), not a path", path.span)
        name = path.segments[0]
        return ast.OnCoord(ast.Ident(name.name, path.span), value, self.span(raw))

    def clip_grad_norm_decl(self, raw, children) -> ast.ClipGradNormDecl:
        max_norm, *rest = children
        axes = next((c.axes for c in rest if isinstance(c, _Axes)), ())
        options = tuple(c for c in rest if isinstance(c, ast.Option))
        return ast.ClipGradNormDecl(max_norm, options, self.span(raw), axes)

    def algorithm_stmt(self, raw, children) -> ast.AlgorithmStmt:
        name, *rest = children
        targets = tuple(c for c in rest if isinstance(c, ast.Path | ast.GradRef))
        axes = next((c.axes for c in rest if isinstance(c, _Axes)), ())
        options = tuple(c for c in rest if isinstance(c, ast.Option))
        return ast.AlgorithmStmt(name, targets, axes, options, self.span(raw))

    # ------------------------------------------------------------ templates and loops

    def template_def(self, raw, children) -> ast.TemplateDef:
        name, *rest = children
        params = tuple(c for c in rest if isinstance(c, ast.Param))
        body = tuple(c for c in rest if not isinstance(c, ast.Param))
        node = ast.TemplateDef(self.ident(name), params, body, self._block_span(raw, body))
        return self._nested(node, *body)

    def param(self, raw, children) -> ast.Param:
        default = children[1] if len(children) > 1 else None
        return ast.Param(self.ident(children[0]), default, self.span(raw))

    def apply_stmt(self, raw, children) -> ast.ApplyStmt:
        name, *arguments = children
        args, kwargs = [], []
        for argument in arguments:
            if isinstance(argument, ast.Option):
                kwargs.append(argument)
            elif kwargs:
                raise BuildError(codes.POSITIONAL_AFTER_KEYWORD,
                                 "a positional argument follows a keyword argument",
                                 _value_span(argument))
            else:
                args.append(argument)
        return ast.ApplyStmt(self.ident(name), tuple(args), tuple(kwargs), self.span(raw))

    def for_stmt(self, raw, children) -> ast.ForStmt:
        var, *rest = children
        iterables = tuple(c for c in rest if isinstance(c, ast.Path))
        body = tuple(rest[len(iterables):])
        node = ast.ForStmt(self.ident(var), iterables, body, self._block_span(raw, body))
        return self._nested(node, *body)

    def _block_span(self, raw, body: tuple[ast.Statement, ...]) -> Span:
        """Header start to the end of the last body statement (the tree's own end would
        reach into the next line's indentation)."""
        start, end = self.span(raw), body[-1].span if body else self.span(raw)
        return Span(self.file, start.line, start.col, end.end_line, end.end_col,
                    start.start_pos, end.end_pos)

    # ------------------------------------------------------------ targets and paths

    def grad_ref(self, raw, children) -> ast.GradRef:
        return ast.GradRef(children[0], self.span(raw))

    def path(self, raw, children) -> ast.Path:
        return self._path(children[0])

    def value_path(self, raw, children) -> ast.Path:
        return self._path(children[0])

    def _path(self, token: Token) -> ast.Path:
        span = self.span(token)
        return ast.Path(self._segments(token, span), span)

    def _segments(self, token: Token, span: Span) -> tuple[ast.Segment, ...]:
        """Split a PATH token (at ``span``): ``layers[0:8].*.wq`` -> Name, Slice, Glob, Name."""
        text = str(token)
        if "[" not in text:  # the common case: words between dots, read without a regex
            return self._dotted_segments(token, text, span)
        return tuple(self._segment(token, match) for match in _SEGMENT.finditer(text))

    def _dotted_segments(self, token: Token, text: str, span: Span) -> tuple[ast.Segment, ...]:
        """``_segments`` of a path without brackets: what ``_SEGMENT`` finds, one word per
        dot-separated part (PATH has no empty part)."""
        line, column, pos = span.line, span.col, span.start_pos
        segments: list[ast.Segment] = []
        start = 0
        for word in text.split("."):
            end = start + len(word)
            word_span = new_span(self.file, line, column + start, line, column + end,
                                 pos + start, pos + end)
            if word.isidentifier():  # a name (the glob and index characters are not)
                segments.append(ast.Name(word, word_span))
            else:
                segments.append(self._word(token, word, word_span))
            start = end + 1
        return tuple(segments)

    def _segment(self, token: Token, match: re.Match) -> ast.Segment:
        word = match["word"]
        if word is None:
            span = self._sub_span(token, match.start(), match.end())
            inside = match["bracket"]
            if ":" not in inside:
                return ast.Index(self._int(token, inside.strip()), span)
            bounds = [None if part is None else self._int(token, part)
                      for part in _slice_parts(inside)]
            return ast.Slice(bounds[0], bounds[1], bounds[2], span)
        return self._word(token, word, self._sub_span(token, match.start("word"),
                                                      match.end("word")))

    def _word(self, token: Token, word: str, span: Span) -> ast.Segment:
        if word.isdigit():
            return ast.Index(self._int(token, word), span)
        if "*" in word or "?" in word:
            return ast.Glob(word, span)
        return ast.Name(word, span)

    def _sub_span(self, token: Token, start: int, end: int) -> Span:
        """The span of ``token[start:end]`` (paths never span lines)."""
        line = token.line + self.line_offset
        pos = token.start_pos + self.pos_offset
        return new_span(self.file, line, token.column + start, line, token.column + end,
                        pos + start, pos + end)

    def over(self, raw, children) -> _Axes:
        return _Axes(tuple(self.ident(t) for t in children), self.span(raw))

    # ------------------------------------------------------------ options and values

    def option(self, raw, children) -> ast.Option:
        return ast.Option(children[0], children[1], self.span(raw))

    def word(self, raw, children) -> ast.Ident:
        return self.ident(children[0])

    def tuple_value(self, raw, children) -> ast.TupleValue:
        return self._nested(ast.TupleValue(tuple(children), self.span(raw)), *children)

    def add(self, raw, children) -> ast.BinOp:
        return self._binop("+", raw, children)

    def sub(self, raw, children) -> ast.BinOp:
        return self._binop("-", raw, children)

    def mul(self, raw, children) -> ast.BinOp:
        return self._binop("*", raw, children)

    def div(self, raw, children) -> ast.BinOp:
        return self._binop("/", raw, children)

    def _binop(self, op: str, raw, children) -> ast.BinOp:
        node = ast.BinOp(op, children[0], children[1], self.span(raw))
        return self._nested(node, *children)

    def neg(self, raw, children) -> ast.Neg:
        return self._nested(ast.Neg(children[0], self.span(raw)), children[0])

    def parens(self, raw, children) -> ast.Expr:
        """``( expr )``: parentheses only group."""
        return children[0]

    def num(self, raw, children) -> ast.Num:
        token = children[0]
        return ast.Num(self._fraction(token), str(token), self.span(token))

    def name_ref(self, raw, children) -> ast.NameRef:
        return ast.NameRef(str(children[0]), self.span(children[0]))

    # ------------------------------------------------------------ literals

    def _int(self, token: Token, text: str | None = None) -> int:
        text = (str(token) if text is None else text).replace("_", "")
        if len(text.lstrip("-")) > MAX_DIGITS:
            raise self._range_error(token)
        return int(text)

    def _fraction(self, token: Token) -> Fraction:
        """Exact value of a number literal; refuses literals whose value would be huge to
        compute (``1e999999999``) instead of hanging."""
        text = str(token)
        if len(text) <= 30 and "e" not in text and "E" not in text:
            return Fraction(text.replace("_", ""))  # the common case, exact and fast
        match = _NUMBER_PARTS.fullmatch(text)
        whole, frac, exponent = match.group(1), match.group(2) or "", match.group(3) or "0"
        digits = (whole + frac).replace("_", "")
        too_long = len(digits) > MAX_DIGITS or len(exponent.lstrip("+-")) > 6
        if too_long or abs(int(exponent)) > MAX_EXPONENT:
            raise self._range_error(token)
        mantissa = Fraction(int(digits or "0"), 10 ** len(frac.replace("_", "")))
        return mantissa * Fraction(10) ** int(exponent)

    def _range_error(self, token: Token) -> BuildError:
        return BuildError(codes.NUMBER_OUT_OF_RANGE,
                          f"number literal is too large (at most {MAX_DIGITS} digits and an "
                          f"exponent of at most {MAX_EXPONENT})", self.span(token))


def _unquote(token: Token, span: Span) -> str:
    """The string's text; an escape other than ``\\"`` and ``\\\\`` is TVP116 at it."""
    text = str(token)[1:-1]
    for match in _UNESCAPE.finditer(text):
        if match.group(1) not in ('"', "\\"):
            col, at = span.col + 1 + match.start(), span.start_pos + 1 + match.start()
            raise BuildError(codes.UNKNOWN_ESCAPE, f"unknown escape `\\{match.group(1)}` in "
                             "a string: only `\\\"` and `\\\\` are escapes (paths use `/`)",
                             Span(span.file, span.line, col, span.line, col + 2, at, at + 2))
    return _UNESCAPE.sub(r"\1", text)


def _slice_parts(text: str) -> list[str | None]:
    """``0:8`` -> ['0', '8', None]; ``::2`` -> [None, None, '2']."""
    parts: list[str | None] = [None, None, None]
    position = 0
    for piece in _SLICE_PARTS.findall(text):
        if piece == ":":
            position += 1
        else:
            parts[position] = piece
    return parts


def _value_span(value: Any) -> Span:
    return value.span


#: The builder methods Lark calls, one per rule alias of ``grammar/tvp.lark``.
RULE_METHODS = tuple(
    name for name, value in vars(AstBuilder).items()
    if callable(value) and not name.startswith("_") and name not in ("reset", "span", "ident")
)
