"""Model code run in float64 whatever float dtype it names.

The IR reads every float as a real number and evaluates in float64, so a cast the model
writes (Hugging Face's RMSNorm computes in ``float32`` and casts back; ``torch.ones(...,
dtype=torch.float32)``; a factory given no dtype, made in the default one) is the identity
there. Eager runs that are compared with it (the
reference check of ``simulate/torch_step.py``, the distributed oracle's single-device step
and ranks) run the model under ``Float64`` so that float32 round-off is not read as a
disagreement.
"""

from __future__ import annotations

from typing import Any

import torch

_NARROW_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_TO_FLOAT64 = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}


def _widen(value: Any) -> Any:
    return torch.float64 if isinstance(value, torch.dtype) and value in _NARROW_FLOATS \
        else value


class Float64(torch.overrides.TorchFunctionMode):
    """Every floating-point dtype the model's code asks for is float64: the IR reads every
    float as a real number and evaluates in float64, so a cast the model writes (Hugging
    Face's RMSNorm computes in ``float32`` and casts back; ``torch.ones(..., dtype=
    torch.float32)``) is the identity there, and must be here too, or float32 round-off
    would read as a disagreement of the trusted base."""

    def __enter__(self) -> Any:
        # a factory given no dtype (`torch.linspace(0.5, 1.5, d)`) makes the default one
        self._default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            torch.set_default_dtype(self._default)

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = {k: _widen(v) for k, v in (kwargs or {}).items()}
        if func in _TO_FLOAT64:
            return args[0].double()
        return func(*(_widen(a) for a in args), **kwargs)
