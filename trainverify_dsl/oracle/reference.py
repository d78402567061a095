"""The single-device reference: the plan's spec model in float64, one step of plain torch.

The oracle draws its own values (parameters, optimizer states, inputs) from a seed, runs the
spec model eagerly with ``torch.autograd`` on the whole batch, and steps ``torch.optim`` on it.
Nothing here goes through the project's tracer, IR or interpreter.

Names of the values: parameters and buffers by their module path, model inputs by name,
optimizer states ``<torch state name>(<param>)`` (``exp_avg(fc1.weight)``); the reference's
outputs ``loss``, ``grad(<param>)``, ``new(<param>)``, ``new(<state>(<param>))``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from trainverify_dsl.plan.model import Optimizer, ParamGroup, group_of
from trainverify_dsl.simulate.run import (
    draw_bool,
    input_masks,
    mask_at_random,
    mask_rows,
    model_vocab,
)
from trainverify_dsl.spec.float64 import Float64

#: torch.optim's state tensors per optimizer kind (SGD without momentum keeps none; with
#: momentum its first step creates the buffer from the gradient, so none is drawn either).
STATES = {"sgd": (), "adam": ("exp_avg", "exp_avg_sq"), "adamw": ("exp_avg", "exp_avg_sq")}


def draw_values(model: torch.nn.Module, inputs: Mapping[str, tuple[Any, torch.dtype]],
                optimizer: Optimizer | None, seed: int,
                masked: Mapping[str, tuple[int, ...]] | None = None,
                ranges: Mapping[str, int] | None = None, few: bool = False
                ) -> dict[str, np.ndarray]:
    """Parameters ~ N(0, 0.5²), Adam's first moment ~ N(0, 0.1²) and second moment
    ~ U(0.01, 0.1) (positive), real inputs ~ N(0, 1), integer inputs (token ids) uniform in the
    vocabulary (the first embedding table's rows), buffers as the model built them. An input
    of ``masked`` (default: those the model names in ``masked_inputs()``; ``tvp simulate``'s
    ``input_masks`` adds the constants the traced step tests them against) has the first
    position of every row but the first set to the masking value (``mask_rows``: the
    pattern ``tvp simulate`` draws). ``ranges``: an integer input's range when it is not
    the vocabulary (``simulate.run.input_ranges``). ``few``: ``tvp simulate``'s second
    draw (``simulate.run.COUNT_DRAW``): integers from {0, 1} masked at random positions,
    booleans at random."""
    rng = np.random.default_rng(seed if not few else [seed, 1])
    values: dict[str, np.ndarray] = {}
    for name, p in model.named_parameters():
        values[name] = rng.normal(0.0, 0.5, size=tuple(p.shape))
    for name, b in model.named_buffers():
        values[name] = b.detach().double().numpy() if b.is_floating_point() \
            else b.detach().numpy()
    vocab = model_vocab(model) or 2
    for name, (shape, dtype) in inputs.items():
        if dtype.is_floating_point:
            values[name] = rng.normal(0.0, 1.0, size=tuple(shape))
        elif dtype == torch.bool:
            values[name] = rng.integers(0, 2, size=tuple(shape)).astype(bool) if few else \
                draw_bool(tuple(shape))
        else:
            high = (ranges or {}).get(name, vocab)
            values[name] = rng.integers(0, min(high, 2) if few else high, size=tuple(shape))
    if masked is None:
        masked = input_masks(model, None, vocab)
    for name, ignore in masked.items():
        if name in inputs and not inputs[name][1].is_floating_point and \
                inputs[name][1] != torch.bool:
            if few:
                values[name] = mask_at_random(values[name], ignore, rng)
            else:
                values[name] = mask_rows(values[name], ignore, (ranges or {}).get(name, vocab))
    for state in STATES[optimizer.kind] if optimizer else ():
        for name, p in model.named_parameters():
            if state == "exp_avg":
                values[f"{state}({name})"] = rng.normal(0.0, 0.1, size=tuple(p.shape))
            else:
                values[f"{state}({name})"] = rng.uniform(0.01, 0.1, size=tuple(p.shape))
    return values


def make_optimizer(named: Mapping[str, torch.Tensor], optimizer: Optimizer,
                   groups: tuple[ParamGroup, ...] = ()) -> torch.optim.Optimizer:
    """The plan's ``optimizer`` statement as a ``torch.optim`` optimizer (single-tensor
    implementation: ``foreach=False``), each parameter group (``on TARGET: optimizer ...``,
    docs/semantics.md §6.5) a ``param_groups`` entry stating its hyper-parameters, the
    parameters in no group in the first entry."""
    members: dict[int, list[torch.Tensor]] = {}
    for name, tensor in named.items():
        group = group_of(groups, name)
        members.setdefault(-1 if group is None else groups.index(group), []).append(tensor)
    entries = [{"params": tensors, **_torch_hyper(optimizer if k < 0 else groups[k].optimizer)}
               for k, tensors in sorted(members.items())]
    if optimizer.kind == "sgd":
        return torch.optim.SGD(entries, foreach=False)
    kind = torch.optim.Adam if optimizer.kind == "adam" else torch.optim.AdamW
    return kind(entries, foreach=False)


def _torch_hyper(optimizer: Optimizer) -> dict[str, Any]:
    """An optimizer statement's hyper-parameters as torch.optim's keyword arguments, torch's
    defaults where it states none."""
    def option(name: str, default: float) -> float:
        value = optimizer.get(name)
        return default if value is None else float(value)  # type: ignore[arg-type]

    if optimizer.kind == "sgd":
        return {"lr": option("lr", 1e-3), "momentum": option("momentum", 0.0),
                "weight_decay": option("weight-decay", 0.0)}
    betas = optimizer.get("betas")
    pair = (float(betas[0]), float(betas[1])) if betas else (0.9, 0.999)  # type: ignore[index]
    decay = option("weight-decay", 0.0 if optimizer.kind == "adam" else 0.01)
    return {"lr": option("lr", 1e-3), "betas": pair, "eps": option("eps", 1e-8),
            "weight_decay": decay}


def seed_states(opt: torch.optim.Optimizer, states: Mapping[torch.Tensor, Mapping[str, Any]]
                ) -> None:
    """Start ``opt`` from the given states (as after ``load_state_dict``): step 0, so the step
    taken is step 1 with these moments."""
    for param, named in states.items():
        if named:
            opt.state[param] = {"step": torch.tensor(0.0),
                                **{k: torch.as_tensor(v).clone() for k, v in named.items()}}


def reference_step(model: torch.nn.Module, values: Mapping[str, np.ndarray],
                   input_names: list[str], optimizer: Optimizer | None,
                   groups: tuple[ParamGroup, ...] = ()) -> dict[str, np.ndarray]:
    """One training step of the spec model on one device, float64, with the recipe
    ``optimizer`` and its parameter groups."""
    net = copy.deepcopy(model).double()
    with torch.no_grad():
        for name, tensor in [*net.named_parameters(), *net.named_buffers()]:
            tensor.copy_(torch.from_numpy(np.asarray(values[name])))
    args = [torch.from_numpy(np.asarray(values[n])) for n in input_names]
    with Float64():  # a cast the model writes stays float64, as on the ranks
        loss = net(*args)
        loss.backward()
    # a parameter the loss does not use has no gradient and no update (torch's optimizers
    # skip it), as no rank holds one
    named = {n: p for n, p in net.named_parameters() if p.grad is not None}
    out = {"loss": loss.detach().numpy().copy()}
    for name, p in named.items():
        out[f"grad({name})"] = p.grad.numpy().copy()
    if optimizer is not None:
        if optimizer.clip is not None:  # the recipe's clip_grad_norm_ (docs/semantics.md §6.3)
            torch.nn.utils.clip_grad_norm_(list(named.values()), float(optimizer.clip),
                                           foreach=False)
        opt = make_optimizer(named, optimizer, groups)
        kinds = STATES[optimizer.kind]
        seed_states(opt, {p: {k: torch.from_numpy(values[f"{k}({n})"]) for k in kinds}
                          for n, p in named.items()})
        opt.step()
        for name, p in named.items():
            out[f"new({name})"] = p.detach().numpy().copy()
            for k in kinds:
                out[f"new({k}({name}))"] = opt.state[p][k].numpy().copy()
    return out
