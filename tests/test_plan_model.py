"""The resolved plan model: patterns, mesh rank order, layouts, the JSON form."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_plan_support import resolve_text

from trainverify_dsl.plan import parse_pattern, plan_to_dict
from trainverify_dsl.plan.model import (
    GlobSeg,
    IndexSeg,
    Mesh,
    MeshAxis,
    NameSeg,
    SliceSeg,
    TensorPattern,
    exact,
)
from trainverify_dsl.report.span import NO_SPAN


def mesh_of(**sizes: int) -> Mesh:
    return Mesh(tuple(MeshAxis(name, size, NO_SPAN) for name, size in sizes.items()), NO_SPAN)


@pytest.mark.parametrize("text", [
    "layers.*.attention.wq.weight", "grad(params)", "layers[0:8]", "layers[::2].w",
    "layers[2:].ffn", "tokens", "layers.3.w?_proj", "grad(layers[0:8].attention.wo.weight)",
])
def test_pattern_text_round_trips(text: str) -> None:
    assert str(parse_pattern(text)) == text


def test_pattern_segments_are_typed() -> None:
    pattern = parse_pattern("grad(layers[0:8:2].*.w3)")
    assert pattern.grad
    assert pattern.segments == (NameSeg("layers"), SliceSeg(0, 8, 2), GlobSeg("*"),
                                NameSeg("w3"))
    assert parse_pattern("layers.3").segments[1] == IndexSeg(3)


@pytest.mark.parametrize(("pattern", "path", "expected"), [
    ("layers.*.attention.wq.weight", "layers.3.attention.wq.weight", True),
    ("layers.*.attention.wq.weight", "layers.3.attention.wk.weight", False),
    ("layers.*.attention.wq.weight", "layers.3.attention.wq", False),
    ("layers[0:8].w", "layers.7.w", True),
    ("layers[0:8].w", "layers.8.w", False),
    ("layers[1::2].w", "layers.5.w", True),
    ("layers[1::2].w", "layers.4.w", False),
    ("layers.3.w", "layers.3.w", True),
    ("layers.*.*_proj", "layers.0.q_proj", True),
    ("grad(params)", "grad(layers.0.w)", True),
    ("grad(params)", "layers.0.w", False),
    ("params", "layers.0.w", True),
    # a name means nothing to `params`: a parameter named `out` (or `tokens`) is one; the
    # lowering keeps module boundaries and model inputs out (`is_params`)
    ("params", "layers.0.out", True),
    ("grad(params)", "grad(out)", True),
    ("layers[-2:].w", "layers.30.w", False),
])
def test_pattern_matches_concrete_paths(pattern: str, path: str, expected: bool) -> None:
    assert parse_pattern(pattern).matches(path) is expected


def test_prefix_match_selects_members_of_a_module() -> None:
    stage = parse_pattern("layers[0:8]")
    assert stage.matches("layers.3.attention.wq.weight", prefix=True)
    assert not stage.matches("layers.3.attention.wq.weight")
    assert not stage.matches("layers.9.attention.wq.weight", prefix=True)


def test_slice_with_negative_bounds_needs_the_length() -> None:
    seg = SliceSeg(-2, None, None)
    assert seg.contains(30) is None
    assert seg.contains(30, length=32) is True
    assert seg.contains(29, length=32) is False


def test_mesh_rank_order_is_row_major_first_axis_outermost() -> None:
    mesh = mesh_of(pp=2, dp=2, tp=2)
    assert mesh.total_devices == 8
    assert mesh.rank({"pp": 1, "dp": 0, "tp": 1}) == 1 * 4 + 0 * 2 + 1
    assert mesh.coords(6) == {"pp": 1, "dp": 1, "tp": 0}
    assert mesh.group_size(("dp", "tp")) == 4
    assert mesh.size("tp") == 2
    assert mesh.describe() == "Mesh(pp=2, dp=2, tp=2)"
    with pytest.raises(ValueError):
        mesh.coords(8)
    with pytest.raises(KeyError):
        mesh.size("cp")


@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_rank_and_coords_are_inverse(sizes: list[int], data: st.DataObject) -> None:
    mesh = mesh_of(**{f"a{i}": s for i, s in enumerate(sizes)})
    rank = data.draw(st.integers(0, mesh.total_devices - 1))
    coords = mesh.coords(rank)
    assert mesh.rank(coords) == rank
    assert all(0 <= coords[a.name] < a.size for a in mesh.axes)


def test_exact_values_in_json_form() -> None:
    assert exact(Fraction(1, 16)) == "1/16"
    assert exact(Fraction(8)) == 8
    assert exact((Fraction(9, 10), Fraction(1))) == ["9/10", 1]


def test_plan_to_dict_is_json_with_stable_keys() -> None:
    result = resolve_text(
        "mesh pp=2, dp=2, tp=2\nmicrobatches 4\nloss-scale 1/microbatches\n"
        "split tokens [dp, -]\n"
        "for l in layers[0:2]:\n    split l.wq.weight [tp, -]\n"
        "all-reduce grad(params) over dp op=avg\n"
        "pipeline-stage 0: embed, layers[0:1]\npipeline-stage 1: layers[1:2]\n"
        "optimizer adam lr=1e-3 betas=(0.9, 0.999) shard over dp\n")
    assert result.ok, result.diagnostics
    data = json.loads(json.dumps(plan_to_dict(result.plan)))
    assert data["loss_scale"] == "1/4"
    assert data["mesh"] == [{"name": "pp", "size": 2}, {"name": "dp", "size": 2},
                            {"name": "tp", "size": 2}]
    layout = data["layouts"][1]
    assert layout["target"] == "layers[0:2].wq.weight"
    assert layout["placements"] == {"pp": "R", "dp": "R", "tp": "S(0)"}
    assert layout["origins"][0]["trail"][0]["kind"] == "for"
    assert data["collectives"][0]["backward"] == "identity"
    assert data["optimizer"]["hyper"] == {"lr": "1/1000", "betas": ["9/10", "999/1000"]}
    assert data["optimizer"]["shard_axes"] == ["dp"]
    assert [s["members"] for s in data["stages"]] == [["embed", "layers[0:1]"], ["layers[1:2]"]]
    assert result.plan.stage_of("layers.1.attention.wq.weight") == 1
    assert result.plan.stage_of("embed.weight") == 0
    assert result.plan.stage_of("norm.weight") is None
    assert set(data) == {"name", "file", "files", "spec", "mesh", "microbatches", "schedule",
                         "loss_scale", "layouts", "collectives", "sends", "stages",
                         "optimizer", "spec_optimizer", "clip_grad_norm", "algorithms"}


def test_layout_lookup_helpers() -> None:
    result = resolve_text("mesh dp=2, tp=2\nsplit layers.*.w [tp, -]\npartial x.out over dp\n")
    plan = result.plan
    layout = plan.layout_of("layers.*.w")
    assert layout is not None and layout.axes_of_dim(0) == ("tp",)
    assert [str(x.target) for x in plan.layouts_for("layers.4.w")] == ["layers.*.w"]
    assert plan.layout_of("x.out").partial_axes == ("dp",)
    assert TensorPattern((NameSeg("x"), NameSeg("out"))) == plan.layout_of("x.out").target
