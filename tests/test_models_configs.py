"""configs.json is the single source of truth: schema, loading, overrides and input specs."""

import importlib
import inspect
import json
from pathlib import Path

import pytest
import torch

from stdlib.models.common import CONFIGS_PATH, read_configs

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = json.loads(CONFIGS_PATH.read_text())


def model_class(entry):
    module_name = entry["file"].removesuffix(".py").replace("/", ".")
    return getattr(importlib.import_module(module_name), entry["model"])


def test_every_entry_names_a_model_file_and_layer_count():
    assert len(CONFIGS) == 15
    for name, entry in CONFIGS.items():
        assert {"model", "file", "n_layers"} <= set(entry), name
        assert (ROOT / entry["file"]).is_file(), name
        # The linter finds the class by reading the file, without importing torch.
        assert f"class {entry['model']}(" in (ROOT / entry["file"]).read_text(), name


def test_read_configs_matches_the_file():
    assert read_configs() == CONFIGS


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_loads_with_every_field_and_layer_count(name):
    entry = CONFIGS[name]
    cls = model_class(entry)
    with torch.device("meta"):
        model = cls.from_config_name(name)
    for key, value in entry.items():
        if key not in ("model", "file"):
            assert getattr(model.config, key) == value, key
    assert len(getattr(model, "layers", ())) == entry["n_layers"]


def test_overrides_apply_and_unknown_names_are_rejected():
    from stdlib.models.llama import Llama

    with torch.device("meta"):
        model = Llama.from_config_name("llama3_8b", n_layers=1)
    assert len(model.layers) == 1 and model.config.hidden == 4096
    with pytest.raises(TypeError, match="no field"):
        Llama.from_config_name("llama_tiny", hiden=8)
    with pytest.raises(KeyError, match="known: llama3_2_1b, llama3_2_3b, llama3_405b"):
        Llama.from_config_name("gpt2_small")


def test_invalid_configs_are_rejected():
    from stdlib.models.deepseek import DeepSeekV3
    from stdlib.models.llama import Llama
    from stdlib.models.mlp import MLP

    with pytest.raises(ValueError, match="n_kv_heads"):
        Llama.from_config_name("llama_tiny", n_kv_heads=3)
    with pytest.raises(ValueError, match="n_group"):
        DeepSeekV3.from_config_name("deepseek_tiny", n_group=3)
    with pytest.raises(ValueError, match="activation"):
        MLP.from_config_name("mlp_tiny", activation="tanh")


@pytest.mark.parametrize("name", ["mlp_tiny", "gpt2_tiny", "llama_tiny", "deepseek_tiny"])
def test_input_specs_follow_forward_argument_order(name):
    model = model_class(CONFIGS[name]).from_config_name(name)
    specs = model.input_specs(3, 5)
    assert list(specs) == list(inspect.signature(model.forward).parameters)
    args = [torch.zeros(shape, dtype=dtype) for shape, dtype in specs.values()]
    assert model(*args).shape == ()


def test_input_specs_shapes():
    from stdlib.models.llama import Llama
    from stdlib.models.mlp import MLP

    with torch.device("meta"):
        llama = Llama.from_config_name("llama3_8b")
    assert llama.input_specs(2, 8192) == {
        "tokens": ((2, 8192), torch.int64),
        "labels": ((2, 8192), torch.int64),
    }
    with pytest.raises(ValueError, match="max_seq_len"):
        llama.input_specs(1, 8193)
    mlp = MLP.from_config_name("mlp_tiny")
    assert mlp.input_specs(6, 999) == {
        "x": ((6, 4), torch.get_default_dtype()),
        "target": ((6, 3), torch.get_default_dtype()),
    }
