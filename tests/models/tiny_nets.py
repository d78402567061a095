"""Tiny deterministic-shape torch models for end-to-end tests of the lowering rules.

Every class is constructed without a config (keyword sizes with defaults, overridable from a
plan's spec line), has ``input_specs(batch, seq)`` in ``forward`` argument order and a
``forward`` returning a scalar mean loss. Submodules are small so that plans can name their
boundaries (``fc1.out``, ``pool.out``, ``attn.wo.out``...).
"""

from __future__ import annotations

import math

import torch
from torch import nn

InputSpecs = dict[str, tuple[tuple[int, ...], torch.dtype]]


def _float() -> torch.dtype:
    return torch.get_default_dtype()


class TwoLinear(nn.Module):
    """``mean((fc2(relu(fc1(x))) - target)^2)`` on ``x [batch, seq, d]`` (bias-free linears)."""

    def __init__(self, d: int = 4, hidden: int = 8) -> None:
        super().__init__()
        self.d, self.hidden = d, hidden
        self.fc1 = nn.Linear(d, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, d, bias=False)

    def input_specs(self, batch: int, seq: int) -> InputSpecs:
        return {"x": ((batch, seq, self.d), _float()),
                "target": ((batch, seq, self.d), _float())}

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        error = self.fc2(torch.relu(self.fc1(x))) - target
        return (error * error).mean()


class SumPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(-1)


class MeanPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(-1)


class PoolNet(nn.Module):
    """``proj`` (Linear d -> hidden), then a reduction over the hidden units (``pool``: sum or
    mean over the last dimension), then ``mean((tanh(pool) - target)^2)``. With ``proj``
    column parallel the reduced dimension is split, so ``pool.out`` is a partial sum (or mean)
    that must be all-reduced before the nonlinearity."""

    pool_class: type[nn.Module] = SumPool

    def __init__(self, d: int = 4, hidden: int = 8) -> None:
        super().__init__()
        self.d = d
        self.proj = nn.Linear(d, hidden, bias=False)
        self.pool = self.pool_class()

    def input_specs(self, batch: int, seq: int) -> InputSpecs:
        return {"x": ((batch, seq, self.d), _float()),
                "target": ((batch, seq), _float())}

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        error = torch.tanh(self.pool(self.proj(x))) - target
        return (error * error).mean()


class MeanPoolNet(PoolNet):
    """``PoolNet`` with a mean over the hidden units."""

    pool_class = MeanPool


class Attention(nn.Module):
    """Multi-head self-attention written out (views to heads, matmul, softmax over keys)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        b, s, _ = t.shape
        return t.view(b, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self._split(self.wq(x)), self._split(self.wk(x)), self._split(self.wv(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.wo(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class AttnNet(nn.Module):
    """``mean((attn(x) - target)^2)``: heads reshape a split hidden dimension, ``q @ k^T``
    merges batch and heads into one batched-product dimension, softmax runs along the keys."""

    def __init__(self, d: int = 8, heads: int = 4) -> None:
        super().__init__()
        self.d = d
        self.attn = Attention(d, heads)

    def input_specs(self, batch: int, seq: int) -> InputSpecs:
        return {"x": ((batch, seq, self.d), _float()),
                "target": ((batch, seq, self.d), _float())}

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        error = self.attn(x) - target
        return (error * error).mean()


class NormNet(nn.Module):
    """``mean((fc(layer_norm(x)) - target)^2)`` with an affine ``nn.LayerNorm``."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.d = d
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d, bias=True)

    def input_specs(self, batch: int, seq: int) -> InputSpecs:
        return {"x": ((batch, seq, self.d), _float()),
                "target": ((batch, seq, self.d), _float())}

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        error = self.fc(self.norm(x)) - target
        return (error * error).mean()


class SoftmaxNet(nn.Module):
    """``mean((softmax(fc(x), dim=-1) - target)^2)``."""

    def __init__(self, d: int = 4, classes: int = 6) -> None:
        super().__init__()
        self.d, self.classes = d, classes
        self.fc = nn.Linear(d, classes, bias=False)

    def input_specs(self, batch: int, seq: int) -> InputSpecs:
        return {"x": ((batch, seq, self.d), _float()),
                "target": ((batch, seq, self.classes), _float())}

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        error = torch.softmax(self.fc(x), dim=-1) - target
        return (error * error).mean()


class LayerNormWrittenOut(nn.Module):
    """Affine layer norm over the last dimension, written as mean / variance / rsqrt."""

    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(-1, keepdim=True)
        centred = x - mu
        var = (centred * centred).mean(-1, keepdim=True)
        return centred * torch.rsqrt(var + self.eps) * self.weight + self.bias


class ManualNormNet(NormNet):
    """``NormNet`` with the layer norm written out (no ``native_layer_norm`` in the graph)."""

    def __init__(self, d: int = 8) -> None:
        super().__init__(d)
        self.norm = LayerNormWrittenOut(d)


class NormAfterRowNet(nn.Module):
    """``fc1`` -> relu -> ``fc2`` -> ``nn.LayerNorm`` -> MSE: a layer norm on the complete,
    replicated output of a row-parallel linear."""

    def __init__(self, d: int = 4, hidden: int = 8) -> None:
        super().__init__()
        self.d = d
        self.fc1 = nn.Linear(d, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, d, bias=False)
        self.norm = nn.LayerNorm(d)

    def input_specs(self, batch: int, seq: int) -> InputSpecs:
        return {"x": ((batch, seq, self.d), _float()),
                "target": ((batch, seq, self.d), _float())}

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        error = self.norm(self.fc2(torch.relu(self.fc1(x)))) - target
        return (error * error).mean()


class RenamedInputs(nn.Module):
    """``TwoLinear`` whose inputs are named ``inp`` and ``goal`` (no ``x``, no ``tokens``):
    nothing may depend on an input's name. Both fields, the batch and the sequence are
    independent sizes (``WIDTHS``, so shrinking may change them)."""

    WIDTHS = ("d", "hidden", "batch", "seq")

    def __init__(self, d: int = 4, hidden: int = 8) -> None:
        super().__init__()
        self.d = d
        self.fc1 = nn.Linear(d, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, d, bias=False)

    def input_specs(self, batch: int, seq: int) -> InputSpecs:
        return {"inp": ((batch, seq, self.d), _float()),
                "goal": ((batch, seq, self.d), _float())}

    def forward(self, inp: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
        error = self.fc2(torch.relu(self.fc1(inp))) - goal
        return (error * error).mean()


class LearnedNormaliser(TwoLinear):
    """``TwoLinear`` whose loss is a sum over a learned "count" (``sum(error^2) / sum(w^2)``):
    a normaliser that depends on a parameter, which no step-wide token count can replace."""

    def __init__(self, d: int = 4, hidden: int = 8) -> None:
        super().__init__(d, hidden)
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        error = self.fc2(torch.relu(self.fc1(x))) - target
        return (error * error).sum() / (self.w * self.w).sum()
