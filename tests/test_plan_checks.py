"""Semantic checks, each with a bad and a fixed plan, and the shape of their messages."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest
from test_plan_support import codes_of, lint_files, resolve_text

from trainverify_dsl.plan import parse_pattern
from trainverify_dsl.plan.overlap import patterns_may_overlap
from trainverify_dsl.report import codes_plan as codes
from trainverify_dsl.report.diagnostics import Severity

MESH = "mesh pp=2, dp=2, tp=4\n"
LLAMA = 'plan p\nspec "stdlib/models/llama.py:Llama" config llama3_8b batch 16 seq 32\n'
TINY = 'plan p\nspec "stdlib/models/llama.py:Llama" config llama_tiny batch 16 seq 32\n'

#: (code, bad plan body, fixed plan body); HEAD is prepended unless the body has a header.
CASES = [
    (codes.UNKNOWN_MESH_AXIS, "replicate w over dpp\n", "replicate w over dp\n"),
    (codes.UNKNOWN_MESH_AXIS, "algorithm expert-parallel for moe over ep\n",
     "algorithm expert-parallel for moe over dp\n"),
    (codes.AXIS_USED_TWICE, "split w [(tp, tp), -]\n", "split w [(dp, tp), -]\n"),
    (codes.AXIS_USED_TWICE, "place w [tp=S(0), tp=S(1)]\n", "place w [tp=S(0), dp=S(1)]\n"),
    (codes.SPLIT_AND_PARTIAL, "place w [R, S(0), R]\npartial w over dp\n",
     "place w [tp=S(0)]\npartial w over dp\n"),
    (codes.CONFLICTING_LAYOUT, "place w [R, R, S(0)]\npartial w over dp\n",
     "place w [R, P(sum), S(0)]\npartial w over dp\n"),
    (codes.CONFLICTING_LAYOUT, "split w [dp, -]\nsplit w [tp, -]\n", "split w [(dp, tp), -]\n"),
    (codes.CONFLICTING_LAYOUT, "replicate w over tp\nsplit w [tp, -]\n",
     "replicate w over dp\nsplit w [tp, -]\n"),
    (codes.DUPLICATE_STATEMENT, "replicate w over dp\nreplicate w over dp\n",
     "replicate w over dp\n"),
    (codes.SPLIT_NOT_DIVISIBLE, "microbatches 2\nsplit tokens [(dp, tp), -]\n",
     "microbatches 2\nsplit tokens [dp, -]\n"),
    (codes.SPLIT_NOT_DIVISIBLE, "microbatches 8\nsplit tokens [dp, -]\n",
     "microbatches 4\nsplit tokens [dp, -]\n"),
    (codes.LAYOUT_RANK_MISMATCH, "place labels [R, S(2), R]\n", "place labels [R, S(1), R]\n"),
    (codes.MISSING_MESH, "split w [tp]\n", MESH),
    (codes.MESH_REDECLARED, MESH + "mesh dp=2\n", ""),
    (codes.PIPELINE_WITHOUT_PP, "mesh dp=2\nsend x.out from 0 to 1\n",
     "mesh pp=2\nsend x.out from 0 to 1\n"),
    (codes.STAGE_OUT_OF_RANGE, "pipeline-stage 0: a\npipeline-stage 1: b\nsend b.out from 1 to 2\n",
     "pipeline-stage 0: a\npipeline-stage 1: b\nsend a.out from 0 to 1\n"),
    (codes.STAGE_OVERLAP, "pipeline-stage 0: embed, layers.0\npipeline-stage 1: layers[0:2]\n",
     "pipeline-stage 0: embed, layers.0\npipeline-stage 1: layers[1:2]\n"),
    (codes.STAGE_OVERLAP, "pipeline-stage 0: layers.0.attention\npipeline-stage 1: layers.0\n",
     "pipeline-stage 0: layers.0\npipeline-stage 1: layers.1\n"),
    (codes.STAGE_GAP, "pipeline-stage 1: layers\n", "pipeline-stage 0: embed\n"
     "pipeline-stage 1: layers\n"),
    (codes.STAGE_ORDER, "pipeline-stage 0: layers[4:]\npipeline-stage 1: layers[:4]\n",
     "pipeline-stage 0: layers[:4]\npipeline-stage 1: layers[4:]\n"),
    (codes.INVALID_MICROBATCHES, "microbatches 3/2\n", "microbatches 3\n"),
    (codes.INVALID_LOSS_SCALE, "loss-scale 1/2 - 1\n", "loss-scale 1 - 1/2\n"),
    (codes.UNKNOWN_OPTIMIZER, "optimizer lion lr=1\n", "optimizer sgd lr=1\n"),
    (codes.UNKNOWN_HYPERPARAMETER, "optimizer sgd lr=1 betas=(0.9, 0.9)\n",
     "optimizer adam lr=1 betas=(0.9, 0.9)\n"),
    (codes.MISSING_HYPERPARAMETER, "optimizer adam eps=1e-8\n", "optimizer adam lr=1 eps=1e-8\n"),
    (codes.INVALID_OPTION_VALUE, "optimizer adam lr=(1, 2)\n", "optimizer adam lr=1\n"),
    (codes.UNKNOWN_OPTION, "copy x.in over tp op=sum\n", "copy x.in over tp\n"),
    (codes.UNKNOWN_OPTION, "partial x over tp opp=sum\n", "partial x over tp op=sum\n"),
    (codes.MISSING_OPTION, "all-to-all x over tp split-dim=0\n",
     "all-to-all x over tp split-dim=0 concat-dim=1\n"),
    (codes.MISSING_OPTION, "reduce-scatter grad(params) over dp\n",
     "reduce-scatter grad(params) over dp dim=0\n"),
    (codes.INVALID_BACKWARD, "copy x over tp backward copy\n",
     "copy x over tp backward identity\n"),
    # a stated backward runs along the statement's own dimension options (Rule 3.3)
    (codes.MISSING_OPTION, "copy x over tp backward all-gather\n",
     "all-gather x over tp dim=0 backward all-gather\n"),
    (codes.MISSING_OPTION, "all-reduce x over tp backward reduce-scatter\n",
     "all-reduce x over tp backward all-reduce\n"),
    (codes.MISSING_OPTION, "reduce-scatter x over tp dim=0 backward all-to-all\n",
     "reduce-scatter x over tp dim=0 backward all-gather\n"),
    (codes.UNKNOWN_REDUCE_OP, "place x [R, P(prod), R]\n", "place x [R, P(max), R]\n"),
    (codes.UNKNOWN_ALGORITHM, "algorithm ring-attention for attn over tp\n",
     "algorithm context-parallel-attention for attn over tp\n"),
    # an option no algorithm defines is an error, never a setting silently ignored
    (codes.UNKNOWN_OPTION, "algorithm context-parallel-attention for attn over tp chunks=2\n",
     "algorithm context-parallel-attention for attn over tp\n"),
    # the same axes in another block order place the blocks differently: not a repetition
    (codes.CONFLICTING_LAYOUT, "split w [(dp, tp), -]\nsplit w [(tp, dp), -]\n",
     "split w [(dp, tp), -]\nsplit v [(tp, dp), -]\n"),
    (codes.CONFLICTING_LAYOUT, "split w [(dp, tp), -]\nsplit w [dp, -]\n",
     "split w [(dp, tp), -]\n"),
    # when a gradient statement runs (Rule 4.4)
    (codes.UNKNOWN_OPTION, "all-reduce x.out over tp after=each\n", "all-reduce x.out over tp\n"),
    (codes.INVALID_OPTION_VALUE, "microbatches 2\nall-reduce grad(params) over dp after=3\n",
     "microbatches 2\nall-reduce grad(params) over dp after=2\n"),
    (codes.INVALID_OPTION_VALUE, "all-reduce grad(params) over dp after=0\n",
     "all-reduce grad(params) over dp after=1\n"),
    (codes.INVALID_OPTION_VALUE, "all-reduce grad(params) over dp after=first\n",
     "all-reduce grad(params) over dp after=each\n"),
    (codes.INVALID_OPTION_VALUE, "microbatches 2\nall-reduce grad(params) over dp after=1\n"
     "all-reduce grad(w) over tp op=max\n",
     "microbatches 2\nall-reduce grad(params) over dp after=1\nall-reduce grad(w) over tp\n"),
    (codes.INVALID_OPTION_VALUE, "microbatches 2\n"
     "reduce-scatter grad(params) over dp dim=0 after=1\n",
     "microbatches 2\nreduce-scatter grad(params) over dp dim=0 after=each\n"),
    # interleaved 1F1B needs virtual stages (several layer chunks per pp rank, round-robin)
    (codes.VIRTUAL_STAGES, "microbatches 4 schedule interleaved-1f1b\n",
     "microbatches 4 schedule 1f1b\n"),
    (codes.VIRTUAL_STAGES, "microbatches 4 schedule interleaved-1f1b\n"
     "pipeline-stage 0: layers[:16]\npipeline-stage 1: layers[16:]\n",
     "microbatches 4 schedule interleaved-1f1b\n"
     "pipeline-stage 0: layers[:8], layers[16:24]\npipeline-stage 1: layers[8:16], layers[24:]\n"),
    (codes.VIRTUAL_STAGES, "microbatches 4 schedule interleaved-1f1b\n"
     "pipeline-stage 0: layers[:8], layers[16:24], layers[28:]\n"
     "pipeline-stage 1: layers[8:16], layers[24:28]\n",
     "microbatches 4 schedule interleaved-1f1b\n"
     "pipeline-stage 0: layers[:8], layers[16:24]\npipeline-stage 1: layers[8:16], layers[24:]\n"),
    (codes.VIRTUAL_STAGES, "microbatches 3 schedule interleaved-1f1b\n"
     "pipeline-stage 0: layers[:8], layers[16:24]\npipeline-stage 1: layers[8:16], layers[24:]\n",
     "microbatches 6 schedule interleaved-1f1b\n"
     "pipeline-stage 0: layers[:8], layers[16:24]\npipeline-stage 1: layers[8:16], layers[24:]\n"),
    (codes.VIRTUAL_STAGES, "microbatches 4 schedule interleaved-1f1b\n"
     "pipeline-stage 0: layers[:8], layers[16:24]\npipeline-stage 1: layers[8:16], layers[24:]\n"
     "send layers.7.out from 0 to 1\n",
     "microbatches 4 schedule interleaved-1f1b\n"
     "pipeline-stage 0: layers[:8], layers[16:24]\npipeline-stage 1: layers[8:16], layers[24:]\n"),
]


def body_with_mesh(body: str) -> str:
    return body if body.startswith("mesh") else MESH + body


@pytest.mark.parametrize(("code", "bad", "good"), CASES,
                         ids=[f"{c.id}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_check_fires_on_bad_and_not_on_fixed(code, bad: str, good: str) -> None:
    if code is codes.MISSING_MESH:
        bad_result, good_result = resolve_text(bad), resolve_text(good)
    else:
        bad_result = resolve_text(body_with_mesh(bad))
        good_result = resolve_text(body_with_mesh(good))
    assert code.id in codes_of(bad_result), [d.message for d in bad_result.diagnostics]
    assert codes_of(good_result) == [], [d.message for d in good_result.diagnostics]


def test_divisibility_message_follows_the_shard_map_template() -> None:
    result = resolve_text("mesh dp=1, tp=4\nsplit tokens [tp, -]\n",
                          head='plan p\nspec "m.py:M" batch 10 seq 8\n')
    (diagnostic,) = result.diagnostics
    assert diagnostic.code is codes.SPLIT_NOT_DIVISIBLE
    assert diagnostic.message == "layout of 'tokens' does not divide evenly over Mesh(dp=1, tp=4)"
    assert diagnostic.notes == ("splits dimension 0 (of size 10) over mesh axis 'tp' (of size "
                                "4), but 4 does not evenly divide 10",)
    assert diagnostic.help and "multiple of 4" in diagnostic.help


def test_conflict_names_both_statements() -> None:
    result = resolve_text(MESH + "split w [tp, -]\n\nsplit w [-, tp]\n")
    (diagnostic,) = result.diagnostics
    assert diagnostic.span.line == 6
    assert [span.line for span, _ in diagnostic.related] == [4]
    assert any("S(0)" in n and "S(1)" in n for n in diagnostic.notes)


def test_duplicate_is_a_warning_and_the_plan_still_resolves() -> None:
    result = resolve_text(MESH + "all-reduce x over tp\nall-reduce x over tp\n")
    assert [d.severity for d in result.diagnostics] == [Severity.WARNING]
    assert result.ok and len(result.plan.collectives) == 2


def test_unknown_axis_lists_the_mesh_and_suggests() -> None:
    (diagnostic,) = resolve_text(MESH + "split w [cp, -]\n").diagnostics
    assert diagnostic.message == "unknown mesh axis 'cp'; did you mean 'tp'?"
    assert "split w [cp, -] on Mesh(pp=2, dp=2, tp=4)" in diagnostic.notes
    assert "expected one of: 'pp', 'dp', 'tp'" in diagnostic.notes


def test_layers_coverage_uses_the_stdlib_config() -> None:
    stages = "pipeline-stage 0: embed, layers[0:16]\npipeline-stage 1: layers[16:31]\n"
    (diagnostic,) = resolve_text(MESH + stages, head=LLAMA).diagnostics
    assert diagnostic.code is codes.STAGE_COVERAGE
    assert diagnostic.notes[0] == "unassigned layers: layers[31]"
    ok = "pipeline-stage 0: embed, layers[0:16]\npipeline-stage 1: layers[16:], norm\n"
    assert resolve_text(MESH + ok, head=LLAMA).diagnostics == ()
    assert resolve_text(MESH + "pipeline-stage 0: layers.0\npipeline-stage 1: layers.1\n",
                        head=TINY).diagnostics == ()


def test_coverage_is_skipped_for_user_models_and_unknown_configs() -> None:
    stages = "pipeline-stage 0: layers[0:2]\npipeline-stage 1: layers[2:3]\n"
    assert resolve_text(MESH + stages).diagnostics == ()
    unknown = LLAMA.replace("llama3_8b", "llama3_8x")
    diagnostics = resolve_text(MESH + stages, head=unknown).diagnostics
    assert codes_of(diagnostics) == [codes.UNKNOWN_MODEL_CONFIG.id]
    assert "did you mean 'llama3_8b'?" in diagnostics[0].message


def test_an_n_layers_setting_on_the_spec_line_overrides_the_config() -> None:
    stages = "pipeline-stage 0: embed, layers[0:1]\npipeline-stage 1: layers[1:2], norm\n"
    assert resolve_text(MESH + stages, head=TINY).diagnostics == ()
    head = TINY.rstrip("\n") + " n_layers 3\n"
    (diagnostic,) = resolve_text(MESH + stages, head=head).diagnostics
    assert diagnostic.code is codes.STAGE_COVERAGE
    assert diagnostic.notes[0] == "unassigned layers: layers[2]"


def test_interleaved_schedule_allows_non_contiguous_stages() -> None:
    stages = ("pipeline-stage 0: layers[0:8], layers[16:24]\n"
              "pipeline-stage 1: layers[8:16], layers[24:32]\n")
    assert resolve_text(MESH + "microbatches 4 schedule interleaved-1f1b\n" + stages,
                        head=LLAMA).diagnostics == ()
    assert codes_of(resolve_text(MESH + stages, head=LLAMA)) == [codes.STAGE_ORDER.id]


def test_collective_options_and_backward_defaults() -> None:
    result = resolve_text(MESH + "all-reduce a over tp\ncopy b over tp\n"
                          "all-gather c over tp dim=1\n"
                          "reduce-scatter d over dp dim=0 op=avg\nscatter e over tp dim=2\n"
                          "all-to-all f over tp split-dim=0 concat-dim=1\n"
                          "all-reduce g over tp, dp backward all-reduce\n")
    assert result.ok, result.diagnostics
    table = [(c.kind, c.backward, c.backward_stated, c.op, c.dim, c.split_dim, c.concat_dim)
             for c in result.plan.collectives]
    assert table == [
        ("all-reduce", "identity", False, "sum", None, None, None),
        ("copy", "all-reduce", False, None, None, None, None),
        ("all-gather", "reduce-scatter", False, None, 1, None, None),
        ("reduce-scatter", "all-gather", False, "avg", 0, None, None),
        ("scatter", "all-gather", False, None, 2, None, None),
        ("all-to-all", "all-to-all", False, None, None, 0, 1),
        ("all-reduce", "all-reduce", True, "sum", None, None, None),
    ]
    assert result.plan.collectives[-1].axes == ("tp", "dp")


def test_optimizer_and_clip_are_exact() -> None:
    result = resolve_text(MESH + "optimizer adamw lr=3e-4 betas=(0.9, 0.95) eps=1e-8 "
                          "weight-decay=0.1 shard over dp, pp\nclip-grad-norm 1.0\n")
    optimizer = result.plan.optimizer
    assert optimizer.get("lr") == Fraction(3, 10000)
    assert optimizer.get("betas") == (Fraction(9, 10), Fraction(19, 20))
    assert optimizer.get("eps") == Fraction(1, 10**8)
    assert optimizer.shard_axes == ("dp", "pp")
    assert result.plan.clip_grad_norm.max_norm == 1


def test_every_example_produces_its_code_and_every_fix_lints_clean(tmp_path: Path) -> None:
    """The registry's contract for TVP2xx, checked with the plan tests' own loader."""
    extra = re.compile(r"`(?P<name>[\w.-]+\.tvp)` holding `(?P<text>[^`]*)`")
    for index, code in enumerate(codes.CODES):
        if code is codes.EXPANSION_LIMIT:
            continue  # slow by design; tests/test_plan_resolve.py covers it
        files = {m["name"]: m["text"] + "\n" for m in extra.finditer(code.what)}
        for kind, text in (("example", code.example), ("fix", code.fix)):
            folder = tmp_path / f"{index}-{kind}"
            found = codes_of(lint_files(folder, {**files, "example.tvp": text}, "example.tvp"))
            if kind == "example":
                assert code.id in found, f"{code.id} example produced {found}"
            else:
                assert found == [], f"{code.id} fix produced {found}"


def test_explain_examples_name_model_files_that_exist() -> None:
    """`tvp explain` examples can be copied and run (issue 13 item 8): every model file an
    example or fix names exists, except in the codes about model paths themselves."""
    import re

    from trainverify_dsl.report.codes import ALL_CODES

    root = Path(__file__).resolve().parent.parent
    about_paths = {"TVP301", "TVP310"}
    missing = [(c.id, m) for c in ALL_CODES if c.id not in about_paths
               for text in (c.example, c.fix)
               for m in re.findall(r'spec "([^":]+)', text or "")
               if not (root / m).is_file()]
    assert missing == []


@pytest.mark.parametrize(("a", "b", "meet"), [
    ("layers.*.wq.weight", "layers.3.wq.weight", True),
    ("layers.*.wq.weight", "layers.3.wk.weight", False),
    ("layers[0:4].w", "layers[4:8].w", False),
    ("layers[0:4].w", "layers[3:8].w", True),
    ("layers[0::2].w", "layers[1::2].w", False),
    ("layers[0::2].w", "layers[3::3].w", True),
    ("layers[0:4].w", "layers.1*.w", True),
    ("layers[2:4].w", "layers.1*.w", False),
    ("layers[-2:].w", "layers.3.w", False),
    ("layers.*.wq*", "layers.*.wk*", False),
    ("layers.*.w*", "layers.*.w1", True),
    ("grad(layers.*.w)", "layers.1.w", False),
    ("layers.*.w", "layers.1.w.x", False),
    ("layers[1000000000:].w", "layers[5:].w", True),
])
def test_pattern_overlap(a: str, b: str, meet: bool) -> None:
    assert patterns_may_overlap(parse_pattern(a), parse_pattern(b)) is meet
    assert patterns_may_overlap(parse_pattern(b), parse_pattern(a)) is meet


def test_overlapping_patterns_with_conflicting_layouts_are_reported() -> None:
    result = resolve_text(MESH + "for l in layers:\n    split l.wq.weight [tp, -]\n"
                          "split layers.3.wq.weight [-, tp]\n"
                          "partial layers[0:2].wq.weight over tp\n")
    found = [(d.code, d.span.line, [s.line for s, _ in d.related]) for d in result.diagnostics]
    assert found == [(codes.CONFLICTING_LAYOUT, 6, [5]), (codes.SPLIT_AND_PARTIAL, 7, [5])]
    assert "'layers.*.wq.weight' and 'layers.3.wq.weight'" in result.diagnostics[0].message


def test_interleaved_slices_and_params_defaults_do_not_conflict() -> None:
    result = resolve_text(MESH + "replicate params\nsplit layers[0::2].w [tp, -]\n"
                          "split layers[1::2].w [-, tp]\nsplit layers.*.v [tp, -]\n"
                          "split layers.0.v [tp, -]\n")
    assert result.diagnostics == ()


def test_virtual_stages_go_round_robin_over_the_pp_ranks() -> None:
    """Chunk c of pp rank r is virtual stage c*pp + r: with pp=3, the chunk after rank 2's
    first belongs to rank 0, not rank 1."""
    mesh = "mesh pp=3, dp=2\nmicrobatches 3 schedule interleaved-1f1b\n"
    good = ("pipeline-stage 0: layers[0:1], layers[3:4]\npipeline-stage 1: layers[1:2], "
            "layers[4:5]\npipeline-stage 2: layers[2:3], layers[5:6]\n")
    bad = ("pipeline-stage 0: layers[0:1], layers[4:5]\npipeline-stage 1: layers[1:2], "
           "layers[3:4]\npipeline-stage 2: layers[2:3], layers[5:6]\n")
    head = TINY.replace("seq 32", "seq 32 n_layers 6")
    assert resolve_text(mesh + good, head=head).diagnostics == ()
    (diagnostic,) = resolve_text(mesh + bad, head=head).diagnostics
    assert diagnostic.code is codes.VIRTUAL_STAGES
    assert diagnostic.span.line == 6  # pipeline stage 1, which holds layer 3
    assert diagnostic.message == ("layer 3 starts virtual stage 3, which belongs to pp rank 0, "
                                  "but pipeline stage 1 holds it")


def test_algorithm_without_options_says_so() -> None:
    (diagnostic,) = resolve_text(MESH + "algorithm expert-parallel for moe over dp top=2\n"
                                 ).diagnostics
    assert diagnostic.code is codes.UNKNOWN_OPTION
    assert diagnostic.message == ("unknown option 'top': algorithm expert-parallel takes no "
                                  "options")
    assert diagnostic.span.line == 4 and diagnostic.span.col == 43


def test_a_spec_optimizer_without_an_optimizer_is_found_at_the_spec_optimizer(
        tmp_path: Path) -> None:
    """The reference step updates the parameters and the plan does not: TVP280 at the
    `spec-optimizer` line, with the statement to add (the fuzz of tvp check found simulate
    and check reporting the difference with no plan line)."""
    text = ('plan demo\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
            "spec-optimizer adamw lr=3e-4 weight-decay=0.1\nmesh dp=2\nsplit x [dp, -]\n"
            "split target [dp, -]\nall-reduce grad(params) over dp op=avg\n")
    (found,) = lint_files(tmp_path, {"main.tvp": text})
    assert (found.code.id, found.span.line) == ("TVP280", 3)
    assert found.help == "add `optimizer adamw lr=0.0003 weight-decay=0.1`"
    fixed = lint_files(tmp_path, {"main.tvp": text + "optimizer adamw lr=3e-4 weight-decay=0.1\n"})
    assert "TVP280" not in codes_of(fixed)


@pytest.mark.parametrize("stated", ["eps=1e-8", "betas=(0.9, 0.999)", "weight-decay=0.01",
                                    "eps=1e-8 betas=(0.9, 0.999) weight-decay=0.01"])
def test_an_optimizer_default_written_out_is_the_default(tmp_path: Path, stated: str) -> None:
    """torch's defaults compare exactly with the plan's decimal literals: `eps=1e-8` written
    out is AdamW's default, not an error against the float 1e-8 (an outside user's plan was
    rejected with "eps=1e-08 (spec: 1e-08)"); a real difference is still found."""
    head = ('plan demo\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
            "spec-optimizer adamw lr=0.001\nmesh dp=2\nsplit x [dp, -]\n"
            "split target [dp, -]\nall-reduce grad(params) over dp op=avg\n")
    assert "TVP280" not in codes_of(lint_files(tmp_path, {"main.tvp": head + f"optimizer adamw "
                                                          f"lr=0.001 {stated}\n"}))
    (found,) = lint_files(tmp_path, {"main.tvp": head + "optimizer adamw lr=0.001 eps=1.1e-8\n"})
    assert (found.code.id, found.span.line) == ("TVP280", 8)


def test_a_difference_no_float_can_show_is_not_printed_as_equal_values(tmp_path: Path) -> None:
    """`momentum=1e-1000` differs from the spec's 0, but as a float it is 0.0: the message
    said "momentum=0.0 (spec: 0)". A value a float cannot hold is shown exactly or says so."""
    head = ('plan demo\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
            "spec-optimizer sgd lr=0.1\nmesh dp=2\nsplit x [dp, -]\n"
            "split target [dp, -]\nall-reduce grad(params) over dp op=avg\n")
    (found,) = lint_files(tmp_path, {"main.tvp": head + "optimizer sgd lr=0.1 momentum=1e-1000\n"})
    assert "momentum=a number too small for a float, but not 0 (spec: 0)" in found.message
    (found,) = lint_files(tmp_path, {"main.tvp": head.replace("lr=0.1", "lr=1/3") +
                                     "optimizer sgd lr=0.3333333333333333\n"})
    assert "lr=0.3333333333333333 (spec: 1/3)" in found.message


@pytest.mark.parametrize(("optimizer", "code", "col"), [
    ("optimizer sgd lr=1e400", "TVP255", 15),   # not a float64
    ("optimizer sgd lr=-0.1", "TVP255", 15),    # negative
    ("optimizer sgd lr=0x10", "TVP115", 18),    # not read at all: a glued number
])
def test_a_bad_optimizer_value_is_reported_once_at_the_value(
        tmp_path: Path, optimizer: str, code: str, col: int | None) -> None:
    """One error, at the value: not a second TVP280 comparing "lr=None" with the spec's, and
    not "the plan has no `optimizer` statement" for a statement the parser could not read."""
    text = ('plan demo\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
            "spec-optimizer sgd lr=0.1\nmesh dp=2\nsplit x [dp, -]\nsplit target [dp, -]\n"
            f"all-reduce grad(params) over dp op=avg\n{optimizer}\n")
    (found,) = lint_files(tmp_path, {"main.tvp": text})
    assert (found.code.id, found.span.line) == (code, 8)
    assert col is None or found.span.col == col


def test_a_microbatch_count_that_does_not_divide_a_data_block_is_named() -> None:
    """Llama3-405B's batch 2048 over dp=64 in 24 microbatches: the help said only "make
    dimension 0 a multiple of 1536, or split it over fewer devices"; the count that does not
    divide the 32 rows of a block is the microbatches'."""
    result = resolve_text("plan p\nspec \"m.py:M\" batch 2048 seq 8\nmesh dp=64\n"
                          "microbatches 24\nsplit tokens [dp, -]\n", head="")
    [found] = [d for d in result.diagnostics if d.code is codes.SPLIT_NOT_DIVISIBLE]
    assert "each of the 64 blocks has 32 rows, which `microbatches 24` does not divide" \
        in (found.help or "")
