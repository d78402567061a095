"""The specs trace with AOTAutograd on the meta device at real dimensions (one layer each)."""

import contextlib

import pytest
import torch
from torch._decomp import core_aten_decompositions
from torch._functorch.aot_autograd import aot_export_joint_with_descriptors
from torch._subclasses.fake_tensor import FakeTensorMode

from stdlib.models.deepseek import DeepSeekV3
from stdlib.models.llama import Llama

# Data-dependent or fused ops the specs must never produce.
FORBIDDEN = ("_local_scalar_dense", "nonzero", "scaled_dot_product", "flash", "efficient_attention")

CASES = [
    (Llama, "llama3_405b", {"n_layers": 1}),
    (DeepSeekV3, "deepseek_v3_671b", {"n_layers": 1, "n_dense_layers": 0}),
]


def joint_ops(cls, name, overrides, seq):
    with torch.device("meta"):
        model = cls.from_config_name(name, **overrides)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        args = tuple(
            torch.zeros(shape, dtype=dtype, device="meta")
            for shape, dtype in model.input_specs(1, seq).values()
        )
    with contextlib.ExitStack() as stack:
        stack.enter_context(mode)
        joint = aot_export_joint_with_descriptors(
            stack, model, args, decompositions=core_aten_decompositions()
        )
        graph = joint.graph_module.graph
        return {str(node.target) for node in graph.nodes if node.op == "call_function"}


@pytest.mark.parametrize(("cls", "name", "overrides"), CASES, ids=[c[1] for c in CASES])
def test_one_real_size_layer_traces_on_meta(cls, name, overrides):
    ops = joint_ops(cls, name, overrides, seq=16)
    assert "aten.bmm.default" in ops and "aten._softmax.default" in ops
    assert not [op for op in ops if any(word in op for word in FORBIDDEN)]
    if cls is DeepSeekV3:
        assert "aten.topk.default" in ops
