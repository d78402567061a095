"""A gradient statement that sums copies already complete over an axis multiplies the
gradient by the axis size (docs/semantics.md §4.7). On its own that is TVP406; but the
plan's loss scale may divide it back. DeepSeek's expert-parallel plan with the tokens
replicated over ep (`split tokens [dp, -]`) keeps `loss-scale 1/(dp*ep)` and the
`non_expert_grads(dp, ep)` sums: x2 from the ep copies, x1/2 from the scale — right, and
gloo agrees (an outside user's plan). It was rejected with two errors that cancel (TVP406
x2 and TVP411 x1/2). The factor now enters the §4.7 product, and only a product that is
not 1 is reported (TVP411, naming the copies)."""

from __future__ import annotations

from pathlib import Path

from trainverify_dsl.api import layout_diagnostics, simulate_file

ROOT = Path(__file__).resolve().parents[1]


def plan(tmp_path: Path, scale: str) -> Path:
    text = (ROOT / "plans" / "deepseek_tiny_ep.tvp").read_text(encoding="utf-8")
    text = text.replace('"stdlib/', f'"{ROOT}/stdlib/').replace("[(dp, ep), -]", "[dp, -]")
    path = tmp_path / "replicated_over_ep.tvp"
    path.write_text(text.replace("loss-scale 1/(dp*ep)", f"loss-scale {scale}"),
                    encoding="utf-8")
    return path


def test_copies_summed_and_a_loss_scale_that_divides_them_back_agree(tmp_path: Path) -> None:
    path = plan(tmp_path, "1/(dp*ep)")
    assert layout_diagnostics(path) == []
    result = simulate_file(path)
    assert result.agrees, result.mismatches[:3]


def test_copies_summed_that_no_scale_divides_back_are_a_loss_scale_mismatch(
        tmp_path: Path) -> None:
    path = plan(tmp_path, "1/dp")
    found = [d for d in layout_diagnostics(path) if d.code.id == "TVP411"]
    assert found and "summing their copies already complete over ep multiplies them by 2" \
        in found[0].message, [d.message for d in found]

