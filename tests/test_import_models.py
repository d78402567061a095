"""The importers' tables of the reference models (importers/models.py, read without torch) are
the real modules: the same module paths in the same order, kinds and parameters."""

from __future__ import annotations

import pytest

from trainverify_dsl.importers.models import (
    CONTAINER,
    EMBEDDING,
    LINEAR,
    MODELS,
    NORM,
    UnknownConfig,
    load_config,
)

TINY = {"Llama": "llama_tiny", "GPT2": "gpt2_tiny", "MLP": "mlp_tiny"}


def kind_of(module) -> str:  # noqa: ANN001 - a torch module
    from torch import nn

    if isinstance(module, nn.Linear):
        return LINEAR
    if isinstance(module, nn.Embedding):
        return EMBEDDING
    if isinstance(module, nn.LayerNorm) or type(module).__name__ == "RMSNorm":
        return NORM
    return CONTAINER


@pytest.mark.parametrize("cls", sorted(MODELS))
def test_the_table_is_the_module(cls: str) -> None:
    from trainverify_dsl.spec.load import load_model

    table = MODELS[cls]
    config = load_config(TINY[cls])
    assert config.model is table and config.model.spec == f"{table.file}:{cls}"
    model = load_model(table.spec, TINY[cls])
    modules = dict(model.named_modules())
    expected_top = [(m.path, m.kind, m.params) for m in table.before + table.after]
    actual_top = [(name, kind_of(mod), tuple(n for n, _ in mod.named_parameters()))
                  for name, mod in modules.items()
                  if name and "." not in name and name != table.layer_list]
    assert actual_top == expected_top
    if table.layer_list is None:
        return
    layer = modules[f"{table.layer_list}.0"]
    actual_layer = [(name, kind_of(mod), tuple(n for n, _ in mod.named_parameters(
        recurse=False))) for name, mod in layer.named_modules()]
    assert actual_layer == [(m.path, m.kind, m.params) for m in table.layer]
    assert config.n_layers == len(modules[table.layer_list])


def test_unknown_and_unmapped_configs_are_usage_errors() -> None:
    with pytest.raises(UnknownConfig, match="did you mean 'llama_tiny'"):
        load_config("llama_tiyn")
    with pytest.raises(UnknownConfig, match="is a DeepSeekV3 model; the importers know"):
        load_config("deepseek_tiny")
