"""Unit tests of the `.tvp` parser: every construct -> its expected AST, spans, lexing corners."""

from fractions import Fraction

import pytest

from trainverify_dsl.parse import ast, parse_file, parse_source
from trainverify_dsl.parse.ast import strip_spans
from trainverify_dsl.report.span import NO_SPAN

S = NO_SPAN


def one(text: str):
    """The single statement of ``text``, spans stripped; fails on any diagnostic."""
    result = parse_source(text)
    assert result.diagnostics == (), [d.message for d in result.diagnostics]
    assert len(result.plan_file.statements) == 1
    return strip_spans(result.plan_file.statements[0])


def ident(name: str) -> ast.Ident:
    return ast.Ident(name, S)


def idents(*names: str) -> tuple[ast.Ident, ...]:
    return tuple(ident(n) for n in names)


def path(*segments) -> ast.Path:
    built = []
    for segment in segments:
        if isinstance(segment, int):
            built.append(ast.Index(segment, S))
        elif isinstance(segment, tuple):
            built.append(ast.Slice(*segment, S))
        elif "*" in segment or "?" in segment:
            built.append(ast.Glob(segment, S))
        else:
            built.append(ast.Name(segment, S))
    return ast.Path(tuple(built), S)


def num(text: str, value) -> ast.Num:
    return ast.Num(Fraction(value), text, S)


def ref(name: str) -> ast.NameRef:
    return ast.NameRef(name, S)


def opt(key: str, value) -> ast.Option:
    return ast.Option(ident(key), value, S)


# ---------------------------------------------------------------- header statements


def test_plan_header():
    assert one("plan llama3_8b_3d") == ast.PlanHeader(ident("llama3_8b_3d"), S)


def test_spec_declaration_with_settings():
    got = one('spec "stdlib/models/llama.py:Llama" config llama3_8b batch 512 seq 8192')
    settings = (opt("config", ref("llama3_8b")), opt("batch", num("512", 512)),
                opt("seq", num("8192", 8192)))
    assert got == ast.SpecDecl("stdlib/models/llama.py:Llama", S, settings, S)


def test_string_escapes_are_unquoted():
    assert one(r'use "a\"b\\c.tvp"').path == 'a"b\\c.tvp'


def test_mesh_axes_in_order():
    got = one("mesh pp=4, dp=2*2, tp=8")
    assert [a.name.name for a in got.axes] == ["pp", "dp", "tp"]
    assert got.axes[1].size == ast.BinOp("*", num("2", 2), num("2", 2), S)


def test_microbatches_with_and_without_schedule():
    assert one("microbatches 16") == ast.MicrobatchesDecl(num("16", 16), None, S)
    for schedule in ("gpipe", "1f1b", "interleaved-1f1b"):
        assert one(f"microbatches 16 schedule {schedule}").schedule == ident(schedule)


def test_loss_scale_expression_is_exact():
    got = one("loss-scale 1/microbatches")
    assert got == ast.LossScaleDecl(ast.BinOp("/", num("1", 1), ref("microbatches"), S), S)


def test_use():
    assert one('use "stdlib/megatron.tvp"') == ast.UseDecl("stdlib/megatron.tvp", S, S)


# ---------------------------------------------------------------- layouts


def test_split_entries():
    got = one("split tokens [dp, -, (dp, cp), tp]")
    dims = (ast.DimEntry(idents("dp"), S), ast.DimEntry((), S),
            ast.DimEntry(idents("dp", "cp"), S), ast.DimEntry(idents("tp"), S))
    assert got == ast.SplitStmt(path("tokens"), dims, S)


def test_split_entry_with_a_block_order():
    """``zigzag(cp)`` states the order of the blocks of that dimension (semantics §2.6)."""
    got = one("split tokens [dp, zigzag(cp)]")
    zigzag = ast.Ident("zigzag", S)
    assert got.dims[1] == ast.DimEntry(idents("cp"), S, zigzag)
    assert one("split x [zigzag(dp, cp), -]").dims[0] == ast.DimEntry(idents("dp", "cp"), S,
                                                                      zigzag)


