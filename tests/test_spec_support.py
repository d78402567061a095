"""Helpers for the spec tests: small torch models and torch-vs-IR comparison."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainverify_dsl.ir import evaluate_graph, verify_graph


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (w(x).view(b, t, self.heads, -1).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v,
                                             is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, d))


class DenseMoE(nn.Module):
    """Top-k routing with static shapes: every expert runs on every token."""

    def __init__(self, dim: int, experts: int = 4, k: int = 2) -> None:
        super().__init__()
        self.k = k
        self.gate = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, dim, 2 * dim) * 0.2)
        self.w2 = nn.Parameter(torch.randn(experts, 2 * dim, dim) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        flat = x.reshape(-1, d)
        scores = self.gate(flat).softmax(-1)
        weights, chosen = torch.topk(scores, self.k, dim=-1)
        dense = torch.zeros_like(scores).scatter(-1, chosen, weights)
        hidden = F.silu(torch.einsum("nd,edf->enf", flat, self.w1))
        out = torch.einsum("enf,efd->end", hidden, self.w2)
        return torch.einsum("end,ne->nd", out, dense).view(b, t, d)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, moe: bool = False) -> None:
        super().__init__()
        self.norm1 = RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = RMSNorm(dim)
        self.ffn = DenseMoE(dim) if moe else nn.Sequential(
            nn.Linear(dim, 3 * dim), nn.GELU(approximate="tanh"), nn.Linear(3 * dim, dim))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.ffn(self.norm2(x))


class TinyLM(nn.Module):
    """Embedding, blocks (optionally MoE after the first), RMSNorm, head, cross-entropy."""

    def __init__(self, vocab: int = 32, dim: int = 16, heads: int = 2, layers: int = 3,
                 seq: int = 8, moe: bool = False, tied: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, moe and i > 0) for i in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.head.weight = self.emb.weight
        half = dim // heads // 2
        angles = torch.outer(torch.arange(seq, dtype=torch.float64),
                             10000.0 ** (-torch.arange(half, dtype=torch.float64) / half))
        angles = torch.cat([angles, angles], -1).to(torch.get_default_dtype())
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        cos, sin = self.cos[: tokens.shape[1]], self.sin[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 12)
        self.ln = nn.LayerNorm(12)
        self.fc2 = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.fc2(torch.tanh(self.ln(self.fc1(x)))), target)


def random_inputs(specs: Mapping, high: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    values = []
    for shape, dtype in specs.values():
        if dtype.is_floating_point:
            values.append(torch.randn(shape, generator=gen, dtype=torch.float64))
        else:
            values.append(torch.randint(0, high, shape, generator=gen))
    return values


def torch_reference(model: nn.Module, specs: Mapping, args: list[torch.Tensor]) -> dict:
    """Loss and every parameter gradient from torch (float64), by output name."""
    model.zero_grad()
    loss = model(*args)
    loss.backward()
    ref = {"loss": loss.detach().numpy()}
    ref.update({f"grad({n})": p.grad.numpy() for n, p in model.named_parameters()
                if p.grad is not None})
    return ref


def ir_inputs(model: nn.Module, specs: Mapping, args: list[torch.Tensor]) -> dict:
    values = {n: p.detach().numpy() for n, p in model.named_parameters()}
    values.update({n: b.numpy() for n, b in model.named_buffers()})
    values.update({n: a.numpy() for n, a in zip(specs, args, strict=True)})
    return values


def assert_matches(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray],
                   rtol: float = 1e-10) -> None:
    """Every reference output is produced and agrees to ``rtol`` (plus an absolute floor
    relative to the largest gradient, for entries that are zero up to torch's round-off)."""
    scale = max(float(np.max(np.abs(v))) for v in want.values())
    missing = sorted(set(want) - set(got))
    assert not missing, f"outputs missing from the IR: {missing}"
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=rtol, atol=1e-13 * scale,
                                   err_msg=name)


def check_spec(spec, values: Mapping, ref: Mapping) -> None:
    """The program and its inlined flat graph both reproduce ``ref``."""
    assert_matches(spec.evaluate(values), ref)
    flat = spec.flat()
    verify_graph(flat)
    assert_matches(evaluate_graph(flat, values), ref)
