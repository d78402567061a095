"""Shared building blocks checked against independent computations."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stdlib.models.common import (
    RMSNorm,
    RopeScaling,
    SwiGLU,
    apply_rope,
    causal_attention,
    lm_loss,
    repeat_kv,
    rope_frequencies,
    rope_tables,
)

pytestmark = pytest.mark.usefixtures("float64")


def test_rmsnorm_matches_formula():
    norm = RMSNorm(6, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(6))
    x = torch.randn(2, 3, 6)
    expected = np.empty((2, 3, 6))
    for index in np.ndindex(2, 3):
        row = x[index].numpy()
        expected[index] = (
            row / math.sqrt(float(np.mean(row**2)) + 1e-5) * norm.weight.detach().numpy()
        )
    np.testing.assert_allclose(norm(x).detach().numpy(), expected, rtol=1e-12)


def test_swiglu_matches_formula():
    ffn = SwiGLU(4, 6)
    x = torch.randn(5, 4)
    a, b = x @ ffn.w1.weight.T, x @ ffn.w3.weight.T
    expected = (a / (1 + torch.exp(-a)) * b) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), expected)


def test_rope_tables_match_formula():
    cos, sin = rope_tables(8, 5, 500000.0)
    assert cos.shape == sin.shape == (5, 4)
    for pos in range(5):
        for i in range(4):
            angle = pos * 500000.0 ** (-2 * i / 8)
            assert cos[pos, i].item() == pytest.approx(math.cos(angle), abs=1e-14)
            assert sin[pos, i].item() == pytest.approx(math.sin(angle), abs=1e-14)


def test_llama31_rope_scaling_bands():
    scaling = RopeScaling(8.0, 1.0, 4.0, 8192)
    plain = rope_frequencies(128, 500000.0, None)
    scaled = rope_frequencies(128, 500000.0, scaling)
    bands = {"kept": 0, "divided": 0, "blended": 0}
    for freq, new in zip(plain, scaled, strict=True):
        wavelen = 2 * math.pi / freq
        if wavelen < 8192 / 4:
            assert new == freq
            bands["kept"] += 1
        elif wavelen > 8192 / 1:
            assert new == pytest.approx(freq / 8)
            bands["divided"] += 1
        else:
            assert freq / 8 < new < freq
            bands["blended"] += 1
    assert all(bands.values()), bands


def test_rope_equals_complex_rotation():
    seq, dim = 6, 8
    cos, sin = rope_tables(dim, seq, 10000.0)
    x = torch.randn(2, 3, seq, dim)
    half = dim // 2
    angles = torch.tensor(
        [[pos * 10000.0 ** (-2 * i / dim) for i in range(half)] for pos in range(seq)]
    )
    turn = torch.polar(torch.ones_like(angles), angles)
    rotated = torch.complex(x[..., :half], x[..., half:]) * turn
    expected = torch.cat((rotated.real, rotated.imag), dim=-1)
    torch.testing.assert_close(apply_rope(x, cos, sin), expected)


def test_rope_scores_depend_only_on_relative_position():
    seq, dim = 7, 8
    cos, sin = rope_tables(dim, seq, 10000.0)
    q = apply_rope(torch.randn(dim).expand(seq, dim), cos, sin)
    k = apply_rope(torch.randn(dim).expand(seq, dim), cos, sin)
    scores = q @ k.T
    for m in range(1, seq):
        for n in range(1, seq):
            assert scores[m, n].item() == pytest.approx(scores[m - 1, n - 1].item(), abs=1e-12)
    assert scores[0, 1].item() != pytest.approx(scores[1, 0].item(), abs=1e-6)
    torch.testing.assert_close(q.norm(dim=-1), q[0].norm().expand(seq))


def test_causal_attention_matches_explicit_loop_and_sdpa():
    q, k = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    v = torch.randn(2, 3, 5, 6)
    out = causal_attention(q, k, v, scale=0.3)
    expected = torch.empty_like(out)
    for i in range(5):
        weights = torch.softmax((q[:, :, i : i + 1] @ k[:, :, : i + 1].transpose(-2, -1)) * 0.3, -1)
        expected[:, :, i] = (weights @ v[:, :, : i + 1]).squeeze(2)
    torch.testing.assert_close(out, expected)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(out, sdpa)


def test_repeat_kv_maps_query_head_to_its_group():
    x = torch.randn(2, 3, 4, 5)
    out = repeat_kv(x, 4)
    assert out.shape == (2, 12, 4, 5)
    for head in range(12):
        assert torch.equal(out[:, head], x[:, head // 4])


def test_lm_loss_is_mean_cross_entropy():
    logits = torch.randn(2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    expected = F.cross_entropy(logits.reshape(10, 11), labels.reshape(10))
    torch.testing.assert_close(lm_loss(logits, labels), expected)
