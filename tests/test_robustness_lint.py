"""Hostile input to ``tvp lint`` / ``tvp fmt`` and the plan API: a diagnostic with
file:line:col and the documented exit code, never a traceback, a hang or a flood.

Each case is a set of files written to a temporary directory and the diagnostics the main
file must produce, as (code, file, line, col); ``None`` means "clean". The CLI is run once
per exit code over a whole batch of cases, so the file stays fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from trainverify_dsl import PROJECT_ROOT
from trainverify_dsl.parse import format_source, parse_file, parse_source
from trainverify_dsl.plan import lint_file, plan_to_dict, resolve_file

HEAD = 'plan x\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\nmesh dp=2\n'
BIG = 10**44
LLAMA = ('plan x\nspec "stdlib/models/llama.py:Llama" config llama_tiny batch 8 seq 16{extra}\n'
         "mesh pp={pp}\n")

Expect = tuple[str, str, int, int]  # code, file name, line, column


@dataclass(frozen=True)
class Case:
    name: str
    files: dict[str, str | bytes]
    expected: tuple[Expect, ...] | None = None  # None: lints clean
    main: str = "main.tvp"
    #: Substrings the messages/notes of the diagnostics must contain.
    says: tuple[str, ...] = field(default=())


CASES = [
    Case("empty", {"main.tvp": ""}),
    Case("only_comments", {"main.tvp": "# nothing\n   # here\n"}),
    Case("bom", {"main.tvp": b"\xef\xbb\xbf" + HEAD.encode()}),
    Case("crlf", {"main.tvp": HEAD.replace("\n", "\r\n") + "split x [dp, -]\r\n"}),
    Case("cr_only_line_ends", {"main.tvp": HEAD.replace("\n", "\r") + "split x [zz, -]\r"},
         (("TVP207", "main.tvp", 4, 10),)),
    Case("huge_line", {"main.tvp": HEAD + "split " + "a." * 100_000 + "b [dp]\n"}),
    Case("nul_byte", {"main.tvp": b"plan x\nmesh dp=2\x00\n"}, (("TVP109", "main.tvp", 2, 10),),
         says=("NUL byte",)),
    Case("binary", {"main.tvp": bytes(range(256)) * 64}, (("TVP109", "main.tvp", 1, 1),)),
    Case("not_utf8", {"main.tvp": b"plan x\nmesh dp=2\n# caf\xe9\n"},
         (("TVP109", "main.tvp", 3, 6),), says=("not valid UTF-8",)),
    Case("use_itself", {"main.tvp": HEAD + 'use "main.tvp"\n'}, (("TVP211", "main.tvp", 4, 1),)),
    Case("use_directory", {"main.tvp": HEAD + 'use "sub"\n', "sub/keep.tvp": ""},
         (("TVP210", "main.tvp", 4, 1),), says=("(a directory)",)),
    Case("use_dir_named_tvp", {"main.tvp": HEAD + 'use "d.tvp"\n', "d.tvp/keep.tvp": ""},
         (("TVP210", "main.tvp", 4, 1),), says=("(a directory)",)),
    Case("use_binary", {"main.tvp": HEAD + 'use "bin.tvp"\n', "bin.tvp": b"\x00\x01\x02"},
         (("TVP109", "bin.tvp", 1, 1),), says=("in the file used at",)),
    Case("use_syntax_errors",
         {"main.tvp": HEAD + 'use "frag.tvp"\n', "frag.tvp": "split x [dp,\nfoo bar\n"},
         (("TVP121", "frag.tvp", 1, 13), ("TVP107", "frag.tvp", 2, 1)),
         says=("in the file used at",)),
    Case("huge_slice_in_loop", {"main.tvp": HEAD + f"for l in layers[0:{BIG}]:\n"
                                "    split l.w [dp, -]\nsplit layers.*.w [-, dp]\n"},
         (("TVP227", "main.tvp", 4, 16),), says=("out of range",)),
    Case("huge_index", {"main.tvp": HEAD + f"split layers[-{BIG}].w [dp]\n"},
         (("TVP227", "main.tvp", 4, 13),)),
    Case("huge_stage_slice", {"main.tvp": HEAD.replace("dp=2", "pp=2")
                              + f"pipeline-stage 0: layers[0:{BIG}]\n"
                              + f"pipeline-stage 1: layers[{BIG}:]\n"},
         (("TVP227", "main.tvp", 4, 25), ("TVP227", "main.tvp", 5, 25))),
    Case("mesh_zero", {"main.tvp": HEAD.replace("dp=2", "dp=0")},
         (("TVP205", "main.tvp", 3, 6),)),
    Case("mesh_negative", {"main.tvp": HEAD.replace("dp=2", "dp=-4")},
         (("TVP205", "main.tvp", 3, 6),)),
    Case("mesh_huge", {"main.tvp": HEAD.replace("dp=2", f"dp={BIG}, tp={BIG}")},
         (("TVP205", "main.tvp", 3, 6),), says=("larger than 9223372036854775807 devices",)),
    Case("mesh_huge_product", {"main.tvp": HEAD.replace("dp=2", f"dp={2**62}, tp=2")},
         (("TVP205", "main.tvp", 3, 30),)),
    Case("values_beyond_printable", {"main.tvp": HEAD + "loss-scale -" + "*".join(
        ["1e1000"] * 5) + "\nmicrobatches " + "*".join(["1e1000"] * 5) + "/3\n"},
         (("TVP227", "main.tvp", 4, 12), ("TVP227", "main.tvp", 5, 14)),
         says=("too large",)),
    Case("split_over_axis_of_size_1", {"main.tvp": HEAD.replace("dp=2", "dp=1")
                                       + "split x [dp, -]\n"}),
    Case("n_layers_huge", {"main.tvp": LLAMA.format(extra=f" n_layers {BIG}", pp=2)
                           + "pipeline-stage 0: embed, layers[0:10]\n"
                           "pipeline-stage 1: layers[10:], norm, output, loss\n"}),
    Case("n_layers_large_few_stages", {"main.tvp": LLAMA.format(extra=" n_layers 100000000",
                                                                 pp=2)
                                       + "pipeline-stage 0: embed, layers[0:5]\n"
                                       "pipeline-stage 1: layers[5:10], norm, output, loss\n"}),
    Case("n_layers_negative", {"main.tvp": LLAMA.format(extra=" n_layers -5", pp=2)},
         (("TVP227", "main.tvp", 2, 70),)),
    Case("n_layers_fraction", {"main.tvp": LLAMA.format(extra=" n_layers 1/2", pp=2)},
         (("TVP227", "main.tvp", 2, 70),)),
    Case("pp_huge_with_gap", {"main.tvp": LLAMA.format(extra="", pp=2**60)
                              + "pipeline-stage 0: embed, layers[0:1]\n"
                              "pipeline-stage 1: layers[1:], norm, output, loss\n"},
         (("TVP243", "main.tvp", 5, 1),), says=(f"2 .. {2**60 - 1} have no pipeline stage",)),
    Case("loss_scale_1_over_0", {"main.tvp": HEAD + "loss-scale 1/0\n"},
         (("TVP226", "main.tvp", 4, 12),)),
    Case("template_recursion", {"main.tvp": HEAD + "template a(m):\n    apply b(m)\n"
                                "template b(m):\n    apply a(m)\napply a(x)\n"},
         (("TVP217", "main.tvp", 8, 1),)),
    Case("template_fan_out", {"main.tvp": HEAD + "".join(
        f"template t{i}(m):\n" + f"    apply t{i + 1}(m)\n" * 10 for i in range(8))
        + "template t8(m):\n    split m [dp]\napply t0(x)\n"},
        (("TVP220", "main.tvp", 94, 1),)),
    Case("deep_loops", {"main.tvp": HEAD + "".join(
        "    " * i + f"for l{i} in layers:\n" for i in range(120))
        + "    " * 120 + "split x [dp]\n"},
        (("TVP108", "main.tvp", 23, 77),)),
    Case("deep_expression", {"main.tvp": HEAD + "loss-scale " + "-" * 300 + "1\n"},
         (("TVP108", "main.tvp", 4, 211),)),
    Case("optimizer_ranges", {"main.tvp": HEAD + "optimizer adam lr=-1 betas=(1, 0.5) "
                              "weight-decay=-1/10\n"},
         (("TVP255", "main.tvp", 4, 16), ("TVP255", "main.tvp", 4, 22),
          ("TVP255", "main.tvp", 4, 37))),
    Case("duplicate_options", {"main.tvp": HEAD + "all-reduce grad(params) over dp op=sum "
                               "op=avg\noptimizer sgd lr=1 lr=2\n"},
         (("TVP267", "main.tvp", 4, 40), ("TVP267", "main.tvp", 5, 20))),
    Case("axis_twice_in_a_group", {"main.tvp": HEAD.replace("dp=2", "dp=2, tp=2")
                                   + "all-reduce grad(params) over dp, dp\n"
                                   "optimizer sgd lr=1 shard over (tp, tp)\n"},
         (("TVP230", "main.tvp", 4, 34), ("TVP230", "main.tvp", 5, 36))),
    Case("reduce_op_not_a_word", {"main.tvp": HEAD + "all-reduce x over dp op=1\n"
                                  "partial y over dp op=layers.x\n"},
         (("TVP263", "main.tvp", 4, 22), ("TVP263", "main.tvp", 5, 19)),
         says=("'1'", "'layers.x'")),
    Case("paren_axis_list_in_split", {"main.tvp": HEAD + "split y [(dp,), -]\n"},
         (("TVP101", "main.tvp", 4, 14),)),
    Case("loop_variable_hides_axis", {"main.tvp": HEAD + "for dp in layers:\n"
                                      "    split dp.w [dp]\n"},
         (("TVP219", "main.tvp", 5, 5),), says=("loop variable 'dp'",)),
]


def write_case(root: Path, case: Case) -> Path:
    directory = root / case.name
    for name, content in case.files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", newline="")
    return directory / case.main


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("robust")
    return {case.name: write_case(root, case) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_lint_api_reports_each_problem_at_its_place(case: Case, corpus) -> None:
    diagnostics = lint_file(corpus[case.name])
    found = {(d.code.id, Path(d.span.file).name, d.span.line, d.span.col) for d in diagnostics}
    if case.expected is None:
        assert not [d for d in diagnostics if d.severity == "error"], diagnostics
        return
    assert set(case.expected) <= found, sorted(found)
    # No flood: a handful of diagnostics, not one per byte of a binary file.
    assert len(diagnostics) <= len(case.expected) + 3, sorted(found)
    text = " ".join(d.message + " " + " ".join(d.notes) for d in diagnostics)
    assert len(text) < 2000  # messages summarise, they do not enumerate
    for phrase in case.says:
        assert phrase in text


def test_resolved_plans_are_json_even_for_hostile_input(corpus) -> None:
    for case in CASES:
        plan = resolve_file(corpus[case.name]).plan
        if plan is not None:
            json.dumps(plan_to_dict(plan), allow_nan=False)


@pytest.mark.parametrize("path", sorted(
    [*(PROJECT_ROOT / "plans").rglob("*.tvp"), *(PROJECT_ROOT / "stdlib").glob("*.tvp")]),
    ids=lambda p: p.name)
def test_every_shipped_plan_dict_is_json(path: Path) -> None:
    result = resolve_file(path)
    assert result.plan is not None
    assert json.loads(json.dumps(plan_to_dict(result.plan), allow_nan=False))


def test_bom_is_not_part_of_the_text() -> None:
    result = parse_source("\ufeffplan x\nmesh  dp=2\n", "f.tvp")
    assert result.ok and result.plan_file is not None
    assert result.plan_file.statements[0].span.col == 1
    assert format_source("\ufeffplan x\nmesh  dp=2\n").text == "plan x\nmesh dp=2\n"


def test_non_regular_files_are_refused_without_blocking(tmp_path) -> None:
    fifo = tmp_path / "pipe.tvp"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero"), tmp_path):
        (diagnostic,) = parse_file(path).diagnostics
        assert diagnostic.code.id == "TVP109" and diagnostic.span.line == 1
    main = tmp_path / "main.tvp"
    main.write_text(HEAD + 'use "pipe.tvp"\n', encoding="utf-8")
    (diagnostic,) = lint_file(main)
    assert diagnostic.code.id == "TVP210" and "(not a regular file)" in " ".join(diagnostic.notes)


def run_tvp(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "trainverify_dsl", *args], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=120)


def test_cli_lint_batch_exit_codes_and_no_traceback(corpus, tmp_path) -> None:
    with_findings = [str(corpus[c.name]) for c in CASES if c.expected is not None]
    clean = [str(corpus[c.name]) for c in CASES if c.expected is None]
    findings = run_tvp("lint", *with_findings, cwd=tmp_path)
    assert findings.returncode == 1, findings.stderr
    for case in CASES:
        for code, name, line, col in case.expected or ():
            assert f"{name}:{line}:{col}: error:" in findings.stdout and f"[{code}]" in \
                findings.stdout, (case.name, code)
    ok = run_tvp("lint", *clean, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "dir.tvp").mkdir()
    usage = run_tvp("lint", "empty_dir", "dir.tvp", cwd=tmp_path)
    assert usage.returncode == 2 and "no .tvp files under empty_dir" in usage.stderr
    for result in (findings, ok, usage):
        assert "Traceback" not in result.stdout + result.stderr


def test_cli_fmt_check_on_hostile_files(corpus, tmp_path) -> None:
    bom = corpus["bom"]
    check = run_tvp("fmt", "--check", str(bom), str(corpus["crlf"]), str(corpus["empty"]),
                    cwd=tmp_path)
    assert check.returncode == 1 and f"would reformat {bom}" in check.stderr  # drops the BOM
    broken = run_tvp("fmt", "--check", str(corpus["nul_byte"]), str(corpus["binary"]),
                     cwd=tmp_path)
    assert broken.returncode == 1 and "2 files failed" in broken.stderr
    assert "Traceback" not in check.stderr + broken.stderr


def test_cli_unreadable_inputs_are_located_and_never_block(corpus, tmp_path) -> None:
    fifo = tmp_path / "pipe.tvp"
    os.mkfifo(fifo)
    not_utf8 = str(corpus["not_utf8"])
    fmt = run_tvp("fmt", "--check", not_utf8, str(fifo), cwd=tmp_path)
    assert fmt.returncode == 1 and "2 files failed" in fmt.stderr
    assert f"{not_utf8}:3:6: error: the file is not valid UTF-8" in fmt.stderr
    assert f"{fifo}:1:1: error: cannot read" in fmt.stderr and "not a regular file" in fmt.stderr
    lint = run_tvp("lint", str(fifo), cwd=tmp_path)  # the text renderer must not read it
    assert lint.returncode == 1 and "not a regular file" in lint.stdout
    assert "Traceback" not in fmt.stderr + lint.stdout + lint.stderr
