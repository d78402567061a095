"""Reading foreign plan files as located data, never as code.

Two readers produce the same tree of ``Node``s, each with the span it was read from and a
readable path (``base_model_tp_plan["layers.*.self_attn.q_proj"]``) for messages:

- ``read_json``: a small JSON parser of its own (RFC 8259: objects, arrays, strings, numbers,
  ``true``/``false``/``null``) that records line and column of every value and key; Python's
  ``json`` module does not. A key given twice is refused (``json`` would keep the last).
- ``read_python``: ``ast.parse`` of a Python file (parsing runs nothing), then only the
  top-level assignments ``NAME = <literal>`` are read; every other statement besides imports
  and docstrings is refused: the importer cannot know what it would change.
  ``read_class_attributes`` reads chosen class-level literals of a larger file (a
  transformers configuration module) and refuses any other mention of those names.
  Literals are constants, dicts, lists, tuples, ``-number`` and calls ``Name(args,
  key=value)`` whose arguments are literals again: a parallel style such as
  ``RowwiseParallel(output_layouts=Shard(1))`` becomes a ``Call`` node, never an object.

Problems raise ``Unreadable`` carrying a TVP601 diagnostic at the offending position.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainverify_dsl.report import codes_import as codes
from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.span import Span

#: Nesting deeper than this is refused (a foreign file must not exhaust the stack).
MAX_DEPTH = 100
#: Longest foreign text quoted in a message.
QUOTE_LIMIT = 60


@dataclass(frozen=True, slots=True)
class Call:
    """``Name(args..., key=value...)`` from a Python literal or a style string."""

    name: str
    args: tuple[Node, ...]
    kwargs: tuple[tuple[str, Node], ...]


@dataclass(frozen=True, slots=True)
class Node:
    """One value of a foreign file. ``value`` is a ``str``, ``int``, ``float``, ``bool``,
    ``None``, a ``tuple`` of nodes (a JSON array, a Python list or tuple), a ``dict`` from keys
    to nodes (insertion order kept) or a ``Call``."""

    value: object
    span: Span
    path: str
    #: where the key naming this value stands (object members only)
    key_span: Span | None = None

    @property
    def key_or_value_span(self) -> Span:
        return self.key_span or self.span

    def get(self, key: str) -> Node | None:
        return self.value.get(key) if isinstance(self.value, dict) else None

    def items(self) -> Iterator[tuple[str, Node]]:
        assert isinstance(self.value, dict)
        return iter(self.value.items())

    @property
    def is_object(self) -> bool:
        return isinstance(self.value, dict)


class Unreadable(Exception):
    """The file cannot be read as data; ``diagnostic`` says where and why."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


def quoted(text: str) -> str:
    """Foreign text for a message: repr-quoted, control characters escaped, cut to
    ``QUOTE_LIMIT`` characters."""
    shown = text if len(text) <= QUOTE_LIMIT else text[:QUOTE_LIMIT] + "…"
    return json.dumps(shown, ensure_ascii=False)


def child_path(parent: str, key: str | int) -> str:
    part = f"[{key}]" if isinstance(key, int) else f"[{quoted(key)}]"
    return f"{parent}{part}" if parent else part


def read_text(path: str) -> str:
    """The file's text (UTF-8, a leading byte-order mark dropped), or ``Unreadable``."""
    where = Span.point(path, 1, 1)
    try:
        if not Path(path).is_file():
            why = "it is a directory" if Path(path).is_dir() else \
                "not a regular file" if Path(path).exists() else "no such file"
            raise Unreadable(Diagnostic(codes.UNREADABLE_IMPORT,
                                        f"cannot read '{path}': {why}", where))
        data = Path(path).read_bytes()
    except OSError as error:
        raise Unreadable(Diagnostic(codes.UNREADABLE_IMPORT,
                                    f"cannot read '{path}': {error.strerror}", where)) from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        raise Unreadable(Diagnostic(codes.UNREADABLE_IMPORT,
                                    f"'{path}' is not UTF-8 text (byte {error.start})",
                                    where)) from None


# ---------------------------------------------------------------- JSON with positions


