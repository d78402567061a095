"""Cut points: custom ops that mark where the repeated blocks sit in the outer model.

To trace the model without its blocks, the block list is replaced by one ``BlockStub`` whose
forward returns ``tvp::leave(h, extras)``: the traced outer graph then shows the block inputs
(operands of ``leave``), the final block output (the result of ``leave``), and in the backward
the gradient arriving at the final block output (operand of ``tvp::leave_grad``) and the one
leaving towards the prefix (its result). ``spec.trace`` turns these into graph inputs/outputs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

LEAVE = "tvp.leave"
LEAVE_GRAD = "tvp.leave_grad"
ANCHOR_GRAD = "tvp.anchor_grad"
#: Name of the stub's anchor parameter (relative to the stub).
ANCHOR = "anchor"


@torch.library.custom_op("tvp::leave", mutates_args=())
def leave(h: torch.Tensor, extras: list[torch.Tensor], anchor: torch.Tensor) -> torch.Tensor:
    return h.clone()


@leave.register_fake
def _leave_fake(h: torch.Tensor, extras: list[torch.Tensor],
                anchor: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(h)


@torch.library.custom_op("tvp::anchor_grad", mutates_args=())
def anchor_grad(grad: torch.Tensor) -> torch.Tensor:
    return grad.sum() * 0


@anchor_grad.register_fake
def _anchor_grad_fake(grad: torch.Tensor) -> torch.Tensor:
    return grad.new_empty(())


@torch.library.custom_op("tvp::leave_grad", mutates_args=())
def leave_grad(grad: torch.Tensor) -> torch.Tensor:
    return grad.clone()


@leave_grad.register_fake
def _leave_grad_fake(grad: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(grad)


def _leave_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.n_extras = len(inputs[1])
    ctx.anchor_dtype = inputs[2].dtype
    ctx.h_needs_grad = inputs[0].requires_grad


def _leave_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, list[None], torch.Tensor]:
    # The anchor (a stub parameter) always asks for a gradient, so the backward always reaches
    # the cut and the gradient at the final block output shows up as anchor_grad's operand.
    grad_h = leave_grad(grad) if ctx.h_needs_grad else None
    return grad_h, [None] * ctx.n_extras, anchor_grad(grad).to(ctx.anchor_dtype)


leave.register_autograd(_leave_backward, setup_context=_leave_setup)


class BlockStub(nn.Module):
    """Stands in for the whole block list; records how the first block was called."""

    def __init__(self, record: bool = False) -> None:
        super().__init__()
        #: ``record``: each call's arguments and result are kept (a plain run, never an
        #: export, which would take the kept tensors for unregistered state)
        self.record = record
        self.calls: list[tuple[tuple[object, ...], dict[str, object]]] = []
        #: what each call returned (``spec.trace.capture_stub_call`` follows the chain)
        self.returned: list[torch.Tensor] = []
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, *args: object, **kwargs: object) -> torch.Tensor:
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        out = leave(tensors[0], tensors[1:], self.anchor)
        if self.record:
            self.calls.append((args, kwargs))
            self.returned.append(out)
        return out
