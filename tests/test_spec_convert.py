"""ATen-to-IR converters: modules that exercise many torch functions trace to IR that
reproduces torch's loss and gradients (float64). Each zoo entry is one small function of a
float input ``h = x @ w`` (``x [4, 6]``, parameter ``w [6, 6]``) and the module's index buffers;
the test compares the loss and grad(w)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_spec_support import check_spec, ir_inputs, random_inputs, torch_reference
from torch import nn

from trainverify_dsl.spec.trace import trace_training_step

ZOO = {
    "flip_cumsum": lambda h, m: torch.flip(h, (0,)).cumsum(1),
    "sort_topk": lambda h, m: torch.sort(h, dim=1, descending=True).values[:, :3]
    + torch.topk(h, 2, dim=0, largest=False).values.sum(),
    "argmax_gather": lambda h, m: torch.gather(h, 1, h.argmax(1, keepdim=True)),
    "index_select": lambda h, m: torch.index_select(h, 1, m.sel),
    "advanced_index": lambda h, m: h[m.rows, m.cols],
    "var_std": lambda h, m: h.var(1, keepdim=True) + h.var(0, correction=0) .sum()
    + h.std(1).sum(),
    "split_chunk": lambda h, m: torch.cat([p * (i + 1) for i, p in enumerate(h.split([2, 4], 1))]
                                       + list(h.chunk(2, 1)), 1),
    "select_slice": lambda h, m: h[1] * h[:, 2:5].sum() + h[::2, 1::3].sum(),
    "clamp_where": lambda h, m: torch.where(h > 0.1, h.clamp(-0.5, 0.5), torch.maximum(h, -h)),
    "transcendental": lambda h, m: torch.erf(h) + torch.log1p(h.abs()) + h.sin() * h.cos()
    + torch.sigmoid(h) * F.relu(h) + torch.tanh(h).reciprocal().clamp(-3, 3),
    "norms": lambda h, m: F.layer_norm(h, (6,)) + F.rms_norm(h, (6,), eps=1e-6),
    "softmaxes": lambda h, m: F.softmax(h, 0) * F.log_softmax(h, 1),
    "gelu_silu": lambda h, m: F.gelu(h) + F.silu(h) + F.gelu(h, approximate="tanh"),
    "pow_div_rsub": lambda h, m: (1.0 - h) / (h.pow(2) + 1) + 2 ** h + h.sqrt().nan_to_num(0.0)
    * 0 + torch.rsqrt(h * h + 1),
    "masked_fill_tril": lambda h, m: h.masked_fill(torch.ones(4, 6, dtype=torch.bool).tril(),
                                                -1.5),
    "scatter_add": lambda h, m: torch.zeros(4, 6, dtype=h.dtype).scatter_add(1, m.slots, h),
    "einsum_matmul": lambda h, m: torch.einsum("ij,kj->ik", h, h) @ torch.ones(4, 2,
                                                                          dtype=h.dtype),
    "expand_repeat": lambda h, m: h[:, None, :].expand(4, 3, 6).reshape(12, 6) * 0.5
    + h.repeat(3, 1),
    "amax_amin_mean": lambda h, m: h.amax(1) + h.amin(0).mean() + h.max() + h.mean((0, 1)),
    "embedding_bag": lambda h, m: F.embedding(m.ids, h).sum(1),
}


class Zoo(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.randn(6, 6) * 0.5)
        # index tensors are buffers (program inputs), as position ids would be
        self.register_buffer("sel", torch.tensor([0, 2, 2, 5]))
        self.register_buffer("rows", torch.tensor([3, 0, 1]))
        self.register_buffer("cols", torch.tensor([1, 1, 4]))
        self.register_buffer("slots", torch.tensor([[0, 1, 1, 2, 5, 5]] * 4))
        self.register_buffer("ids", torch.tensor([[0, 3], [2, 2]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fn(x @ self.w, self)
        return (out * torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype)
                .view(out.shape)).sum()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_torch_function_traces_exactly(name: str) -> None:
    torch.manual_seed(0)
    model = Zoo(ZOO[name]).double()
    specs = {"x": ((4, 6), torch.float64)}
    args = random_inputs(specs, 1, seed=5)
    spec = trace_training_step(model, specs)
    check_spec(spec, ir_inputs(model, specs, args), torch_reference(model, specs, args))


def test_tensor_constant_in_forward_is_a_diagnostic_with_a_hint() -> None:
    from trainverify_dsl.spec.errors import SpecError

    weights = Zoo(lambda h, m: h * torch.tensor([1.0, -2.0, 3.0, 0.5, 5.0, 6.0],
                                                dtype=h.dtype)).double()
    with pytest.raises(SpecError) as caught:
        trace_training_step(weights, {"x": ((4, 6), torch.float64)})
    diagnostic = caught.value.diagnostics[0]
    assert diagnostic.code.id == "TVP305"
    assert diagnostic.help and "buffer" in diagnostic.help
