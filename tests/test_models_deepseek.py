"""DeepSeek-V3: module tree, MLA, and the MoE against explicit sparse dispatch."""

import pytest
import torch
import torch.nn.functional as F

from stdlib.models.deepseek import DeepSeekV3

pytestmark = pytest.mark.usefixtures("float64")


def tiny(**overrides):
    return DeepSeekV3.from_config_name("deepseek_tiny", **overrides)


def test_module_tree_is_the_documented_one():
    names = set(dict(tiny().named_parameters()))
    attention = ["wq_a", "q_norm", "wq_b", "wkv_a", "kv_norm", "wkv_b", "wo"]
    common = {f"attention.{m}.weight" for m in attention} | {
        "attention_norm.weight",
        "ffn_norm.weight",
    }
    dense = {f"feed_forward.w{i}.weight" for i in (1, 2, 3)}
    moe = {"feed_forward.gate.weight"} | {f"feed_forward.experts.w{i}" for i in (1, 2, 3)}
    moe |= {f"feed_forward.shared_experts.w{i}.weight" for i in (1, 2, 3)}
    expected = {"embed.weight", "norm.weight", "output.weight"}
    expected |= {f"layers.0.{name}" for name in common | dense}
    expected |= {f"layers.{i}.{name}" for i in (1, 2) for name in common | moe}
    assert names == expected
    direct = set(dict(tiny(q_lora_rank=None).layers[0].attention.named_parameters()))
    assert {"wq.weight", "wkv_a.weight"} <= direct and "wq_a.weight" not in direct


def test_forward_backward_is_finite():
    model = tiny()
    tokens, labels = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    loss = model(tokens, labels)
    loss.backward()
    assert loss.shape == () and torch.isfinite(loss)
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


def test_is_causal():
    model = tiny()
    tokens = torch.randint(0, 64, (2, 9))
    changed = tokens.clone()
    changed[:, 6] = (changed[:, 6] + 5) % 64
    before, after = model.logits(tokens), model.logits(changed)
    torch.testing.assert_close(before[:, :6], after[:, :6], rtol=0, atol=1e-12)
    assert not torch.allclose(before[:, 6:], after[:, 6:])


@pytest.mark.parametrize("q_lora_rank", [16, None])
def test_mla_shapes(q_lora_rank):
    model = tiny(q_lora_rank=q_lora_rank)
    c = model.config
    attention = model.layers[1].attention
    shapes = {}
    for name, module in attention.named_children():
        module.register_forward_hook(
            lambda m, i, o, name=name: shapes.update({name: tuple(o.shape)})
        )
    model.logits(torch.randint(0, 64, (2, 5)))
    q_width = c.n_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim)
    expected = {
        "wkv_a": (2, 5, c.kv_lora_rank + c.qk_rope_head_dim),
        "kv_norm": (2, 5, c.kv_lora_rank),
        "wkv_b": (2, 5, c.n_heads * (c.qk_nope_head_dim + c.v_head_dim)),
        "wo": (2, 5, c.hidden),
    }
    if q_lora_rank is None:
        expected["wq"] = (2, 5, q_width)
    else:
        expected |= {"wq_a": (2, 5, 16), "q_norm": (2, 5, 16), "wq_b": (2, 5, q_width)}
    assert shapes == expected


def absorbed_mla(attention, x):
    """MLA in DeepSeek's weight-absorbed inference form: attention over the latent itself.

    Scores use q_nope @ W_UK (per head) against the normalised latent, values are read from the
    latent and expanded by W_UV afterwards: a different computation of the same function.
    """
    c = attention.config
    b, s, _ = x.shape
    q = attention.project_q(x).view(b, s, c.n_heads, c.qk_head_dim)
    q_nope, q_rope = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
    latent, k_rope = attention.wkv_a(x).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
    latent = attention.kv_norm(latent)
    w_kv = attention.wkv_b.weight.view(c.n_heads, c.qk_nope_head_dim + c.v_head_dim, -1)
    w_uk, w_uv = w_kv[:, : c.qk_nope_head_dim], w_kv[:, c.qk_nope_head_dim :]
    q_latent = torch.einsum("bshd,hdc->bshc", q_nope, w_uk)
    half = c.qk_rope_head_dim // 2
    freqs = c.rope_theta ** (-2 * torch.arange(half) / c.qk_rope_head_dim)
    angles = torch.outer(torch.arange(s), freqs)[:, None]
    q_rot = torch.view_as_real(
        torch.complex(q_rope[..., :half], q_rope[..., half:]) * torch.exp(1j * angles)
    )
    k_rot = torch.view_as_real(
        torch.complex(k_rope[..., :half], k_rope[..., half:]) * torch.exp(1j * angles[:, 0])
    )
    rope_scores = torch.einsum("bshpz,btpz->bhst", q_rot, k_rot)
    scores = torch.einsum("bshc,btc->bhst", q_latent, latent) + rope_scores
    scores = scores / c.qk_head_dim**0.5
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    context = torch.einsum("bhst,btc->bshc", scores.softmax(-1), latent)
    out = torch.einsum("bshc,hvc->bshv", context, w_uv).reshape(b, s, -1)
    return attention.wo(out)


