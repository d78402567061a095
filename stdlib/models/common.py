"""Shared building blocks of the reference model specs.

Everything here is written for tracing with AOTAutograd on fake or meta tensors: static shapes,
no data-dependent Python control flow, no `.item()`, no in-place ops on parameters and no fused
attention kernels. Configurations live in `configs.json` next to this file (the single source of
truth, also read without torch by the linter).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

CONFIGS_PATH = Path(__file__).with_name("configs.json")

InputSpecs = dict[str, tuple[tuple[int, ...], torch.dtype]]
ConfigT = TypeVar("ConfigT")

# Keys of a configs.json entry that describe where the model lives, not its dimensions.
LOCATION_KEYS = ("model", "file")


def read_configs() -> dict[str, dict[str, Any]]:
    """All configurations, keyed by name, exactly as stored in configs.json."""
    return json.loads(CONFIGS_PATH.read_text())


def load_config(
    config_cls: type[ConfigT], name: str, model: str, overrides: dict[str, Any]
) -> ConfigT:
    """Build `config_cls` from the configs.json entry `name`, with `overrides` applied."""
    configs = read_configs()
    if name not in configs or configs[name].get("model") != model:
        known = sorted(key for key, entry in configs.items() if entry.get("model") == model)
        raise KeyError(f"unknown {model} config {name!r}; known: {', '.join(known)}")
    values = {key: value for key, value in configs[name].items() if key not in LOCATION_KEYS}
    fields = {field.name: field for field in dataclasses.fields(config_cls)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise TypeError(f"{config_cls.__name__} has no field(s) {', '.join(unknown)}")
    merged = {key: as_field(key, fields[key].type, value)
              for key, value in {**values, **overrides}.items()}
    smoothing = merged.get("label_smoothing")
    if smoothing is not None and not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"label_smoothing must lie between 0 and 1 (torch's cross_entropy "
                         f"rejects anything else), not {smoothing}")
    return config_cls(**merged)


def as_field(key: str, kind: Any, value: Any) -> Any:
    """``value`` as the config field ``key`` of type ``kind`` (its annotation: ``bool``,
    ``int``, ``float``, optionally ``| None``), or a ValueError naming what to write: a
    spec-line setting (``spec ... ignore_index -100``) is checked before the model runs on
    it."""
    kind = str(getattr(kind, "__name__", kind)).replace(" ", "")
    if value is None and kind.endswith("|None"):
        return None
    base = kind.removesuffix("|None")
    if base == "bool":
        return as_flag(key, value)
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if base == "int":
        if is_number and float(value).is_integer():
            return int(value)
        raise ValueError(f"{key} is a whole number: write e.g. `{key} 8`, not {value!r}")
    if base == "float":
        if is_number:
            return float(value)
        raise ValueError(f"{key} is a number: write e.g. `{key} 0.1`, not {value!r}")
    return value


def as_flag(key: str, value: Any) -> bool:
    """A yes/no config field: a JSON ``true``/``false``, or the plan words ``true``/``false``
    of a spec-line setting (``spec ... tie_embeddings true``). Anything else is an error:
    a number or another word would be a guess."""
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return value == "true"
    raise ValueError(f"{key} is a yes/no setting: write `{key} true` or `{key} false`, "
                     f"not {value!r}")


def count_parameters(module: nn.Module) -> int:
    """Number of trainable scalars (works on the meta device)."""
    return sum(param.numel() for param in module.parameters())


def token_input_specs(batch: int, seq: int, max_seq_len: int) -> InputSpecs:
    """`tokens` and `labels`, both `[batch, seq]` int64, for the language models."""
    if seq > max_seq_len:
        raise ValueError(f"seq {seq} exceeds the model's max_seq_len {max_seq_len}")
    shape = (batch, seq)
    return {"tokens": (shape, torch.int64), "labels": (shape, torch.int64)}


# --- layers -----------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean_square = (x * x).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(mean_square + self.eps) * self.weight


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x), no biases."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, inter, bias=False)
        self.w2 = nn.Linear(inter, hidden, bias=False)
        self.w3 = nn.Linear(hidden, inter, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def tie_output_to_embedding(model: nn.Module) -> None:
    """Tie ``model.output`` (an ``nn.Linear(hidden, vocab, bias=False)``) to ``model.embed``
    (an ``nn.Embedding(vocab, hidden)``): the head computes ``h @ embed.weight.T``, and the
    model has one parameter, ``embed.weight`` (``named_parameters`` reports a shared tensor
    under its first name), whose gradient is the sum of both uses. The head stays a module of
    its own, so a plan still places ``output`` on a pipeline stage and names ``output.in``."""
    model.output.weight = model.embed.weight


# --- rotary position embedding ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama 3.1 frequency scaling (Meta's `apply_scaling`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_seq_len: int

    def apply(self, freq: float) -> float:
        wavelen = 2 * math.pi / freq
        if wavelen < self.original_max_seq_len / self.high_freq_factor:
            return freq
        if wavelen > self.original_max_seq_len / self.low_freq_factor:
            return freq / self.factor
        smooth = (self.original_max_seq_len / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        return (1 - smooth) * freq / self.factor + smooth * freq


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> list[float]:
    """theta^(-2i/head_dim) for i < head_dim/2, optionally Llama-3.1 scaled."""
    freqs = [theta ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    return freqs if scaling is None else [scaling.apply(freq) for freq in freqs]


def rope_tables(
    head_dim: int, max_seq_len: int, theta: float, scaling: RopeScaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency, each `[max_seq_len, head_dim // 2]`.

    Computed in float64 and returned in the default dtype (on the default device, so meta
    construction allocates nothing).
    """
    freqs = torch.tensor(rope_frequencies(head_dim, theta, scaling), dtype=torch.float64)
    positions = torch.arange(max_seq_len, dtype=torch.float64)
    angles = torch.outer(positions, freqs)
    dtype = torch.get_default_dtype()
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + d/2]) of `x [..., seq, d]` by the angles of `cos/sin [seq, d/2]`.

    The half-split (GPT-NeoX / Hugging Face) pairing; Meta's interleaved pairing is the same
    function after a fixed permutation of the rows of the q/k projections.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


