"""What the language server knows about one version of one open document.

Everything comes from the stages ``tvp lint`` runs, never from checks of our own: the
diagnostics are ``plan.lint_source`` of the editor's text (the unsaved buffer, not the file
on disk; the files it ``use``s are read from disk, relative to the document's folder), the
syntax tree is ``parse.parse_source`` of it, and templates and ``use`` targets come from the
resolver's expansion (``plan.expand``). Each part is computed on first use and kept until the
text changes (a new ``Analysis``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from functools import cached_property
from pathlib import Path

import trainverify_dsl
from trainverify_dsl.parse import ast, parse_source
from trainverify_dsl.plan import lint_source
from trainverify_dsl.plan.expand import Expander, Expansion
from trainverify_dsl.plan.resolve import parse_loader
from trainverify_dsl.report.diagnostics import Collector, Diagnostic
from trainverify_dsl.report.span import Span

#: Fields of a statement that are its own location, not a part the user wrote inside it.
_OWN_FIELDS = ("span", "kind_span", "body")


class Analysis:
    """One document's text: ``uri`` as the editor names it, ``path`` the file it stands for
    (or the URI itself for a document with no file, such as an unsaved new buffer)."""

    def __init__(self, uri: str, path: str, text: str,
                 project_root: Path = trainverify_dsl.PROJECT_ROOT) -> None:
        self.uri, self.path, self.text = uri, path, text
        self.project_root = project_root

    @cached_property
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        """Exactly ``tvp lint``'s diagnostics for this text."""
        return lint_source(self.text, self.path, project_root=self.project_root)

    @cached_property
    def plan_file(self) -> ast.PlanFile:
        parsed = parse_source(self.text, self.path).plan_file
        assert parsed is not None, "parse_source always returns a file"
        return parsed

    @cached_property
    def expansion(self) -> Expansion:
        """The resolver's walk of this text: every template visible in it and the file each
        ``use`` names (its problems are in ``diagnostics``, not here)."""
        expander = Expander(self.plan_file, parse_loader, self.project_root, Collector())
        return expander.expand()

    def is_this_document(self, file: str) -> bool:
        """Whether a span's ``file`` is this document (spans name it by ``path``)."""
        return file == self.path or real_path(file) == real_path(self.path)

    def statement_at(self, line: int) -> ast.Statement | None:
        """The innermost statement written on 1-based ``line`` (a block's header line gives
        the block)."""
        return _statement_at(self.plan_file.statements, line)

    def uses(self) -> list[ast.UseDecl]:
        return [s for s in self.plan_file.statements if isinstance(s, ast.UseDecl)]


def real_path(file: str) -> Path | None:
    """``file`` as an absolute path with symlinks resolved (relative to the working directory,
    as the resolver names used files), or ``None`` for a name that is no path."""
    try:
        return Path(os.path.abspath(file)).resolve()
    except (OSError, ValueError):
        return None


def _statement_at(statements: tuple[ast.Statement, ...], line: int) -> ast.Statement | None:
    for stmt in statements:
        if not stmt.span.line <= line <= stmt.span.end_line:
            continue
        if isinstance(stmt, ast.ForStmt | ast.TemplateDef) and line != stmt.span.line:
            return _statement_at(stmt.body, line)
        return stmt
    return None


def part_spans(stmt: ast.Statement) -> Iterator[Span]:
    """The spans of what the user wrote inside ``stmt`` (names, paths, values, strings, a
    block's header parts), not its keywords: a word outside all of them is a keyword."""
    for field in fields(stmt):
        if field.name not in _OWN_FIELDS:
            yield from _spans_of(getattr(stmt, field.name))


def _spans_of(value: object) -> Iterator[Span]:
    if isinstance(value, Span):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from _spans_of(item)
    elif isinstance(value, ast.GradRef):  # `grad` is a keyword, its argument is not
        yield value.path.span
    elif is_dataclass(value) and not isinstance(value, type):
        yield value.span  # type: ignore[attr-defined]
