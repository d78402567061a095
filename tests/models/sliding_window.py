"""A one-block language model whose causal attention has a sliding window: query ``i`` sees
keys ``i - window + 1 .. i`` (Mistral's local attention). At a sequence no longer than the
window it is plain causal attention, so nothing may shrink ``seq`` for this model
(tests/test_user_model_sizes.py). Its attention has the shape `context-parallel-attention`
applies to (the helpers ``apply_rope``, ``split_heads``, ``repeat_kv``, ``merge_heads``)."""

from __future__ import annotations

import math

import torch
from torch import nn


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), -1)


def split_heads(x: torch.Tensor, n: int) -> torch.Tensor:
    b, s, w = x.shape
    return x.view(b, s, n, w // n).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, h * d)


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.repeat_interleave(n, dim=1) if n > 1 else x


class WindowAttention(nn.Module):
    def __init__(self, d: int, n_heads: int, window: int) -> None:
        super().__init__()
        self.n_heads, self.window = n_heads, window
        self.scale = 1.0 / math.sqrt(d // n_heads)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = apply_rope(split_heads(self.wq(x), self.n_heads), cos, sin)
        k = apply_rope(split_heads(self.wk(x), self.n_heads), cos, sin)
        v = split_heads(self.wv(x), self.n_heads)
        s = x.shape[1]
        ones = torch.ones(s, s, dtype=torch.bool)
        visible = ones.tril() & ~ones.tril(-self.window)
        scores = (q @ k.transpose(-2, -1) * self.scale).masked_fill(~visible, float("-inf"))
        return self.wo(merge_heads(torch.softmax(scores, dim=-1) @ v))


class SlidingWindowLM(nn.Module):
    def __init__(self, vocab: int = 16, d: int = 8, n_heads: int = 2, window: int = 2,
                 max_seq: int = 120) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.attention = WindowAttention(d, n_heads, window)
        self.out = nn.Linear(d, vocab, bias=False)
        half = d // n_heads // 2
        freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float64) / half))
        angles = torch.outer(torch.arange(max_seq, dtype=torch.float64), freqs)
        self.register_buffer("rope_cos", angles.cos().to(torch.get_default_dtype()),
                             persistent=False)
        self.register_buffer("rope_sin", angles.sin().to(torch.get_default_dtype()),
                             persistent=False)

    def input_specs(self, batch: int, seq: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"inp": ((batch, seq), torch.int64), "tgt": ((batch, seq), torch.int64)}

    def forward(self, inp: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        s = inp.shape[1]
        h = self.tok(inp)
        h = h + self.attention(h, self.rope_cos[:s], self.rope_sin[:s])
        logp = torch.log_softmax(self.out(h), dim=-1)
        return -logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1).mean()