class _JsonReader:
    """Recursive descent over the text; positions are 1-based line and column."""

    def __init__(self, text: str, file: str) -> None:
        self.text = text
        self.file = file
        self.pos = 0
        self.line_starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]

    def span(self, start: int, end: int) -> Span:
        line, col = self.where(start)
        end_line, end_col = self.where(end)
        return Span(self.file, line, col, end_line, end_col, start, end)

    def where(self, pos: int) -> tuple[int, int]:
        import bisect

        index = bisect.bisect_right(self.line_starts, pos) - 1
        return index + 1, pos - self.line_starts[index] + 1

    def fail(self, message: str, pos: int | None = None) -> Unreadable:
        at = self.pos if pos is None else pos
        return Unreadable(Diagnostic(codes.UNREADABLE_IMPORT, f"not valid JSON: {message}",
                                     self.span(at, min(at + 1, len(self.text)))))

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def document(self) -> Node:
        self.skip_space()
        node = self.value("", 0)
        self.skip_space()
        if self.pos != len(self.text):
            raise self.fail("text after the end of the document")
        return node

    def value(self, path: str, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise self.fail(f"nested more than {MAX_DEPTH} levels deep")
        if self.pos >= len(self.text):
            raise self.fail("unexpected end of the file")
        start, ch = self.pos, self.text[self.pos]
        if ch == "{":
            return Node(self.members(path, depth), self.span(start, self.pos), path)
        if ch == "[":
            return Node(self.elements(path, depth), self.span(start, self.pos), path)
        if ch == '"':
            return Node(self.string(), self.span(start, self.pos), path)
        for word, constant in (("true", True), ("false", False), ("null", None)):
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return Node(constant, self.span(start, self.pos), path)
        return Node(self.number(), self.span(start, self.pos), path)

    def members(self, path: str, depth: int) -> dict[str, Node]:
        self.pos += 1
        found: dict[str, Node] = {}
        self.skip_space()
        if self.peek() == "}":
            self.pos += 1
            return found
        while True:
            self.skip_space()
            key_start = self.pos
            if self.peek() != '"':
                raise self.fail("expected a double-quoted key")
            key = self.string()
            if key in found:
                raise self.fail(f"the key {quoted(key)} appears twice", key_start)
            key_span = self.span(key_start, self.pos)
            self.skip_space()
            self.expect(":")
            self.skip_space()
            member = self.value(child_path(path, key), depth + 1)
            found[key] = Node(member.value, member.span, member.path, key_span)
            if self.separator("}"):
                return found

    def elements(self, path: str, depth: int) -> tuple[Node, ...]:
        self.pos += 1
        found: list[Node] = []
        self.skip_space()
        if self.peek() == "]":
            self.pos += 1
            return ()
        while True:
            self.skip_space()
            found.append(self.value(child_path(path, len(found)), depth + 1))
            if self.separator("]"):
                return tuple(found)

    def separator(self, closing: str) -> bool:
        """After a member or element: ``True`` at the closing bracket, ``False`` after a
        comma that another member follows."""
        self.skip_space()
        ch = self.peek()
        self.pos += 1
        if ch == closing:
            return True
        if ch != ",":
            raise self.fail(f"expected ',' or '{closing}'", self.pos - 1)
        comma = self.pos - 1
        self.skip_space()
        if self.peek() == closing:
            raise self.fail(f"a trailing comma before '{closing}'", comma)
        return False

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            raise self.fail(f"expected '{ch}'")
        self.pos += 1

    def string(self) -> str:
        """A JSON string starting at ``pos``; the standard library decodes its escapes."""
        start = self.pos
        self.pos += 1
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if ch == "\\":
                self.pos += 2
                continue
            if ch == '"':
                self.pos += 1
                try:
                    return str(json.loads(self.text[start:self.pos]))
                except json.JSONDecodeError as error:
                    raise self.fail(error.msg, start + error.pos) from None
            if ch < " ":
                raise self.fail("a control character inside a string")
            self.pos += 1
        raise self.fail("a string that is never closed", start)

    def number(self) -> int | float:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in "+-0123456789.eE":
            self.pos += 1
        literal = self.text[start:self.pos]
        if not literal:
            raise self.fail("expected a value", start)
        try:
            value = json.loads(literal)
        except json.JSONDecodeError:
            raise self.fail(f"{quoted(literal)} is not a number", start) from None
        if not isinstance(value, (int, float)):
            raise self.fail(f"{quoted(literal)} is not a number", start)
        return value


def read_json(text: str, file: str) -> Node:
    """The document as a ``Node`` tree, or ``Unreadable``."""
    return _JsonReader(text, file).document()


# ---------------------------------------------------------------- Python literals


def _ast_span(node: ast.AST, lines: list[str], file: str) -> Span:
    """``ast`` columns are UTF-8 byte offsets; spans count characters."""

    def column(line: int, offset: int) -> int:
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        return len(text.encode("utf-8")[:offset].decode("utf-8", "replace")) + 1

    line = getattr(node, "lineno", 1)
    end_line = getattr(node, "end_lineno", None) or line
    col = column(line, getattr(node, "col_offset", 0))
    end_col = column(end_line, getattr(node, "end_col_offset", None) or 0)
    return Span(file, line, col, end_line, max(end_col, col + 1 if end_line == line else 1))


class _LiteralReader:
    def __init__(self, text: str, file: str) -> None:
        self.lines = text.splitlines()
        self.file = file

    def span(self, node: ast.AST) -> Span:
        return _ast_span(node, self.lines, self.file)

    def fail(self, node: ast.AST, message: str) -> Unreadable:
        return Unreadable(Diagnostic(codes.UNREADABLE_IMPORT, message, self.span(node)))

    def literal(self, node: ast.expr, path: str, depth: int = 0) -> Node:
        if depth > MAX_DEPTH:
            raise self.fail(node, f"nested more than {MAX_DEPTH} levels deep")
        value = self.value(node, path, depth)
        return Node(value, self.span(node), path)

    def value(self, node: ast.expr, path: str, depth: int) -> object:
        match node:
            case ast.Constant(value=value) if isinstance(value, (str, int, float, bool)) \
                    or value is None:
                return value
            case ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=value)) \
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                return -value
            case ast.List(elts=elts) | ast.Tuple(elts=elts):
                return tuple(self.literal(e, child_path(path, i), depth + 1)
                             for i, e in enumerate(elts))
            case ast.Dict():
                return self.mapping(node, path, depth)
            case ast.Call():
                return self.call(node, path, depth)
        raise self.fail(node, "the importer reads literals only (strings, numbers, lists, "
                              "dicts and style calls such as ColwiseParallel()); this "
                              "expression would have to run")

    def mapping(self, node: ast.Dict, path: str, depth: int) -> dict[str, Node]:
        found: dict[str, Node] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise self.fail(key or value, "dict keys must be string literals")
            if key.value in found:
                raise self.fail(key, f"the key {quoted(key.value)} appears twice")
            member = self.literal(value, child_path(path, key.value), depth + 1)
            found[key.value] = Node(member.value, member.span, member.path, self.span(key))
        return found

    def call(self, node: ast.Call, path: str, depth: int) -> Call:
        name = _dotted(node.func)
        if name is None:
            raise self.fail(node.func, "a call must name a class (Name(...) or a.b.Name(...))")
        if any(isinstance(a, ast.Starred) for a in node.args) or \
                any(k.arg is None for k in node.keywords):
            raise self.fail(node, "*args and **kwargs cannot be read without running code")
        args = tuple(self.literal(a, f"{path}.args[{i}]", depth + 1)
                     for i, a in enumerate(node.args))
        kwargs = tuple((k.arg, self.literal(k.value, f"{path}.{k.arg}", depth + 1))
                       for k in node.keywords if k.arg is not None)
        return Call(name, args, kwargs)


