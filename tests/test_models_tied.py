"""Tied embeddings (``tie_embeddings``): the output head multiplies by the token embedding's
weight, transposed. A tied model has one parameter where the untied one has two, traces to IR
that reproduces torch eager's loss and gradient (the gradient of both uses, summed), and an
untied model is exactly what it was."""

from __future__ import annotations

import pytest
import torch
from test_spec_support import check_spec, ir_inputs, random_inputs, torch_reference

from stdlib.models.common import count_parameters
from stdlib.models.gpt2 import GPT2
from stdlib.models.llama import Llama
from trainverify_dsl.spec.errors import SpecError
from trainverify_dsl.spec.load import load_model
from trainverify_dsl.spec.trace import trace_training_step

TINY = [(GPT2, "gpt2_tiny"), (Llama, "llama_tiny")]


def real_model(name: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return load_model(name, fake=False, **overrides)
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize(("cls", "name"), TINY, ids=[n for _, n in TINY])
def test_tied_model_has_one_parameter_for_both_uses(cls, name: str) -> None:
    with torch.device("meta"):
        untied = cls.from_config_name(name)
        tied = cls.from_config_name(name, tie_embeddings=True)
    names = [n for n, _ in tied.named_parameters()]
    assert "output.weight" not in names and "embed.weight" in names
    assert [n for n, _ in untied.named_parameters()] == names + ["output.weight"]
    assert tied.output.weight is tied.embed.weight
    assert count_parameters(untied) - count_parameters(tied) == untied.output.weight.numel()


@pytest.mark.parametrize("name", ["gpt2_tiny", "llama_tiny"])
def test_tied_model_traces_to_torch_eager(name: str) -> None:
    """The traced step's loss and ``grad(embed.weight)`` are torch's: the lookup's gradient
    plus the head's, one parameter."""
    model = real_model(name, tie_embeddings=True)
    specs = model.input_specs(2, 8)
    args = random_inputs(specs, 16, seed=3)
    spec = trace_training_step(model, specs)
    ref = torch_reference(model, specs, args)
    assert "grad(output.weight)" not in ref
    check_spec(spec, ir_inputs(model, specs, args), ref)


def test_tied_gradient_is_the_sum_of_both_uses() -> None:
    """Against the untied model with the same values: the tied gradient is the untied
    embedding's gradient plus the untied head's (the test cannot pass by a shared mistake:
    the untied side is plain torch on two parameters)."""
    tied = real_model("llama_tiny", tie_embeddings=True)
    untied = real_model("llama_tiny")
    untied.load_state_dict({**tied.state_dict(), "output.weight": tied.embed.weight.detach()})
    specs = tied.input_specs(2, 8)
    args = random_inputs(specs, 16, seed=5)
    a, b = torch_reference(tied, specs, args), torch_reference(untied, specs, args)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-12)
    both = b["grad(embed.weight)"] + b["grad(output.weight)"]
    assert abs(a["grad(embed.weight)"] - both).max() < 1e-12 * abs(both).max()


@pytest.mark.parametrize(("value", "expected"), [(True, True), ("true", True), (False, False),
                                                 ("false", False)])
def test_tie_embeddings_accepts_json_and_plan_words(value, expected: bool) -> None:
    with torch.device("meta"):
        model = GPT2.from_config_name("gpt2_tiny", tie_embeddings=value)
    assert model.config.tie_embeddings is expected
    assert (model.output.weight is model.embed.weight) is expected


@pytest.mark.parametrize("value", ["yes", 1, "True"])
def test_tie_embeddings_refuses_other_values(value) -> None:
    with pytest.raises(SpecError) as caught:
        load_model("gpt2_tiny", tie_embeddings=value)
    message = caught.value.diagnostics[0].message
    assert "tie_embeddings is a yes/no setting" in message and "Traceback" not in message