def test_split_minus_without_spaces():
    assert one("split x [-,tp,-]").dims[0] == ast.DimEntry((), S)


def test_replicate_with_and_without_axes():
    assert one("replicate params over dp, pp") == ast.ReplicateStmt(path("params"),
                                                                     idents("dp", "pp"), S)
    assert one("replicate params") == ast.ReplicateStmt(path("params"), (), S)


def test_partial_with_parenthesised_axes_and_option():
    got = one("partial y over (dp, cp) op=avg")
    assert got == ast.PartialStmt(path("y"), idents("dp", "cp"), (opt("op", ref("avg")),), S)


def test_place_positional_short_and_long_forms():
    got = one("place x [S(0), R, P(sum), Shard(1), Replicate(), Partial(max), Partial(), P]")
    kinds = [(p.kind, p.dim, p.op.name if p.op else None) for p in got.placements]
    assert kinds == [("shard", 0, None), ("replicate", None, None), ("partial", None, "sum"),
                     ("shard", 1, None), ("replicate", None, None), ("partial", None, "max"),
                     ("partial", None, None), ("partial", None, None)]
    assert all(p.axis is None for p in got.placements)


def test_place_named_form():
    got = one("place x [tp=S(0), dp=R]")
    assert got.placements[0] == ast.Placement("shard", 0, None, ident("tp"), S)
    assert got.placements[1] == ast.Placement("replicate", None, None, ident("dp"), S)


# ---------------------------------------------------------------- collectives, pipeline


@pytest.mark.parametrize("kind", ast.COLLECTIVE_KINDS)
def test_every_collective_kind(kind):
    got = one(f"{kind} l.attention.wo.out over tp")
    assert got == ast.CollectiveStmt(kind, S, path("l", "attention", "wo", "out"),
                                     idents("tp"), (), None, S)


def test_collective_options_and_backward():
    got = one("all-reduce x over tp op=avg backward all-reduce")
    assert got.options == (opt("op", ref("avg")),)
    assert got.backward == ident("all-reduce")


def test_hyphenated_option_keys():
    got = one("all-to-all x over ep split-dim=1 concat-dim=0")
    assert [o.key.name for o in got.options] == ["split-dim", "concat-dim"]


def test_gradient_sync_on_grad_of_params():
    got = one("all-reduce grad(params) over dp, cp op=avg")
    assert got.target == ast.GradRef(path("params"), S)
    assert got.axes == idents("dp", "cp")


def test_send():
    assert one("send x.out from 0 to 1") == ast.SendStmt(path("x", "out"), num("0", 0),
                                                         num("1", 1), S)


def test_pipeline_stage_members():
    got = one("pipeline-stage 3: layers[24:32], norm, output, loss")
    assert got.index == num("3", 3)
    assert got.members == (path("layers", (24, 32, None)), path("norm"), path("output"),
                           path("loss"))


# ---------------------------------------------------------------- optimizer, algorithms


def test_optimizer_with_tuple_option_and_shard():
    got = one("optimizer adamw lr=3e-4 betas=(0.9, 0.95) weight-decay=0.1 shard over dp")
    assert got.kind == ident("adamw")
    assert got.options[0] == opt("lr", num("3e-4", Fraction(3, 10000)))
    assert got.options[1].value == ast.TupleValue((num("0.9", Fraction(9, 10)),
                                                   num("0.95", Fraction(19, 20))), S)
    assert got.options[2].key == ident("weight-decay")
    assert got.shard_axes == idents("dp")


def test_optimizer_without_shard():
    assert one("optimizer sgd lr=0.1").shard_axes == ()


def test_clip_grad_norm():
    assert one("clip-grad-norm 1.0") == ast.ClipGradNormDecl(num("1.0", 1), (), S)