def _dotted(node: ast.expr) -> str | None:
    """``a.b.C`` for a Name/Attribute chain, else ``None``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _parse_python(text: str, file: str) -> ast.Module:
    try:
        return ast.parse(text, file)
    except SyntaxError as error:
        line, col = error.lineno or 1, error.offset or 1
        raise Unreadable(Diagnostic(codes.UNREADABLE_IMPORT,
                                    f"not valid Python: {error.msg}",
                                    Span.point(file, line, col))) from None
    except (RecursionError, MemoryError, ValueError):
        raise Unreadable(Diagnostic(codes.UNREADABLE_IMPORT, "not a Python file the importer "
                                    "can parse (too deep or not text)",
                                    Span.point(file, 1, 1))) from None


def read_python(text: str, file: str) -> dict[str, Node]:
    """``{NAME: literal}`` for the module's top-level ``NAME = literal`` assignments. Any other
    statement besides imports and docstrings (a call, a loop, a function, a second assignment
    to a name) is refused: it could change the values."""
    reader = _LiteralReader(text, file)
    found: dict[str, Node] = {}
    module = _parse_python(text, file)
    called = {n.func.id for n in ast.walk(module)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    for statement in module.body:
        renamed = _renamed_import(statement, called)
        if renamed is not None:
            raise reader.fail(statement, f"`{renamed.name} as {renamed.asname}` binds "
                                         f"'{renamed.asname}' to another name: the importer "
                                         "reads style names literally (import them without "
                                         "`as`)")
        if _inert(statement):
            continue
        if not isinstance(statement, ast.Assign):
            raise reader.fail(statement, "the importer reads imports and NAME = literal "
                                         "assignments only; this statement would have to run")
        _add_assignment(statement, reader, found)
    return found


def read_class_attributes(text: str, file: str, names: frozenset[str]) -> dict[str, Node]:
    """``{NAME: literal}`` for class-level ``NAME = literal`` assignments of ``names`` in the
    module's top-level classes (a Hugging Face configuration file). The rest of the file is
    not read, but a mention of one of ``names`` anywhere else (a method assigning it, a later
    ``Config.NAME[...] = ...``) is refused: the literal might not be the value in use."""
    module = _parse_python(text, file)
    reader = _LiteralReader(text, file)
    found: dict[str, Node] = {}
    read: set[int] = set()
    for cls in (s for s in module.body if isinstance(s, ast.ClassDef)):
        for statement in cls.body:
            if isinstance(statement, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id in names for t in statement.targets):
                _add_assignment(statement, reader, found)
                read.update(id(t) for t in statement.targets)
    for node in ast.walk(module):
        mentioned = node.id if isinstance(node, ast.Name) else \
            node.attr if isinstance(node, ast.Attribute) else None
        if mentioned in names and id(node) not in read:
            raise reader.fail(node, f"'{mentioned}' is used or changed outside its class "
                                    "literal; the importer cannot know its value without "
                                    "running the file")
    return found


def _add_assignment(statement: ast.Assign, reader: _LiteralReader,
                    found: dict[str, Node]) -> None:
    target = statement.targets[0]
    if not (len(statement.targets) == 1 and isinstance(target, ast.Name)):
        raise reader.fail(statement, "only simple assignments NAME = literal are read")
    if target.id in found:
        raise reader.fail(target, f"'{target.id}' is assigned twice")
    value = reader.literal(statement.value, target.id)
    found[target.id] = Node(value.value, value.span, value.path, reader.span(target))


def _renamed_import(statement: ast.stmt, called: set[str]) -> ast.alias | None:
    """The first ``import X as Y`` with ``Y`` not ``X``'s own last name and ``Y(...)``
    called in the file: a style name read literally would then mean another class
    (``ColwiseParallel as RowwiseParallel``). A module alias (``... parallel as tp``, then
    ``tp.ColwiseParallel()``) keeps the class's own name and is read."""
    if not isinstance(statement, (ast.Import, ast.ImportFrom)):
        return None
    return next((a for a in statement.names if a.asname is not None and a.asname in called
                 and a.asname != a.name.rpartition(".")[2]), None)


