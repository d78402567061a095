"""Llama: module tree, forward/backward, causality, GQA and RoPE placement."""

import pytest
import torch

from stdlib.models.llama import Llama

pytestmark = pytest.mark.usefixtures("float64")


def tokens_for(model, batch=2, seq=8):
    return torch.randint(0, model.config.vocab_size, (batch, seq))


def test_module_tree_is_the_documented_one():
    model = Llama.from_config_name("llama_tiny")
    per_layer = [
        "attention_norm.weight",
        "attention.wq.weight",
        "attention.wk.weight",
        "attention.wv.weight",
        "attention.wo.weight",
        "ffn_norm.weight",
        "feed_forward.w1.weight",
        "feed_forward.w2.weight",
        "feed_forward.w3.weight",
    ]
    expected = {"embed.weight", "norm.weight", "output.weight"}
    expected |= {f"layers.{i}.{name}" for i in range(2) for name in per_layer}
    assert set(dict(model.named_parameters())) == expected
    assert tuple(model.layers[0].attention.wk.weight.shape) == (2 * 8, 32)
    assert set(dict(model.named_buffers())) == {"rope_cos", "rope_sin"}
    assert not any(key.startswith("rope") for key in model.state_dict())


def test_forward_backward_is_finite():
    model = Llama.from_config_name("llama_tiny")
    tokens = tokens_for(model)
    loss = model(tokens, tokens_for(model))
    loss.backward()
    assert loss.dtype == torch.float64 and loss.shape == () and torch.isfinite(loss)
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


def test_changing_a_future_token_leaves_earlier_positions_alone():
    model = Llama.from_config_name("llama_tiny")
    tokens = tokens_for(model)
    changed = tokens.clone()
    changed[:, 5] = (changed[:, 5] + 1) % model.config.vocab_size
    before, after = model.logits(tokens), model.logits(changed)
    torch.testing.assert_close(before[:, :5], after[:, :5], rtol=0, atol=1e-12)
    assert not torch.allclose(before[:, 5:], after[:, 5:])


def test_gqa_equals_mha_with_repeated_kv_heads():
    gqa = Llama.from_config_name("llama_tiny")
    mha = Llama.from_config_name("llama_tiny", n_kv_heads=4)
    state = gqa.state_dict()
    head_dim, n_rep = gqa.config.head_dim, 2
    for key, value in state.items():
        if key.endswith(("attention.wk.weight", "attention.wv.weight")):
            heads = value.view(-1, head_dim, value.shape[-1])
            state[key] = heads.repeat_interleave(n_rep, dim=0).reshape(-1, value.shape[-1])
    mha.load_state_dict(state)
    tokens, labels = tokens_for(gqa), tokens_for(gqa)
    torch.testing.assert_close(gqa(tokens, labels), mha(tokens, labels))
    torch.testing.assert_close(gqa.logits(tokens), mha.logits(tokens))


def test_rope_makes_attention_position_aware():
    """With RoPE tables replaced by the identity rotation the logits change (RoPE is applied)."""
    model = Llama.from_config_name("llama_tiny")
    tokens = tokens_for(model)
    rotated = model.logits(tokens)
    model.rope_cos.fill_(1.0)
    model.rope_sin.fill_(0.0)
    assert not torch.allclose(model.logits(tokens)[:, 1:], rotated[:, 1:])
    torch.testing.assert_close(model.logits(tokens)[:, 0], rotated[:, 0])


def test_llama31_scaling_only_on_405b():
    with torch.device("meta"):
        small = Llama.from_config_name("llama3_8b")
        large = Llama.from_config_name("llama3_405b")
    assert small.config.rope_scaling is None
    assert large.config.rope_scaling.factor == 8.0
    assert tuple(large.rope_cos.shape) == (131072, 64)
