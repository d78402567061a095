"""Run a lowered plan's local forward programs eagerly in torch, every rank at once.

This is the torch-side twin of ``simulate.run``: the same local FX programs, executed with real
float64 tensors and torch autograd, with ``tvp.collective`` talking to the other ranks through
a communicator — Python threads in one process (``ThreadWorld``) or real
``torch.distributed`` processes (``DistCommunicator``, used by the gloo tests). Agreement with
the IR/numpy simulation ties the lowering's meaning to torch's own execution.

Scope: single-stage plans (no pipeline axis); gradients after accumulation, before the
plan's gradient statements.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from trainverify_dsl.ir.layout import MICROBATCH_AXIS, take_local
from trainverify_dsl.ir.mesh import MeshGroups
from trainverify_dsl.lower.collectives import ThreadWorld, run_threads, use_communicator
from trainverify_dsl.lower.lowering import Lowered


def rank_step(lowered: Lowered, values: Mapping[str, np.ndarray], rank: int
              ) -> tuple[list[float], dict[str, np.ndarray]]:
    """One rank's local losses (per microbatch) and accumulated parameter gradients; must run
    with this rank's communicator installed."""
    if len(lowered.stages) != 1:
        raise NotImplementedError("eager execution of pipeline stages is not implemented")
    stage = lowered.stages[0]
    mesh = MeshGroups(lowered.mesh_axes)
    scale = float(lowered.plan.loss_scale)
    losses: list[float] = []
    grads: dict[str, torch.Tensor] = {}
    params: dict[str, torch.Tensor] = {}
    for m in range(lowered.sizes[MICROBATCH_AXIS]):
        coords = mesh.coords(rank)
        coords[MICROBATCH_AXIS] = m
        args = []
        for slot in stage.inputs:
            if slot.kind == "coord":
                args.append(torch.tensor(coords[slot.spec], dtype=torch.int64))
                continue
            local = take_local(values[slot.spec], slot.layout, coords, lowered.sizes)
            tensor = torch.from_numpy(np.ascontiguousarray(local))
            if slot.kind == "param":
                tensor = params.setdefault(slot.spec, tensor.double().requires_grad_(True))
            elif tensor.is_floating_point():
                tensor = tensor.double()
            args.append(tensor)
        outputs = stage.gm(*args)
        loss = outputs[0]
        losses.append(float(loss.detach()))
        loss.backward(torch.tensor(scale, dtype=loss.dtype))
    for name, p in params.items():
        if p.grad is not None:
            grads[name] = p.grad
    return losses, {k: v.detach().numpy() for k, v in grads.items()}


def run_threaded(lowered: Lowered, values: Mapping[str, np.ndarray]
                 ) -> list[tuple[list[float], dict[str, np.ndarray]]]:
    """Every rank as a thread of this process; results in rank order."""
    world = ThreadWorld(lowered.mesh_axes)

    def body(rank: int) -> Any:
        return rank_step(lowered, values, rank)

    return run_threads(world, body)


__all__ = ["rank_step", "run_threaded", "use_communicator"]
