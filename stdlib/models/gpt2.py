"""GPT-2 (pre-norm LayerNorm, learned positions, GELU-tanh MLP); the output head is untied
unless ``tie_embeddings`` (then it multiplies by the token embedding's weight, transposed, as
Hugging Face's ``gpt2`` does)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stdlib.models.common import (
    InputSpecs,
    causal_attention,
    lm_loss,
    load_config,
    merge_heads,
    split_heads,
    tie_output_to_embedding,
    token_input_specs,
)


@dataclasses.dataclass(frozen=True, slots=True)
class GPT2Config:
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    ffn_hidden: int
    max_seq_len: int
    norm_eps: float = 1e-5
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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


class Attention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.scale = 1.0 / math.sqrt(config.head_dim)
        self.wq = nn.Linear(config.hidden, config.hidden, bias=True)
        self.wk = nn.Linear(config.hidden, config.hidden, bias=True)
        self.wv = nn.Linear(config.hidden, config.hidden, bias=True)
        self.wo = nn.Linear(config.hidden, config.hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = split_heads(self.wq(x), self.n_heads)
        k = split_heads(self.wk(x), self.n_heads)
        v = split_heads(self.wv(x), self.n_heads)
        return self.wo(merge_heads(causal_attention(q, k, v, self.scale)))


class FeedForward(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.hidden, config.ffn_hidden, bias=True)
        self.w2 = nn.Linear(config.ffn_hidden, config.hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.hidden, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = nn.LayerNorm(config.hidden, eps=config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.pos_embed = nn.Embedding(config.max_seq_len, config.hidden)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.hidden, eps=config.norm_eps)
        self.output = nn.Linear(config.hidden, config.vocab_size, bias=False)
        if config.tie_embeddings:
            tie_output_to_embedding(self)

    @classmethod
    def from_config_name(cls, name: str, **overrides: Any) -> GPT2:
        return cls(load_config(GPT2Config, name, "GPT2", overrides))

    def input_specs(self, batch: int, seq: int) -> InputSpecs:
        return token_input_specs(batch, seq, self.config.max_seq_len)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.embed(tokens) + self.pos_embed(positions)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return lm_loss(self.logits(tokens), labels, self.config.label_smoothing,
                       self.config.ignore_index)

    def masked_inputs(self) -> dict[str, int]:
        """``labels`` equal to ``ignore_index`` are not counted (see ``RopeDecoderLM``)."""
        ignore = self.config.ignore_index
        return {} if ignore is None else {"labels": ignore}