def test_algorithm():
    got = one("algorithm vocab-parallel-cross-entropy for output, loss over tp chunks=2")
    assert got == ast.AlgorithmStmt(ident("vocab-parallel-cross-entropy"),
                                    (path("output"), path("loss")), idents("tp"),
                                    (opt("chunks", num("2", 2)),), S)


# ---------------------------------------------------------------- templates and loops


def test_template_with_default_and_body():
    got = one("template column_parallel(m, axis=tp):\n"
              "    split m.weight [axis, -]\n"
              "    copy m.in over axis\n")
    assert got.name == ident("column_parallel")
    assert got.params == (ast.Param(ident("m"), None, S), ast.Param(ident("axis"), ref("tp"), S))
    assert [type(s).__name__ for s in got.body] == ["SplitStmt", "CollectiveStmt"]


def test_template_without_params():
    assert one("template t():\n    replicate x\n").params == ()


def test_apply_positional_and_keyword_arguments():
    got = one("apply column_parallel(l.attention.wq, tp, axis=dp)")
    assert got.args == (path("l", "attention", "wq"), ref("tp"))
    assert got.kwargs == (opt("axis", ref("dp")),)


def test_for_over_several_ranges_and_nested_blocks():
    got = one("for l in layers[0:8], layers[16:24]:\n"
              "    for m in l.experts:\n"
              "        split m.w1.weight [ep, -]\n")
    assert got.var == ident("l")
    assert got.iterables == (path("layers", (0, 8, None)), path("layers", (16, 24, None)))
    inner = got.body[0]
    assert isinstance(inner, ast.ForStmt) and isinstance(inner.body[0], ast.SplitStmt)


# ---------------------------------------------------------------- paths


@pytest.mark.parametrize("text, expected", [
    ("layers.3.attention.wq.weight", path("layers", 3, "attention", "wq", "weight")),
    ("layers[3].attention", path("layers", 3, "attention")),
    ("layers[-1]", path("layers", -1)),
    ("layers[::2]", path("layers", (None, None, 2))),
    ("layers[1:]", path("layers", (1, None, None))),
    ("layers[ 0 : 8 ]", path("layers", (0, 8, None))),
    ("layers.*.attention.wo.out", path("layers", "*", "attention", "wo", "out")),
    ("*_proj", path("*_proj")),
    ("layers.*.w?.weight", path("layers", "*", "w?", "weight")),
    ("w*.bias", path("w*", "bias")),
])
def test_paths(text, expected):
    assert one(f"replicate {text}").target == expected


def test_keywords_are_soft_inside_paths():
    assert one("replicate layers.copy.split.over").target == path("layers", "copy", "split",
                                                                  "over")


def test_keyword_needs_a_word_boundary():
    result = parse_source("splitx [dp]\n")
    assert [d.code.id for d in result.diagnostics] == ["TVP107"]


# ---------------------------------------------------------------- expressions


def test_precedence_and_associativity():
    got = one("loss-scale 1 - 2 - 3*4/5").value
    left = ast.BinOp("-", num("1", 1), num("2", 2), S)
    right = ast.BinOp("/", ast.BinOp("*", num("3", 3), num("4", 4), S), num("5", 5), S)
    assert got == ast.BinOp("-", left, right, S)


def test_parentheses_and_negation():
    got = one("loss-scale -(1 + x)*2").value
    inner = ast.Neg(ast.BinOp("+", num("1", 1), ref("x"), S), S)
    assert got == ast.BinOp("*", inner, num("2", 2), S)


def test_minus_between_names_is_subtraction():
    for text in ("batch-seq", "batch - seq", "batch -seq"):
        assert one(f"loss-scale {text}").value == ast.BinOp("-", ref("batch"), ref("seq"), S)


