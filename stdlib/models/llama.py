"""Llama 3 (RMSNorm, RoPE, grouped-query attention, SwiGLU, no biases); the output head is
untied unless ``tie_embeddings`` (Llama 3.2 1B and 3B tie it to the token embedding)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

from stdlib.models.common import (
    RMSNorm,
    RopeDecoderLM,
    RopeScaling,
    SwiGLU,
    apply_rope,
    causal_attention,
    load_config,
    merge_heads,
    repeat_kv,
    rope_tables,
    split_heads,
    tie_output_to_embedding,
)


@dataclasses.dataclass(frozen=True, slots=True)
class LlamaConfig:
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    max_seq_len: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    rope_scaling_factor: float | None = None  # Llama 3.1 long-context scaling when set
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_seq_len: int = 8192
    #: the loss's label smoothing (torch's ``cross_entropy(label_smoothing=...)``)
    label_smoothing: float = 0.0
    #: labels equal to it are not counted in the loss (torch's ``ignore_index``; Hugging
    #: Face's ``-100``); ``None``: every position counts
    ignore_index: int | None = None
    #: the output head uses the token embedding's weight (one parameter, ``embed.weight``)
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.hidden % self.n_heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not divisible by n_kv_heads")
        if self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def rope_scaling(self) -> RopeScaling | None:
        if self.rope_scaling_factor is None:
            return None
        return RopeScaling(
            self.rope_scaling_factor,
            self.rope_low_freq_factor,
            self.rope_high_freq_factor,
            self.rope_original_max_seq_len,
        )


class Attention(nn.Module):
    """Grouped-query attention: n_kv_heads key/value heads shared by n_heads query heads."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.scale = 1.0 / math.sqrt(config.head_dim)
        head_dim = config.head_dim
        self.wq = nn.Linear(config.hidden, config.n_heads * head_dim, bias=False)
        self.wk = nn.Linear(config.hidden, config.n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(config.hidden, config.n_kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * head_dim, config.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        n_rep = self.n_heads // self.n_kv_heads
        q = apply_rope(split_heads(self.wq(x), self.n_heads), cos, sin)
        k = apply_rope(split_heads(self.wk(x), self.n_kv_heads), cos, sin)
        v = split_heads(self.wv(x), self.n_kv_heads)
        out = causal_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), self.scale)
        return self.wo(merge_heads(out))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.hidden, config.norm_eps)
        self.feed_forward = SwiGLU(config.hidden, config.ffn_hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(RopeDecoderLM):
    """Token embedding, `n_layers` pre-norm blocks, final RMSNorm, output projection (tied to
    the token embedding when the config says ``tie_embeddings``).

    The RoPE tables `rope_cos`/`rope_sin` `[max_seq_len, head_dim // 2]` are non-persistent
    buffers (not parameters, not in the state dict); `forward` uses their first `seq` rows.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.hidden, config.norm_eps)
        self.output = nn.Linear(config.hidden, config.vocab_size, bias=False)
        if config.tie_embeddings:
            tie_output_to_embedding(self)
        cos, sin = rope_tables(
            config.head_dim, config.max_seq_len, config.rope_theta, config.rope_scaling
        )
        self.register_rope(cos, sin)

    @classmethod
    def from_config_name(cls, name: str, **overrides: Any) -> Llama:
        return cls(load_config(LlamaConfig, name, "Llama", overrides))
