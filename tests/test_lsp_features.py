"""The language server's features in-process (``trainverify_dsl.lsp``): positions in code
units, diagnostics equal to ``tvp lint``'s, formatting equal to ``tvp fmt``'s, hover and
definition, the keyword table against the grammar and the reference. ``test_lsp.py`` drives
the server over stdio."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.uris import from_fs_path, to_fs_path

import trainverify_dsl
from trainverify_dsl.lsp import features, keywords
from trainverify_dsl.lsp.analysis import Analysis
from trainverify_dsl.lsp.positions import (
    UTF8,
    UTF16,
    UTF32,
    DocumentLines,
    Position,
    split_lines,
    split_lines_keeping_ends,
)
from trainverify_dsl.parse import format_source
from trainverify_dsl.parse.errors import STATEMENT_KEYWORDS
from trainverify_dsl.plan import lint_file, lint_source
from trainverify_dsl.report.codes import lookup
from trainverify_dsl.report.render.explain import explain

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = sorted((ROOT / "tests" / "golden").rglob("*.tvp"))
SHIPPED = sorted((ROOT / "plans").rglob("*.tvp")) + sorted((ROOT / "stdlib").glob("*.tvp"))


def analysis_of(text: str, path: Path | str = "untitled:Untitled-1") -> Analysis:
    uri = from_fs_path(str(path)) if isinstance(path, Path) else path
    return Analysis(uri, str(path), text)


def at(line: int, character: int) -> Position:
    return Position(line, character)


def apply_edits(text: str, edits: list[types.TextEdit]) -> str:
    """The text after the edits (UTF-16 positions against the protocol's lines of ``text``)."""
    lines = split_lines_keeping_ends(text)

    def offset(position: types.Position) -> int:
        if position.line >= len(lines):
            return len(text)
        units = lines[position.line].encode("utf-16-le")[:2 * position.character]
        return sum(len(line) for line in lines[:position.line]) + len(units.decode("utf-16-le"))

    for edit in reversed(edits):
        start, end = offset(edit.range.start), offset(edit.range.end)
        text = text[:start] + edit.new_text + text[end:]
    return text


# ---------------------------------------------------------------- positions


@pytest.mark.parametrize(("encoding", "character"), [(UTF16, 10), (UTF8, 13), (UTF32, 9)])
def test_a_span_after_non_ascii_text_in_each_encoding(encoding: str, character: int) -> None:
    lines = DocumentLines.of('x\nuse "é😋" y\n', encoding)
    # `y` is column 10 of line 2: `use "` 5 characters, `é😋` 2 (UTF-16: 1 + 2 units; UTF-8:
    # 2 + 4 bytes), `" ` 2
    assert lines.to_client(2, 10) == Position(1, character)
    assert lines.from_client(Position(1, character)) == (2, 10)


def test_a_position_inside_a_surrogate_pair_is_that_character() -> None:
    lines = DocumentLines.of("#😋x")
    assert lines.from_client(Position(0, 2)) == (1, 2)  # between the two units of 😋
    assert lines.from_client(Position(0, 3)) == (1, 3)


def test_line_ends_are_the_protocol_s_and_a_byte_order_mark_is_skipped() -> None:
    text = "\ufeffplan a\r\nmesh\x0cdp=2\rsplit x [dp]\n"
    assert split_lines(text) == ["\ufeffplan a", "mesh\x0cdp=2", "split x [dp]", ""]
    assert "".join(split_lines_keeping_ends(text)) == text
    lines = DocumentLines.of(text)
    assert lines.to_client(1, 1) == Position(0, 1)  # the editor's text holds the mark
    assert lines.from_client(Position(0, 1)) == (1, 1)
    assert lines.to_client(3, 7) == Position(2, 6)
    assert lines.end() == Position(3, 0)


def test_positions_past_the_text_are_clamped() -> None:
    lines = DocumentLines.of("ab\ncd")
    assert lines.to_client(1, 40) == Position(0, 2)
    assert lines.to_client(9, 1) == Position(1, 2)
    assert lines.from_client(Position(7, 99)) == (2, 3)


# ---------------------------------------------------------------- diagnostics


def test_lint_of_a_buffer_is_lint_of_the_file() -> None:
    for path in SHIPPED + GOLDEN:
        assert lint_source(path.read_text(), str(path)) == lint_file(str(path)), path


def test_a_buffer_with_a_nul_is_binary_as_the_file_is(tmp_path: Path) -> None:
    """The server parsed it (TVP100 at the NUL, TVP200 no header) where lint says TVP109."""
    path = tmp_path / "nul.tvp"
    path.write_text("plan a\x00\nmesh dp=2\n", encoding="utf-8")
    found = lint_source(path.read_text(encoding="utf-8"), str(path))
    assert found == lint_file(str(path))
    assert [d.code.id for d in found] == ["TVP109"]


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_diagnostics_are_lint_s(path: Path) -> None:
    text = path.read_text()
    lines = DocumentLines.of(text)
    expected = lint_file(str(path))
    found = features.diagnostics(analysis_of(text, path), lines)
    assert len(found) == len(expected)
    for ours, theirs in zip(found, expected, strict=True):
        assert ours.code == theirs.code.id
        assert ours.message.split("\n")[0] == theirs.message
        assert ours.severity == features.SEVERITIES[theirs.severity]
        assert ours.range == features.to_range(lines, theirs.span)


def test_a_problem_in_a_used_file_is_shown_at_the_use(tmp_path: Path) -> None:
    (tmp_path / "frag.tvp").write_text("template t(x):\n    split x [dp, -]\nsplit (\n")
    (tmp_path / "plan.tvp").write_text("")  # `use` is relative to a document on disk
    text = 'plan demo\nmesh dp=2\nuse "frag.tvp"\n'
    (found,) = features.diagnostics(analysis_of(text, tmp_path / "plan.tvp"),
                                    DocumentLines.of(text))
    assert found.code.startswith("TVP1")
    assert found.range == types.Range(types.Position(line=2, character=0),
                                      types.Position(line=2, character=14))
    assert re.match(r".*frag\.tvp:3:\d+: ", found.message)
    where = found.related_information[0].location
    assert Path(to_fs_path(where.uri)) == (tmp_path / "frag.tvp").resolve()
    assert where.range.start.line == 2


def test_a_buffer_without_a_file_is_linted_too() -> None:
    text = "plan demo\nmesh dp=2\nsplit tokens [tq, -]\n"
    (found,) = features.diagnostics(analysis_of(text), DocumentLines.of(text))
    assert found.code == "TVP207"


# ---------------------------------------------------------------- formatting


@pytest.mark.parametrize("text", [
    "plan demo\nmesh   dp=2,tp=2\nsplit tokens [dp,-]  # é😋\n",
    "plan demo\r\nmesh dp=2\r\n\r\n\r\nsplit tokens [dp, -]",
    "\ufeffplan demo\nmesh dp=2",
    "# only a comment",
], ids=["spaces", "crlf-no-final-newline", "bom", "comment"])
def test_formatting_edits_give_fmt_s_text(text: str) -> None:
    lines = DocumentLines.of(text)
    edits = features.formatting_edits(analysis_of(text), lines)
    formatted = format_source(text).text
    assert formatted is not None
    assert apply_edits(text, edits) == formatted
    assert features.formatting_edits(analysis_of(formatted), DocumentLines.of(formatted)) == []


def test_a_file_with_syntax_errors_is_not_formatted() -> None:
    text = "plan demo\nmesh   dp=2\nsplit (\n"
    assert features.formatting_edits(analysis_of(text), DocumentLines.of(text)) == []


def test_formatting_refuses_a_result_of_another_meaning(monkeypatch) -> None:
    monkeypatch.setattr(features, "same_meaning", lambda *args: False)
    text = "plan demo\nmesh   dp=2\n"
    with pytest.raises(features.FormattingRefused):
        features.formatting_edits(analysis_of(text), DocumentLines.of(text))


# ---------------------------------------------------------------- hover

HOVERED = """\
plan demo  # see TVP999 and TVP233
mesh dp=2, tp=2
microbatches 2 schedule gpipe
split copy [dp, -]
copy layers.0.in over tp
all-reduce grad(params) over dp op=avg
algorithm vocab-parallel-cross-entropy for output, loss over tp
for l in layers:
    copy l.in over tp
splitx y
"""


def hover_text(line: int, character: int, *, markdown: bool = False) -> str | None:
    found = features.hover(analysis_of(HOVERED), DocumentLines.of(HOVERED),
                           at(line, character), markdown=markdown)
    return None if found is None else found.contents.value


def meaning(keyword: str, *, heads: bool = True) -> str:
    described = keywords.describe(keyword, heads_statement=heads)
    assert described is not None
    form, text = described
    return f"{form}\n\n{text}"


def test_hover_explains_a_code_anywhere() -> None:
    assert hover_text(0, 30) == explain(lookup("TVP233"))
    assert hover_text(0, 32, markdown=True) == f"```text\n{explain(lookup('TVP233'))}```"
    assert hover_text(0, 19) is None  # no such code


def test_hover_tells_keywords_from_names_by_where_they_stand() -> None:
    assert hover_text(1, 0) == meaning("mesh")
    assert hover_text(2, 17) == meaning("schedule", heads=False)
    assert hover_text(3, 7) is None  # `copy` names a module here
    assert hover_text(4, 2) == meaning("copy")
    assert hover_text(4, 19) == meaning("over", heads=False)
    assert hover_text(5, 12) == meaning("grad", heads=False)
    assert hover_text(5, 16) is None  # `params`
    assert hover_text(6, 39) == meaning("for", heads=False)
    assert hover_text(7, 1) == meaning("for")
    assert hover_text(7, 6) == meaning("in", heads=False)
    assert hover_text(8, 6) == meaning("copy")  # inside a block
    assert hover_text(2, 25) is None  # `gpipe`, a value


def test_hover_on_a_diagnostic_explains_its_code() -> None:
    text = "plan demo\nmesh dp=2\nsplit tokens [tq, -]\n"
    found = features.hover(analysis_of(text), DocumentLines.of(text), at(2, 15),
                           markdown=False)
    assert found is not None and found.contents.value == explain(lookup("TVP207"))


def test_hover_on_a_line_that_did_not_parse() -> None:
    text = "plan demo\nmesh dp=2\nsplit x [\n"
    analysis, lines = analysis_of(text), DocumentLines.of(text)
    (error,) = features.diagnostics(analysis, lines)
    assert error.range.start == types.Position(line=2, character=9)
    hovered = features.hover(analysis, lines, at(2, 2), markdown=False)
    assert hovered is not None and hovered.contents.value == meaning("split")
    hovered = features.hover(analysis, lines, at(2, 9), markdown=False)
    assert hovered is not None and hovered.contents.value == explain(lookup(error.code))


def test_the_keyword_table_is_the_grammar_s_and_the_reference_s() -> None:
    grammar = (ROOT / "grammar" / "tvp.lark").read_text()
    # a keyword ends at a lookahead: not a word character (`(?!`), or `(` for `grad(`
    terminals = set(re.findall(r"^_?[A-Z_]+\.3\s*:\s*/\(?([a-z|-]+)\)?\(\?[!=]", grammar, re.M))
    in_grammar = {word for group in terminals for word in group.split("|")}
    assert in_grammar == set(keywords.STATEMENTS) | set(keywords.INNER)
    assert set(keywords.STATEMENTS) == set(STATEMENT_KEYWORDS)
    reference = (ROOT / "docs" / "language.md").read_text()
    heads, inner = re.search(r"Keywords \(statement heads\): `([^`]*)`\. Inside statements:\s*"
                             r"`([^`]*)`", reference).groups()
    assert set(heads.split()) == set(keywords.STATEMENTS)
    assert set(inner.split()) == set(keywords.INNER)


# ---------------------------------------------------------------- definition


def test_definition_of_a_template_in_the_buffer_itself() -> None:
    text = ("template t(x):\n    split x [dp, -]\n\napply t(tokens)\napply nope(x)\n\n"
            "for l in layers:\n    apply t(l.attention.wq)\n")
    analysis = analysis_of(text)
    in_loop = features.definition(analysis, DocumentLines.of(text), at(7, 10))
    assert in_loop is not None and in_loop.range.start == types.Position(line=0, character=9)
    location = features.definition(analysis, DocumentLines.of(text), at(3, 7))
    assert location is not None and location.uri == analysis.uri
    assert location.range == types.Range(types.Position(line=0, character=9),
                                         types.Position(line=0, character=10))
    assert features.definition(analysis, DocumentLines.of(text), at(4, 7)) is None
    assert features.definition(analysis, DocumentLines.of(text), at(3, 1)) is None  # `apply`


def test_definition_of_a_use_path(tmp_path: Path) -> None:
    text = 'use "stdlib/megatron.tvp"\nuse "missing.tvp"\n'
    analysis = analysis_of(text, tmp_path / "plan.tvp")
    location = features.definition(analysis, DocumentLines.of(text), at(0, 10))
    assert location is not None
    assert Path(to_fs_path(location.uri)) == (trainverify_dsl.STDLIB_DIR / "megatron.tvp")
    assert features.definition(analysis, DocumentLines.of(text), at(1, 10)) is None
