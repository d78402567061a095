"""What the importers know about the reference models, without importing them (no torch).

Each ``ReferenceModel`` lists the modules of one class in ``stdlib/models/`` in forward order:
those before the layer list (``embed``), the modules of one layer relative to it
(``attention.wq``), and those after (``norm``, ``output``), each with its kind and parameters.
tests/test_import_models.py checks every table against the real ``nn.Module`` (parameter
names and module kinds), so a change to a model file that the tables miss fails a test.

The layer count and sizes come from ``stdlib/models/configs.json``, read as JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from trainverify_dsl.resources import RESOURCES

#: Module kinds, by what the importers can do with them.
LINEAR = "linear"
EMBEDDING = "embedding"
NORM = "norm"
CONTAINER = "container"


@dataclass(frozen=True, slots=True)
class Module:
    #: path below the model (``embed``) or below one layer (``attention.wq``; ``""`` is the
    #: layer itself)
    path: str
    kind: str
    params: tuple[str, ...] = ()

    @property
    def has_bias(self) -> bool:
        return "bias" in self.params


@dataclass(frozen=True, slots=True)
class ReferenceModel:
    cls: str
    file: str
    #: model inputs, batch first (``split NAME [dp, -]``)
    inputs: tuple[str, ...]
    before: tuple[Module, ...]
    layer: tuple[Module, ...]
    after: tuple[Module, ...]
    #: the module list holding the repeated layers (``None``: no layers)
    layer_list: str | None = "layers"
    #: rank of the activations between modules: [batch, seq, features] or [batch, features]
    activation_rank: int = 3
    #: the output head whose logits feed the loss (vocab-parallel cross-entropy)
    head: str | None = "output"

    @property
    def spec(self) -> str:
        return f"{self.file}:{self.cls}"

    @property
    def feature_dim(self) -> int:
        return self.activation_rank - 1

    @property
    def seq_dim(self) -> int:
        return 1

    def top(self, path: str) -> Module | None:
        return next((m for m in self.before + self.after if m.path == path), None)

    def in_layer(self, path: str) -> Module | None:
        return next((m for m in self.layer if m.path == path), None)


@dataclass(frozen=True, slots=True)
class ReferenceConfig:
    name: str
    model: ReferenceModel
    n_layers: int
    sizes: dict[str, object] = field(default_factory=dict)


_W = ("weight",)
_WB = ("weight", "bias")

LLAMA = ReferenceModel(
    "Llama", "stdlib/models/llama.py", ("tokens", "labels"),
    before=(Module("embed", EMBEDDING, _W),),
    layer=(Module("", CONTAINER),
           Module("attention_norm", NORM, _W),
           Module("attention", CONTAINER),
           Module("attention.wq", LINEAR, _W),
           Module("attention.wk", LINEAR, _W),
           Module("attention.wv", LINEAR, _W),
           Module("attention.wo", LINEAR, _W),
           Module("ffn_norm", NORM, _W),
           Module("feed_forward", CONTAINER),
           Module("feed_forward.w1", LINEAR, _W),
           Module("feed_forward.w2", LINEAR, _W),
           Module("feed_forward.w3", LINEAR, _W)),
    after=(Module("norm", NORM, _W), Module("output", LINEAR, _W)),
)

GPT2 = ReferenceModel(
    "GPT2", "stdlib/models/gpt2.py", ("tokens", "labels"),
    before=(Module("embed", EMBEDDING, _W), Module("pos_embed", EMBEDDING, _W)),
    layer=(Module("", CONTAINER),
           Module("attention_norm", NORM, _WB),
           Module("attention", CONTAINER),
           Module("attention.wq", LINEAR, _WB),
           Module("attention.wk", LINEAR, _WB),
           Module("attention.wv", LINEAR, _WB),
           Module("attention.wo", LINEAR, _WB),
           Module("ffn_norm", NORM, _WB),
           Module("feed_forward", CONTAINER),
           Module("feed_forward.w1", LINEAR, _WB),
           Module("feed_forward.w2", LINEAR, _WB)),
    after=(Module("norm", NORM, _WB), Module("output", LINEAR, _W)),
)

MLP = ReferenceModel(
    "MLP", "stdlib/models/mlp.py", ("x", "target"),
    before=(Module("fc1", LINEAR, _WB), Module("fc2", LINEAR, _WB)),
    layer=(), after=(), layer_list=None, activation_rank=2, head=None,
)

MODELS: dict[str, ReferenceModel] = {m.cls: m for m in (LLAMA, GPT2, MLP)}


class UnknownConfig(ValueError):
    """A ``--config`` the importers cannot use; the message says why (a usage error)."""


def load_config(name: str) -> ReferenceConfig:
    """The config ``name`` of configs.json, with its model's table."""
    import difflib

    configs = json.loads(RESOURCES.configs_file.read_text(encoding="utf-8"))
    entry = configs.get(name)
    if entry is None:
        close = difflib.get_close_matches(name, sorted(configs), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UnknownConfig(f"unknown config '{name}'{hint} (see stdlib/models/configs.json)")
    model = MODELS.get(entry.get("model", ""))
    if model is None or model.file != entry.get("file"):
        known = ", ".join(sorted(MODELS))
        raise UnknownConfig(f"config '{name}' is a {entry.get('model')} model; the importers "
                            f"know the reference models {known}")
    sizes = {k: v for k, v in entry.items() if k not in ("model", "file")}
    return ReferenceConfig(name, model, int(entry.get("n_layers", 0)), sizes)
