"""GPT-2 and the MLP against independent computations."""

import pytest
import torch
import torch.nn.functional as F

from stdlib.models.gpt2 import GPT2
from stdlib.models.mlp import MLP

pytestmark = pytest.mark.usefixtures("float64")


def test_gpt2_module_tree():
    model = GPT2.from_config_name("gpt2_tiny")
    names = set(dict(model.named_parameters()))
    layer = {
        f"{module}.{kind}"
        for module in (
            "attention_norm",
            "attention.wq",
            "attention.wk",
            "attention.wv",
            "attention.wo",
            "ffn_norm",
            "feed_forward.w1",
            "feed_forward.w2",
        )
        for kind in ("weight", "bias")
    }
    expected = {"embed.weight", "pos_embed.weight", "norm.weight", "norm.bias", "output.weight"}
    expected |= {f"layers.{i}.{name}" for i in range(2) for name in layer}
    assert names == expected


def reference_gpt2_logits(model, tokens):
    """GPT-2 written out with torch's own LayerNorm and fused causal attention."""
    c = model.config
    seq = tokens.shape[1]
    h = model.embed.weight[tokens] + model.pos_embed.weight[:seq]
    for layer in model.layers:
        a = F.layer_norm(h, (c.hidden,), layer.attention_norm.weight, layer.attention_norm.bias)
        att = layer.attention
        q, k, v = (
            lin(a).view(*a.shape[:2], c.n_heads, c.head_dim).transpose(1, 2)
            for lin in (att.wq, att.wk, att.wv)
        )
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + att.wo(o.transpose(1, 2).reshape(a.shape))
        f = F.layer_norm(h, (c.hidden,), layer.ffn_norm.weight, layer.ffn_norm.bias)
        inner = layer.feed_forward.w1(f)
        gelu = 0.5 * inner * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (inner + 0.044715 * inner**3)))
        h = h + layer.feed_forward.w2(gelu)
    h = F.layer_norm(h, (c.hidden,), model.norm.weight, model.norm.bias)
    return h @ model.output.weight.T


def test_gpt2_matches_reference_and_backward_is_finite():
    model = GPT2.from_config_name("gpt2_tiny")
    tokens = torch.randint(0, 61, (2, 7))
    labels = torch.randint(0, 61, (2, 7))
    torch.testing.assert_close(model.logits(tokens), reference_gpt2_logits(model, tokens))
    loss = model(tokens, labels)
    expected = F.cross_entropy(reference_gpt2_logits(model, tokens).reshape(14, 61), labels.ravel())
    torch.testing.assert_close(loss, expected)
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    assert model.pos_embed.weight.grad[7:].abs().sum() == 0  # only the first seq rows are used


def test_gpt2_is_causal():
    model = GPT2.from_config_name("gpt2_tiny")
    tokens = torch.randint(0, 61, (1, 9))
    changed = tokens.clone()
    changed[0, 4] = (changed[0, 4] + 3) % 61
    before, after = model.logits(tokens), model.logits(changed)
    torch.testing.assert_close(before[:, :4], after[:, :4], rtol=0, atol=1e-12)
    assert not torch.allclose(before[:, 4:], after[:, 4:])


@pytest.mark.parametrize(("name", "activation"), [("mlp_tiny", F.relu), ("mlp_small", F.gelu)])
def test_mlp_matches_formula(name, activation):
    model = MLP.from_config_name(name)
    c = model.config
    x, target = torch.randn(5, c.d_in), torch.randn(5, c.d_out)
    pred = activation(x @ model.fc1.weight.T + model.fc1.bias) @ model.fc2.weight.T + model.fc2.bias
    torch.testing.assert_close(model(x, target), F.mse_loss(pred, target))
    model(x, target).backward()
    assert torch.isfinite(model.fc1.weight.grad).all() and model.fc1.bias.grad.abs().sum() > 0