# --- attention and loss -------------------------------------------------------------------------


def causal_mask(seq: int, device: torch.device) -> torch.Tensor:
    """`[seq, seq]` bool, True where query position i may attend to key position j (j <= i)."""
    return torch.ones(seq, seq, dtype=torch.bool, device=device).tril()


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax(q k^T * scale + causal mask) v for `q, k [b, h, s, dqk]`, `v [b, h, s, dv]`."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    mask = causal_mask(q.shape[-2], q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """`[b, kv, s, d]` -> `[b, kv * n_rep, s, d]`; query head i reads kv head i // n_rep."""
    if n_rep == 1:
        return x
    batch, kv_heads, seq, dim = x.shape
    expanded = x[:, :, None].expand(batch, kv_heads, n_rep, seq, dim)
    return expanded.reshape(batch, kv_heads * n_rep, seq, dim)


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """`[b, s, n_heads * d]` -> `[b, n_heads, s, d]`."""
    batch, seq, width = x.shape
    return x.view(batch, seq, n_heads, width // n_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """`[b, h, s, d]` -> `[b, s, h * d]`."""
    batch, heads, seq, dim = x.shape
    return x.transpose(1, 2).reshape(batch, seq, heads * dim)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0,
            ignore_index: int | None = None) -> torch.Tensor:
    """Next-token cross-entropy, torch's ``F.cross_entropy(..., reduction="mean")``: with
    ``label_smoothing`` ε each position's loss is ``(1 - ε) * nll + ε * mean over the
    vocabulary of -log p``. Without ``ignore_index`` the loss is the mean over all positions;
    with it, positions whose label is ``ignore_index`` are not counted and the loss is the sum
    over the counted positions divided by their number (the token count)."""
    log_probs = torch.log_softmax(logits, dim=-1)
    if ignore_index is None:
        picked = torch.gather(log_probs, -1, labels.unsqueeze(-1)).squeeze(-1)
        if not label_smoothing:
            return -picked.mean()
        smooth = -log_probs.mean(dim=-1)
        return ((1.0 - label_smoothing) * -picked + label_smoothing * smooth).mean()
    counted = labels != ignore_index
    safe = torch.where(counted, labels, torch.zeros_like(labels))
    per_token = -torch.gather(log_probs, -1, safe.unsqueeze(-1)).squeeze(-1)
    if label_smoothing:
        per_token = (1.0 - label_smoothing) * per_token \
            + label_smoothing * -log_probs.mean(dim=-1)
    per_token = torch.where(counted, per_token, torch.zeros_like(per_token))
    return per_token.sum() / counted.sum()


class RopeDecoderLM(nn.Module):
    """The trunk shared by the RoPE decoder LMs (Llama, DeepSeek-V3): ``embed`` → every block
    of ``layers`` called as ``layer(h, cos, sin)`` → ``norm`` → ``output``; the loss is
    ``lm_loss``. Subclasses build those modules and call ``register_rope`` once."""

    config: Any

    def register_rope(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """RoPE tables as non-persistent buffers: inputs of the traced step, not parameters."""
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def input_specs(self, batch: int, seq: int) -> InputSpecs:
        return token_input_specs(batch, seq, self.config.max_seq_len)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return lm_loss(self.logits(tokens), labels, self.config.label_smoothing,
                       self.config.ignore_index)

    def masked_inputs(self) -> dict[str, int]:
        """Inputs some of whose entries carry a value that masks them (``labels`` equal to the
        config's ``ignore_index``): random inputs mask some positions there."""
        ignore = self.config.ignore_index
        return {} if ignore is None else {"labels": ignore}
