"""Generated plans (hypothesis): a plan errs at full size if and only if it errs shrunk
(docs/semantics.md, "Shrinking for simulation").

Small MLP and Llama configs, meshes of one or two axes with arbitrary names and sizes 2-4,
random splits of weights and inputs (Megatron templates over a random axis, inputs split over
another), random microbatches and ZeRO. Each example lowers the plan twice on fake tensors: at
its own sizes and at the sizes ``shrink_plan`` gives (forced, although the configs are small).
Bounded: a few examples each, no deadline (CI has 2 cores).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainverify_dsl.api import SimulationSetupError, prepare
from trainverify_dsl.lower.findings import LoweringError
from trainverify_dsl.lower.lowering import lower

MEGATRON = Path(__file__).resolve().parents[1] / "stdlib" / "megatron.tvp"
NAMES = ["mp", "dq", "rows", "a1", "zz", "tp", "dp"]
SLOW = settings(max_examples=8, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def outcome(path: Path, shrink: bool) -> tuple[str, ...]:
    """The finding codes of lowering ``path`` (empty when it lowers cleanly)."""
    try:
        setup = prepare(path, shrink=shrink, real=False)
    except SimulationSetupError as error:  # a plan error: the same at every size
        return ("plan",) + tuple(d.code.id for d in error.diagnostics)
    try:
        lowered = lower(setup.plan, setup.fake_model, setup.fake_inputs)
    except LoweringError as error:
        return tuple(sorted({f.code.name for f in error.findings}))
    return tuple(sorted({f.code.name for f in lowered.findings}))


@st.composite
def meshes(draw: st.DrawFn) -> dict[str, int]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True))
    return {n: draw(st.sampled_from([2, 3, 4])) for n in names}


def header(spec: str, mesh: dict[str, int], microbatches: int) -> str:
    axes = ", ".join(f"{a}={n}" for a, n in mesh.items())
    return (f"plan generated\nspec {spec}\nmesh {axes}\nmicrobatches {microbatches}\n"
            f"loss-scale 1/microbatches\nuse \"{MEGATRON}\"\n")


@st.composite
def mlp_plans(draw: st.DrawFn) -> str:
    # mostly multiples of every axis size, sometimes not (8 and 10 for 3, 10 for 4)
    sizes = {k: draw(st.sampled_from([12, 24, 48, 8, 10])) for k in ("d_in", "d_hidden",
                                                                     "d_out")}
    batch = draw(st.sampled_from([24, 48, 12, 8]))
    mesh = draw(meshes())
    axis = st.sampled_from(sorted(mesh))
    config = " ".join(f"{k} {v}" for k, v in sizes.items())
    lines = [header(f'"stdlib/models/mlp.py:MLP" config mlp_tiny {config} batch {batch} seq 1',
                    mesh, draw(st.sampled_from([1, 2])))]
    data = draw(st.none() | axis)
    if data:
        lines += [f"split x [{data}, -]", f"split target [{data}, -]"]
    model = draw(axis)
    lines += draw(st.sampled_from([[], [f"apply column_parallel_bias(fc1, {model})"]]))
    lines += draw(st.sampled_from([[], [f"apply row_parallel_bias(fc2, {model})"],
                                   [f"split fc2.weight [-, {model}]",
                                    f"all-reduce fc2.out over {model}"]]))
    if data:
        lines.append(f"all-reduce grad(params) over {data} op=avg")
    shard = draw(st.none() | axis)
    lines += ["spec-optimizer adam lr=0.001", f"optimizer adam lr=0.001 shard over {shard}"] \
        if shard else ["spec-optimizer sgd lr=0.1", "optimizer sgd lr=0.1"]
    return "\n".join(lines) + "\n"


@st.composite
def llama_plans(draw: st.DrawFn) -> str:
    heads = draw(st.sampled_from([12, 4, 6]))
    kv = draw(st.sampled_from([k for k in (12, 6, 4, 2, 1) if heads % k == 0]))
    head_dim = draw(st.sampled_from([2, 4, 6]))
    sizes = {"n_heads": heads, "n_kv_heads": kv, "hidden": heads * head_dim,
             "ffn_hidden": draw(st.sampled_from([24, 36, 16])),
             "vocab_size": draw(st.sampled_from([24, 48, 61]))}
    mesh = draw(meshes())
    axis = st.sampled_from(sorted(mesh))
    config = " ".join(f"{k} {v}" for k, v in sizes.items())
    batch, seq = draw(st.sampled_from([12, 24, 8])), draw(st.sampled_from([12, 4]))
    lines = [header(f'"stdlib/models/llama.py:Llama" config llama_tiny {config} batch {batch} '
                    f"seq {seq}", mesh, draw(st.sampled_from([1, 2])))]
    data = draw(st.none() | axis)
    if data:
        lines += [f"split tokens [{data}, -]", f"split labels [{data}, -]"]
    model = draw(axis)
    body = draw(st.lists(st.sampled_from([f"apply attention_parallel(l.attention, {model})",
                                          f"apply swiglu_parallel(l.feed_forward, {model})"]),
                         unique=True))
    if body:
        lines += ["for l in layers:"] + [f"    {b}" for b in body]
    if draw(st.booleans()):
        lines.append(f"apply vocab_parallel_embedding(embed, {model})")
    if data:
        lines.append(f"all-reduce grad(params) over {data} op=avg")
    shard = draw(st.none() | axis)
    lines += ["spec-optimizer adam lr=0.001", f"optimizer adam lr=0.001 shard over {shard}"] \
        if shard else ["spec-optimizer sgd lr=0.1", "optimizer sgd lr=0.1"]
    return "\n".join(lines) + "\n"


def errs_alike(tmp_path: Path, text: str) -> None:
    path = tmp_path / "generated.tvp"
    path.write_text(text)
    full, shrunk = outcome(path, shrink=False), outcome(path, shrink=True)
    assert full == shrunk, (text, full, shrunk)  # the same finding codes, or none on both


@SLOW
@given(mlp_plans())
def test_a_generated_mlp_plan_errs_at_full_size_iff_it_errs_shrunk(tmp_path: Path,
                                                                   text: str) -> None:
    errs_alike(tmp_path, text)


@settings(SLOW, max_examples=5)
@given(llama_plans())
def test_a_generated_llama_plan_errs_at_full_size_iff_it_errs_shrunk(tmp_path: Path,
                                                                     text: str) -> None:
    errs_alike(tmp_path, text)
