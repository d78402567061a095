"""Optimizer steps as IR against torch.optim (float64), one and two steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_spec_support import MLP, assert_matches, ir_inputs, random_inputs

from trainverify_dsl.ir import evaluate_graph, inline, verify_graph
from trainverify_dsl.spec.optim import SGD, Adam, AdamW, append_optimizer
from trainverify_dsl.spec.trace import trace_training_step

SPECS = {"x": ((5, 6), torch.float64), "target": ((5,), torch.int64)}

CONFIGS = [
    (SGD(lr=0.1), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    (SGD(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    (SGD(lr=0.05, momentum=0.8, nesterov=True),
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True)),
    (Adam(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
     lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1,
                                 foreach=False)),
    (AdamW(lr=0.01, weight_decay=0.1),
     lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=False)),
]
IDS = ["sgd", "sgd-momentum", "sgd-nesterov", "adam", "adamw"]

STATE_NAMES = {"momentum": "momentum_buffer", "m": "exp_avg", "v": "exp_avg_sq"}


def with_step(opt, step: int):
    from dataclasses import replace

    return replace(opt, step=step)


@pytest.fixture(scope="module")
def traced():
    torch.manual_seed(0)
    model = MLP().double()
    return model, trace_training_step(model, SPECS)


@pytest.mark.parametrize(("opt", "make_torch"), CONFIGS, ids=IDS)
def test_two_steps_match_torch_optim(traced, opt, make_torch) -> None:
    model, spec = traced
    torch.manual_seed(1)
    reference = MLP().double()
    reference.load_state_dict(model.state_dict())
    torch_opt = make_torch(list(reference.parameters()))
    params = {n: p.detach().numpy().copy() for n, p in reference.named_parameters()}
    states = {f"{s}({n})": np.zeros_like(v) for n, v in params.items() for s in opt.states}
    for step in (1, 2):
        args = random_inputs(SPECS, 3, seed=10 + step)
        values = {**ir_inputs(reference, SPECS, args), **params, **states}
        program = append_optimizer(spec, with_step(opt, step))
        out = program.evaluate(values)
        flat = inline(program.program)
        verify_graph(flat)
        flat_out = evaluate_graph(flat, values)
        torch_opt.zero_grad()
        reference(*args).backward()
        torch_opt.step()
        want = {f"new({n})": p.detach().numpy() for n, p in reference.named_parameters()}
        for n, p in reference.named_parameters():
            for short, key in STATE_NAMES.items():
                if short in opt.states:
                    want[f"new({short}({n}))"] = torch_opt.state[p][key].numpy()
        assert_matches(out, want)
        assert_matches(flat_out, want)
        params = {n: out[f"new({n})"] for n in params}
        states = {name: out[f"new({name})"] for name in states}


def test_update_graph_is_shared_per_parameter_type(traced) -> None:
    _, spec = traced
    program = append_optimizer(spec, AdamW()).program
    updates = [c for c in program.calls if c.graph.startswith("optimizer.")]
    assert len(updates) == len(spec.params)
    assert len({c.graph for c in updates}) == len({p.type for p in spec.params})
    kinds = {g.name: g.kind for g in program.inputs}
    assert kinds["m(fc1.weight)"] == "state" and kinds["v(fc2.bias)"] == "state"
