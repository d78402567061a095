"""The stdlib reference models (tiny configs) traced to IR reproduce torch's loss and every
parameter gradient in float64, flat and with block reuse; real configs trace on fake tensors
with the published parameter counts."""

from __future__ import annotations

import pytest
import torch
from test_spec_support import check_spec, ir_inputs, random_inputs, torch_reference

from trainverify_dsl.spec.errors import SpecError
from trainverify_dsl.spec.load import load_model
from trainverify_dsl.spec.trace import trace_training_step

TINY = ["mlp_tiny", "gpt2_tiny", "llama_tiny", "deepseek_tiny"]


def real_model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return load_model(name, fake=False)
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse", "flat"])
@pytest.mark.parametrize("name", TINY)
def test_tiny_config_matches_torch(name: str, reuse: bool) -> None:
    model = real_model(name)
    specs = model.input_specs(2, 8)
    high = 3 if name.startswith("mlp") else 16
    args = random_inputs(specs, high, seed=3)
    spec = trace_training_step(model, specs, reuse=reuse)
    check_spec(spec, ir_inputs(model, specs, args), torch_reference(model, specs, args))
    if reuse and not name.startswith("mlp"):
        assert spec.block_list == "layers"


def test_deepseek_tiny_has_dense_and_moe_block_graphs() -> None:
    model = load_model("deepseek_tiny")
    spec = trace_training_step(model, model.input_specs(1, 4))
    assert len(spec.groups) == 2
    assert sum(len(g.layers) for g in spec.groups) == len(model.layers)


@pytest.mark.parametrize(("name", "params"), [
    ("llama3_405b", 405_853_388_800),
    ("deepseek_v3_671b", 671_026_404_352),
])
def test_real_config_traces_with_block_reuse(name: str, params: int) -> None:
    model = load_model(name)
    spec = trace_training_step(model, model.input_specs(1, 8))
    assert spec.param_count == params == sum(p.numel() for p in model.parameters())
    assert spec.program.unique_node_count < 1500
    assert sum(len(g.layers) for g in spec.groups) == len(model.layers)


@pytest.mark.parametrize(("ref", "config", "code"), [
    ("lama_tiny", None, "TVP301"),
    ("stdlib/models/nope.py:Llama", None, "TVP301"),
    ("stdlib/models/llama.py:Lama", "llama_tiny", "TVP301"),
    ("stdlib/models/llama.py:Llama", "llama_tinyy", "TVP302"),
])
def test_bad_references_are_diagnostics(ref: str, config: str | None, code: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_model(ref, config)
    assert caught.value.diagnostics[0].code.id == code


def test_bad_override_is_a_diagnostic() -> None:
    with pytest.raises(SpecError) as caught:
        load_model("llama_tiny", n_heads=5)
    assert caught.value.diagnostics[0].code.id == "TVP303"
