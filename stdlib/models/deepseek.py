"""DeepSeek-V3: multi-head latent attention (MLA) and a mixture of experts (MoE).

The MoE is written with static shapes so that it traces: the routed experts are stacked weights
applied to every token with a batched matmul (a grouped GEMM) and combined with the top-k-masked,
normalised router weights. That is the same function as sparse dispatch (each token through its
top-k experts only), one op per projection instead of one per expert; expert parallelism becomes
a split of the expert dimension.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stdlib.models.common import (
    RMSNorm,
    RopeDecoderLM,
    SwiGLU,
    apply_rope,
    causal_attention,
    load_config,
    merge_heads,
    rope_tables,
    split_heads,
)


@dataclasses.dataclass(frozen=True, slots=True)
class DeepSeekConfig:
    vocab_size: int
    hidden: int
    n_layers: int
    n_dense_layers: int  # the first n_dense_layers use a dense SwiGLU, the rest an MoE
    dense_ffn: int
    n_heads: int
    q_lora_rank: int | None  # None: direct query projection `wq`
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    moe_inter: int
    n_routed_experts: int
    n_activated_experts: int
    n_shared_experts: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    max_seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    #: the loss's label smoothing (torch's ``cross_entropy(label_smoothing=...)``)
    label_smoothing: float = 0.0
    #: labels equal to it are not counted in the loss (torch's ``ignore_index``; Hugging
    #: Face's ``-100``); ``None``: every position counts
    ignore_index: int | None = None

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError(f"invalid DeepSeekConfig: {'; '.join(problems)}")

    def problems(self) -> list[str]:
        found = []
        if self.n_routed_experts % self.n_group:
            found.append("n_routed_experts is not divisible by n_group")
        elif self.n_group > 1 and self.n_routed_experts // self.n_group < 2:
            found.append("group scores need at least 2 experts per group")
        if not 1 <= self.topk_group <= self.n_group:
            found.append("topk_group must be in [1, n_group]")
        per_group = self.n_routed_experts // max(self.n_group, 1)
        if not 1 <= self.n_activated_experts <= self.topk_group * per_group:
            found.append("n_activated_experts must be in [1, topk_group * experts per group]")
        if self.n_shared_experts < 1 or self.qk_rope_head_dim % 2:
            found.append("need n_shared_experts >= 1 and an even qk_rope_head_dim")
        return found

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class MLA(nn.Module):
    """Multi-head latent attention.

    Queries: `wq` or the low-rank `wq_a -> q_norm -> wq_b`, each head split into a `nope` part and
    a rotary part. Keys/values: `wkv_a` compresses to a latent of `kv_lora_rank` plus one rotary key
    shared by all heads; `kv_norm -> wkv_b` expands the latent to per-head `k_nope` and `v`.
    """

    def __init__(self, config: DeepSeekConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        q_width = c.n_heads * c.qk_head_dim
        if c.q_lora_rank is None:
            self.wq = nn.Linear(c.hidden, q_width, bias=False)
        else:
            self.wq_a = nn.Linear(c.hidden, c.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(c.q_lora_rank, c.norm_eps)
            self.wq_b = nn.Linear(c.q_lora_rank, q_width, bias=False)
        self.wkv_a = nn.Linear(c.hidden, c.kv_lora_rank + c.qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(c.kv_lora_rank, c.norm_eps)
        self.wkv_b = nn.Linear(
            c.kv_lora_rank, c.n_heads * (c.qk_nope_head_dim + c.v_head_dim), bias=False
        )
        self.wo = nn.Linear(c.n_heads * c.v_head_dim, c.hidden, bias=False)

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        if self.config.q_lora_rank is None:
            return self.wq(x)
        return self.wq_b(self.q_norm(self.wq_a(x)))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.config
        batch, seq, _ = x.shape
        q = split_heads(self.project_q(x), c.n_heads)
        q_nope, q_rope = torch.split(q, [c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        latent, k_rope = torch.split(self.wkv_a(x), [c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        k_rope = apply_rope(k_rope.unsqueeze(1), cos, sin)  # [b, 1, s, rope]: shared by heads
        kv = split_heads(self.wkv_b(self.kv_norm(latent)), c.n_heads)
        k_nope, v = torch.split(kv, [c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        q = torch.cat((q_nope, apply_rope(q_rope, cos, sin)), dim=-1)
        k_rope = k_rope.expand(batch, c.n_heads, seq, c.qk_rope_head_dim)
        k = torch.cat((k_nope, k_rope), dim=-1)
        out = causal_attention(q, k, v, 1.0 / math.sqrt(c.qk_head_dim))
        return self.wo(merge_heads(out))


class Gate(nn.Module):
    """The router: sigmoid scores, group-limited top-k choice, normalised and scaled weights.

    `e_score_correction_bias` (DeepSeek-V3's auxiliary-loss-free balancing bias) is a persistent
    buffer, not a parameter: it is updated by a balancing rule, never by gradients, and shifts
    only the choice of experts, not their weights.
    """

    def __init__(self, config: DeepSeekConfig) -> None:
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.register_buffer("e_score_correction_bias", torch.zeros(config.n_routed_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Dense routing weights `[tokens, experts]`, zero outside each token's top-k."""
        scores = torch.sigmoid(F.linear(x, self.weight))
        choice = scores.detach() + self.e_score_correction_bias
        if self.config.n_group > 1:
            choice = self.limit_to_groups(choice)
        selected = torch.topk(choice, self.config.n_activated_experts, dim=-1).indices
        mask = torch.zeros_like(choice).scatter(-1, selected, 1.0)  # constant: no gradient
        picked = scores * mask
        return picked / picked.sum(dim=-1, keepdim=True) * self.config.routed_scaling_factor

    def limit_to_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """Keep the `topk_group` groups with the largest sum of their two best scores."""
        tokens, experts = choice.shape
        grouped = choice.view(tokens, self.config.n_group, experts // self.config.n_group)
        group_scores = torch.topk(grouped, 2, dim=-1).values.sum(dim=-1)
        best_groups = torch.topk(group_scores, self.config.topk_group, dim=-1).indices
        keep = torch.zeros_like(group_scores).scatter(-1, best_groups, 1.0)
        dropped = (keep == 0).unsqueeze(-1)
        return grouped.masked_fill(dropped, float("-inf")).reshape(tokens, experts)


class Experts(nn.Module):
    """All routed experts as stacked SwiGLU weights `w1, w3 [E, inter, hidden]`, `w2 [E, hidden,
    inter]`, applied to every token with batched matmuls and combined with the routing weights."""

    def __init__(self, config: DeepSeekConfig) -> None:
        super().__init__()
        experts, inter, hidden = config.n_routed_experts, config.moe_inter, config.hidden
        self.w1 = nn.Parameter(torch.empty(experts, inter, hidden))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, inter))
        self.w3 = nn.Parameter(torch.empty(experts, inter, hidden))
        for weight in (self.w1, self.w2, self.w3):
            bound = 1.0 / math.sqrt(weight.shape[-1])  # as nn.Linear: U(-1/sqrt(in), 1/sqrt(in))
            nn.init.uniform_(weight, -bound, bound)

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """`x [tokens, hidden]`, `weights [tokens, experts]` -> `[tokens, hidden]`."""
        tokens, hidden = x.shape
        per_expert = x.unsqueeze(0).expand(self.w1.shape[0], tokens, hidden)
        gate = torch.bmm(per_expert, self.w1.transpose(1, 2))
        up = torch.bmm(per_expert, self.w3.transpose(1, 2))
        out = torch.bmm(F.silu(gate) * up, self.w2.transpose(1, 2))  # [experts, tokens, hidden]
        return (out * weights.t().unsqueeze(-1)).sum(dim=0)


