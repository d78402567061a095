"""A mesh axis of size 1 that the plan's statements use (an auto-parallel search's tp=1
variant of a Megatron plan): every collective over it is the identity, so a reduction of a
tensor that is not partial over it, or a backward that sums a complete gradient over it,
"multiplies by 1" and is no finding; the plan lints clean and simulates to the spec. A bug
on another axis is still found."""

from __future__ import annotations

from pathlib import Path

from trainverify_dsl.api import layout_diagnostics, simulate_file

ROOT = Path(__file__).resolve().parents[1]


def _tp1(tmp_path: Path, change: tuple[str, str] | None = None) -> Path:
    text = (ROOT / "plans" / "llama_tiny_tp.tvp").read_text(encoding="utf-8")
    text = text.replace("mesh dp=2, tp=2", "mesh dp=2, tp=1")
    if change is not None:
        assert change[0] in text
        text = text.replace(*change)
    path = tmp_path / "llama_tiny_tp1.tvp"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_megatron_plan_at_tp_1_is_clean_and_agrees(tmp_path: Path) -> None:
    path = _tp1(tmp_path)
    assert [d.message for d in layout_diagnostics(path)] == []
    result = simulate_file(path)
    assert result.agrees, result.first


def test_a_bug_on_another_axis_is_still_found(tmp_path: Path) -> None:
    path = _tp1(tmp_path, ("all-reduce grad(params) over dp op=avg",
                           "all-reduce grad(params) over dp op=sum"))
    result = simulate_file(path, stop_on_errors=False)
    assert not result.agrees
