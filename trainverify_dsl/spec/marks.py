"""Marked module boundaries: the ``tvp::mark`` identity and the hooks that place it.

A plan talks about values at module boundaries (``X.in``, ``X.in#k``, ``X.out``). Both sides
see them the same way: a forward pre-hook passes a module's floating-point arguments through
``mark(a, "X.in")`` (the first; further ones ``X.in#k``) and a forward hook passes its output
through ``mark(y, "X.out")``. The lowering (``lower/capture.py``) replaces each mark by the
plan's collectives at that point; the spec tracer (``spec/trace.py``) imports each as an
identity whose value becomes a named output of the reference step, ``point:<point>``
(``spec/convert.py``), so the simulation and the checker read the reference's values at
marked points from the IR, not from a second run of the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

#: the mark's op name in imported graphs (``spec.convert.packet_name``)
MARK = "tvp.mark"
#: prefix of the reference step's outputs holding the value at a marked point
POINT = "point:"


@torch.library.custom_op("tvp::mark", mutates_args=())
def mark(x: torch.Tensor, point: str) -> torch.Tensor:
    """Identity that names a module boundary (``layers.0.attention.wo.out``)."""
    return x.clone()


@mark.register_fake
def _mark_fake(x: torch.Tensor, point: str) -> torch.Tensor:
    return torch.empty_like(x)


def _mark_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    return grad, None


mark.register_autograd(_mark_backward)


def point_values(outputs: Mapping[str, Any]) -> dict[str, Any]:
    """The values at marked points among a step's ``outputs``, by point (``X.out``)."""
    return {k[len(POINT):]: v for k, v in outputs.items() if k.startswith(POINT)}


def module_of(point: str) -> str:
    """``layers.0.attention`` for ``layers.0.attention.in#1``."""
    return point.rsplit(".", 1)[0]


def install_marks(model: nn.Module, modules: Iterable[str],
                  name: Callable[[str], str] = lambda path: path) -> list[Any]:
    """Hooks marking the boundaries of ``modules`` (paths in ``model``; ``""`` is ``model``
    itself); a mark's point is ``name(path)`` followed by ``.in``, ``.in#k`` or ``.out``.
    Returns the hook handles (remove them, or use ``marks``)."""
    handles = []
    for path in modules:
        module = model.get_submodule(path) if path else model
        prefix = name(path)

        def pre(_mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                _p: str = prefix) -> Any:
            marked = tuple(
                mark(a, f"{_p}.in" if k == 0 else f"{_p}.in#{k}")
                if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                for k, a in enumerate(args))
            return marked, kwargs

        def post(_mod: nn.Module, _args: Any, output: Any, _p: str = prefix) -> Any:
            if isinstance(output, torch.Tensor) and output.is_floating_point():
                return mark(output, f"{_p}.out")
            return None

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post))
    return handles


@contextlib.contextmanager
def marks(model: nn.Module, modules: Iterable[str],
          name: Callable[[str], str] = lambda path: path) -> Iterator[None]:
    """``install_marks`` for the duration of the block."""
    handles = install_marks(model, modules, name)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