class MoE(nn.Module):
    """Routed experts (top-k of `n_routed_experts`) plus always-on shared experts."""

    def __init__(self, config: DeepSeekConfig) -> None:
        super().__init__()
        self.gate = Gate(config)
        self.experts = Experts(config)
        self.shared_experts = SwiGLU(config.hidden, config.n_shared_experts * config.moe_inter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        flat = x.reshape(batch * seq, hidden)
        routed = self.experts(flat, self.gate(flat))
        return (routed + self.shared_experts(flat)).view(batch, seq, hidden)


class Block(nn.Module):
    def __init__(self, config: DeepSeekConfig, layer_id: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden, config.norm_eps)
        self.attention = MLA(config)
        self.ffn_norm = RMSNorm(config.hidden, config.norm_eps)
        if layer_id < config.n_dense_layers:
            self.feed_forward: nn.Module = SwiGLU(config.hidden, config.dense_ffn)
        else:
            self.feed_forward = MoE(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class DeepSeekV3(RopeDecoderLM):
    """Embedding, dense then MoE blocks, final RMSNorm, untied output head (no MTP module).

    RoPE tables `rope_cos`/`rope_sin` `[max_seq_len, qk_rope_head_dim // 2]` are non-persistent
    buffers; `forward` uses their first `seq` rows.
    """

    def __init__(self, config: DeepSeekConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.hidden, config.norm_eps)
        self.output = nn.Linear(config.hidden, config.vocab_size, bias=False)
        cos, sin = rope_tables(config.qk_rope_head_dim, config.max_seq_len, config.rope_theta)
        self.register_rope(cos, sin)

    @classmethod
    def from_config_name(cls, name: str, **overrides: Any) -> DeepSeekV3:
        return cls(load_config(DeepSeekConfig, name, "DeepSeekV3", overrides))