def _inert(statement: ast.stmt) -> bool:
    """Imports, docstrings, ``from __future__`` and bare annotations change no value."""
    if isinstance(statement, (ast.Import, ast.ImportFrom, ast.Pass)):
        return True
    if isinstance(statement, ast.AnnAssign) and statement.value is None:
        return True
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def read_style_string(text: str, span: Span, path: str) -> Node:
    """A style written as a string in JSON (``"RowwiseParallel(output_layouts=Shard(1))"``):
    parsed as one Python expression and read as a literal, located at the JSON string."""
    try:
        expression = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        raise Unreadable(Diagnostic(codes.UNREADABLE_IMPORT,
                                    f"{quoted(text)} is not a parallel style expression",
                                    span)) from None
    reader = _LiteralReader(text, span.file)
    try:
        value = reader.value(expression, path, 0)
    except Unreadable as error:
        raise Unreadable(Diagnostic(codes.UNREADABLE_IMPORT, error.diagnostic.message,
                                    span)) from None
    return Node(_relocate(value, span), span, path)


def _relocate(value: object, span: Span) -> object:
    """Nodes read from inside a JSON string all point at the string."""
    if isinstance(value, Call):
        return Call(value.name, tuple(Node(_relocate(a.value, span), span, a.path)
                                      for a in value.args),
                    tuple((k, Node(_relocate(v.value, span), span, v.path))
                          for k, v in value.kwargs))
    if isinstance(value, tuple):
        return tuple(Node(_relocate(v.value, span), span, v.path) for v in value)
    if isinstance(value, dict):
        return {k: Node(_relocate(v.value, span), span, v.path) for k, v in value.items()}
    return value


def is_python(path: str) -> bool:
    """Python source by its name; everything else is read as JSON."""
    return path.endswith(".py")