@pytest.mark.parametrize("q_lora_rank", [16, None])
def test_mla_equals_weight_absorbed_form(q_lora_rank):
    model = tiny(q_lora_rank=q_lora_rank)
    attention = model.layers[0].attention
    x = torch.randn(2, 6, model.config.hidden)
    out = attention(x, model.rope_cos[:6], model.rope_sin[:6])
    torch.testing.assert_close(out, absorbed_mla(attention, x))


def expert_output(experts, index, x):
    hidden = F.silu(experts.w1[index] @ x) * (experts.w3[index] @ x)
    return experts.w2[index] @ hidden


def chosen_experts(gate, x):
    """DeepSeek-V3 routing for one token, with Python sorting instead of torch.topk."""
    c = gate.config
    scores = torch.sigmoid(gate.weight @ x)
    choice = (scores + gate.e_score_correction_bias).tolist()
    per_group = c.n_routed_experts // c.n_group
    groups = [choice[g * per_group : (g + 1) * per_group] for g in range(c.n_group)]
    group_scores = [sum(sorted(group, reverse=True)[:2]) for group in groups]
    kept = sorted(range(c.n_group), key=lambda g: -group_scores[g])[: c.topk_group]
    candidates = [e for e in range(c.n_routed_experts) if e // per_group in kept]
    if c.n_group == 1:
        candidates = list(range(c.n_routed_experts))
    chosen = sorted(candidates, key=lambda e: -choice[e])[: c.n_activated_experts]
    return chosen, scores


def sparse_moe(moe, x):
    """Each token through its chosen experts only, one at a time."""
    c = moe.gate.config
    rows = []
    for token in x.reshape(-1, x.shape[-1]):
        chosen, scores = chosen_experts(moe.gate, token)
        weights = scores[chosen] / scores[chosen].sum() * c.routed_scaling_factor
        pairs = zip(weights, chosen, strict=True)
        routed = sum(w * expert_output(moe.experts, e, token) for w, e in pairs)
        rows.append(routed + moe.shared_experts(token))
    return torch.stack(rows).view(x.shape)


@pytest.mark.parametrize(
    "overrides", [{}, {"n_group": 1, "topk_group": 1, "n_activated_experts": 3}]
)
def test_moe_equals_sparse_dispatch_with_gradients(overrides):
    moe = tiny(**overrides).layers[1].feed_forward
    moe.gate.e_score_correction_bias.copy_(0.3 * torch.randn(8))
    x = torch.randn(2, 5, 32, requires_grad=True)
    dense, sparse = moe(x), sparse_moe(moe, x)
    torch.testing.assert_close(dense, sparse)
    probe = torch.randn_like(dense)
    params = [x, *moe.parameters()]
    dense_grads = torch.autograd.grad((dense * probe).sum(), params)
    sparse_grads = torch.autograd.grad((sparse * probe).sum(), params)
    for dense_grad, sparse_grad in zip(dense_grads, sparse_grads, strict=True):
        torch.testing.assert_close(dense_grad, sparse_grad)


def test_group_limit_changes_some_choices():
    """On tiny's config (4 groups, keep 2) the group limit is not vacuous."""
    gate = tiny().layers[1].feed_forward.gate
    x = torch.randn(64, 32)
    weights = gate(x)
    assert ((weights > 0).sum(-1) == 2).all()
    torch.testing.assert_close(weights.sum(-1), torch.full((64,), 2.5))
    unlimited = torch.topk(torch.sigmoid(x @ gate.weight.T), 2, dim=-1).indices
    limited = torch.topk(weights, 2, dim=-1).indices
    assert (unlimited.sort(-1).values != limited.sort(-1).values).any()
    for row, token in zip(weights, x, strict=True):
        assert set(torch.nonzero(row).ravel().tolist()) == set(chosen_experts(gate, token)[0])


def test_correction_bias_shifts_choice_not_weights():
    gate = tiny().layers[1].feed_forward.gate
    x = torch.randn(16, 32)
    gate.e_score_correction_bias.copy_(torch.tensor([10.0, 10.0] + [0.0] * 6))
    weights = gate(x)
    assert (weights[:, :2] > 0).all() and (weights[:, 2:] == 0).all()
    scores = torch.sigmoid(x @ gate.weight.T)[:, :2]
    torch.testing.assert_close(weights[:, :2], scores / scores.sum(-1, keepdim=True) * 2.5)
    assert "e_score_correction_bias" not in dict(gate.named_parameters())
