"""Negative indices count from the end of a module list (docs/language.md, "Tensor names"), the
same way in `tvp lint`, `tvp lint --spec`, `tvp simulate` and `tvp fmt` (issue 13, item 6:
fmt wrote `layers.-1`, which does not parse, and the lowering matched nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl.api import layout_diagnostics
from trainverify_dsl.cli.main import main
from trainverify_dsl.parse import format_source, parse_source
from trainverify_dsl.plan import lint_file

ROOT = Path(__file__).resolve().parents[1]
#: llama_tiny (2 layers) with tensor parallelism; the last layer's w2 is split row-parallel
#: by the statement under test and its all-reduce is missing on purpose
PLAN = """plan n
spec "stdlib/models/llama.py:Llama" config llama_tiny batch 4 seq 8
spec-optimizer sgd lr=0.01
mesh dp=2, tp=2
use "stdlib/megatron.tvp"

split tokens [dp, -]
split labels [dp, -]

for l in layers:
    apply attention_parallel(l.attention, tp)
    apply column_parallel(l.feed_forward.w1, tp)
    apply column_parallel(l.feed_forward.w3, tp)
split layers.0.feed_forward.w2.weight [-, tp]
all-reduce layers.0.feed_forward.w2.out over tp
{last}

all-reduce grad(params) over dp op=avg
optimizer sgd lr=0.01
"""
LAST = "split layers{index}.feed_forward.w2.weight [-, tp]\n" \
       "all-reduce layers{index}.feed_forward.w2.out over tp"


def _write(tmp_path: Path, index: str, name: str = "p.tvp") -> Path:
    path = tmp_path / name
    path.write_text(PLAN.format(last=LAST.format(index=index)), encoding="utf-8")
    return path


def _codes(diagnostics: object) -> list[tuple[str, int]]:
    return sorted((d.code.id, d.span.line) for d in diagnostics)  # type: ignore[attr-defined]


def test_the_last_layer_by_a_negative_index_is_the_last_layer(tmp_path: Path) -> None:
    negative, positive = _write(tmp_path, "[-1]", "neg.tvp"), _write(tmp_path, ".1", "pos.tvp")
    assert not lint_file(negative) and not lint_file(positive)
    assert not layout_diagnostics(negative) and not layout_diagnostics(positive)
    assert main(["simulate", str(negative)]) == 0


def test_without_its_all_reduce_the_negative_index_split_is_found(tmp_path: Path) -> None:
    path = tmp_path / "p.tvp"
    path.write_text(PLAN.format(last="split layers[-1].feed_forward.w2.weight [-, tp]"),
                    encoding="utf-8")
    found = _codes(d for d in layout_diagnostics(path) if d.severity.name == "ERROR")
    # the partial sum of layers.1's w2 reaches the final norm (TVP404/405), blamed on the split
    assert {code for code, _ in found} <= {"TVP404", "TVP405"} and found, found
    assert all(line == 16 for _, line in found), found


@pytest.mark.parametrize("index", ["[-1]", "[-2]"])
def test_fmt_keeps_a_negative_index_parseable(tmp_path: Path, index: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    text = PLAN.format(last=LAST.format(index=index))
    formatted = format_source(text, "p.tvp").text
    assert formatted is not None
    assert f"layers{index}.feed_forward" in formatted and "layers.-" not in formatted
    assert not parse_source(formatted, "p.tvp").diagnostics
    assert main(["fmt", "--check", str(_write(tmp_path, index))]) in (0, 1)  # no internal
    assert "internal error" not in capsys.readouterr().err


def test_an_index_before_the_first_layer_is_named_so(tmp_path: Path) -> None:
    path = _write(tmp_path, "[-3]")
    found = [d for d in lint_file(path) if d.code.id == "TVP268"]
    assert [d.span.line for d in found] == [16, 17]
    assert all("before the first one" in d.message for d in found)