@pytest.mark.parametrize("text, value", [
    ("1_000_000", 1_000_000), ("0.5", Fraction(1, 2)), ("3e-4", Fraction(3, 10000)),
    ("2E3", 2000), ("1.5e+2", 150), ("0", 0),
])
def test_number_literals_are_exact_and_keep_their_text(text, value):
    got = one(f"loss-scale {text}").value
    assert got == num(text, value)


# ---------------------------------------------------------------- spans, comments, files


def test_spans_point_at_the_source():
    text = "plan p\nsplit layers.0.wq [tp, -]\n"
    statement = parse_source(text, "f.tvp").plan_file.statements[1]
    assert (statement.span.file, statement.span.line, statement.span.col) == ("f.tvp", 2, 1)
    assert text[statement.span.start_pos:statement.span.end_pos] == "split layers.0.wq [tp, -]"
    target = statement.target
    assert text[target.span.start_pos:target.span.end_pos] == "layers.0.wq"
    assert (target.segments[1].span.line, target.segments[1].span.col) == (2, 14)


def test_block_span_ends_with_its_last_statement():
    text = "for l in layers:\n    split l.w [tp]\n\nsplit x [dp]\n"
    loop = parse_source(text).plan_file.statements[0]
    assert (loop.span.line, loop.span.end_line, loop.span.end_col) == (1, 2, 19)


def test_comments_are_collected_with_positions():
    text = '# head\nuse "a#b.tvp"  # tail\nfor l in layers:  # loop\n    # inner\n    replicate l\n'
    comments = parse_source(text).plan_file.comments
    assert [(c.text, c.span.line, c.span.col) for c in comments] == [
        ("# head", 1, 1), ("# tail", 2, 16), ("# loop", 3, 19), ("# inner", 4, 5)]


def test_crlf_and_missing_final_newline():
    lf = parse_source("plan p\nfor l in layers:\n    replicate l\nsplit x [dp]")
    crlf = parse_source("plan p\r\nfor l in layers:\r\n    replicate l\r\nsplit x [dp]\r\n")
    assert lf.diagnostics == crlf.diagnostics == ()
    assert strip_spans(lf.plan_file) == strip_spans(crlf.plan_file)


def test_empty_and_comment_only_files():
    for text in ("", "\n\n", "# only a comment", "   \n# c\n"):
        result = parse_source(text)
        assert result.diagnostics == () and result.plan_file.statements == ()


def test_tabs_indent_blocks():
    assert len(one("for l in layers:\n\tsplit l.w [tp]\n\treplicate l\n").body) == 2


def test_parse_file_reads_and_reports_unreadable(tmp_path):
    good = tmp_path / "p.tvp"
    good.write_text("plan p\n", encoding="utf-8")
    result = parse_file(good)
    assert result.ok and result.plan_file.statements[0].span.file == str(good)
    missing = parse_file(tmp_path / "missing.tvp")
    assert missing.plan_file is None
    assert [d.code.id for d in missing.diagnostics] == ["TVP109"]


def test_parse_file_bad_utf8_is_a_diagnostic_and_parsing_continues(tmp_path):
    bad = tmp_path / "b.tvp"
    bad.write_bytes(b"plan p\n# caf\xe9\nsplit x [dp]\n")
    result = parse_file(bad)
    assert [(d.code.id, d.span.line) for d in result.diagnostics] == [("TVP109", 2)]
    assert len(result.plan_file.statements) == 2


@pytest.mark.parametrize("text, value", [("3e-4", Fraction(3, 10000)), ("1e3", Fraction(1000)),
                                         ("2E+5", Fraction(200000))])
def test_exponent_numbers_are_numbers_where_a_word_is_also_allowed(text, value):
    """`apply f(3e-4)`: an argument may be an option (key is a word, and `1f1b` is a word) or a
    value; a number in exponent form must lex as a number, not as a digit-led word."""
    result = parse_source(f"apply opt({text})\n")
    assert result.diagnostics == ()
    (statement,) = result.plan_file.statements
    assert statement.args[0].value == value
