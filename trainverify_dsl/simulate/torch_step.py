"""The reference step in eager torch: every simulation checks its reference IR against it.

``tvp simulate`` evaluates two IR programs through one importer and one interpreter, so an
error they share (a wrong op semantics, a mistranslated optimizer) would be invisible in their
comparison. Before any verdict, the reference IR's loss, gradients, updated parameters,
optimizer states and values at marked points (``point:<point>``, recorded here by forward
hooks on the modules) are compared with this: the spec model run in float64 with
``torch.autograd`` on the whole batch and stepped with ``torch.optim`` (single-tensor
implementation) from the same states, at the checked step number. Nothing here goes through
the tracer, the IR or the interpreter. If the two disagree, the simulation stops with
``ReferenceDisagrees``: a verdict built on that reference would mean nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from trainverify_dsl.spec import optim
from trainverify_dsl.spec.float64 import Float64
from trainverify_dsl.spec.load import USER_CODE_ERRORS
from trainverify_dsl.spec.marks import POINT, point_values
from trainverify_dsl.spec.trace import run_error

#: the IR's state names (``spec.optim``) -> torch.optim's
TORCH_STATE = {"m": "exp_avg", "v": "exp_avg_sq", "momentum": "momentum_buffer"}


class ReferenceDisagrees(Exception):
    """The traced reference step differs from eager torch: an error in the trusted base."""


def _torch_optimizer(named: Mapping[str, torch.Tensor], recipe: optim.Recipe
                     ) -> torch.optim.Optimizer:
    """torch.optim's optimizer for ``recipe``: one parameter group per distinct config
    (``spec.optim.Groups``), in the order the parameters come."""
    groups: dict[optim.Optimizer, list[torch.Tensor]] = {}
    for name, p in named.items():
        groups.setdefault(optim.config_of(recipe, name), []).append(p)
    first = next(iter(groups), None) or (
        recipe.default if isinstance(recipe, optim.Groups) else recipe)
    if isinstance(first, optim.SGD):
        return torch.optim.SGD(
            [{"params": ps, "lr": o.lr, "momentum": o.momentum, "dampening": o.dampening,
              "weight_decay": o.weight_decay, "nesterov": o.nesterov}
             for o, ps in groups.items()], lr=first.lr, foreach=False)
    kind = torch.optim.AdamW if first.decoupled else torch.optim.Adam
    return kind([{"params": ps, "lr": o.lr, "betas": o.betas, "eps": o.eps,
                  "weight_decay": o.weight_decay} for o, ps in groups.items()],
                foreach=False)


def _record_points(net: torch.nn.Module, points: Sequence[str],
                   seen: dict[str, np.ndarray]) -> list[Any]:
    """Forward hooks recording the floating-point values at ``points`` (``X.in``, ``X.in#k``,
    ``X.out``) into ``seen`` as ``point:<point>``; a module called twice keeps its last call's.
    """
    wanted = set(points)
    handles = []
    for path in sorted({p.rsplit(".", 1)[0] for p in points}):
        module = net.get_submodule(path)

        def keep(point: str, value: Any) -> None:
            if point in wanted and isinstance(value, torch.Tensor) and value.is_floating_point():
                seen[f"{POINT}{point}"] = value.detach().numpy().copy()

        def pre(_m: Any, args: tuple[Any, ...], _p: str = path) -> None:
            for k, a in enumerate(args):
                keep(f"{_p}.in" if k == 0 else f"{_p}.in#{k}", a)

        def post(_m: Any, _a: Any, out: Any, _p: str = path) -> None:
            keep(f"{_p}.out", out)

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    return handles


def torch_step(model: torch.nn.Module, values: Mapping[str, np.ndarray], data: Sequence[str],
               opt: optim.Recipe | None, points: Sequence[str] = ()
               ) -> dict[str, np.ndarray]:
    """``loss``, ``grad(p)``, ``new(p)``, ``new(<state>(p))`` and ``point:<point>`` for each
    of ``points`` of one step of ``model`` on ``values`` (parameters, buffers, inputs ``data``
    in call order, states ``m(p)``...)."""
    net = copy.deepcopy(model).double()
    with torch.no_grad():
        for name, tensor in [*net.named_parameters(), *net.named_buffers()]:
            if name in values and tensor.is_floating_point():
                tensor.copy_(torch.from_numpy(np.asarray(values[name], dtype=np.float64)))
    out: dict[str, np.ndarray] = {}
    handles = _record_points(net, points, out)
    try:
        with Float64():
            loss = net(*(torch.from_numpy(np.asarray(values[d])) for d in data))
            loss.backward()
    except USER_CODE_ERRORS as error:  # the model's own code: located, not a traceback
        raise run_error(error, model) from None
    finally:
        for handle in handles:
            handle.remove()
    # a parameter the loss does not use has no gradient, and torch's optimizers skip it: no
    # `grad(p)` and no update, as in the reference IR (``spec.optim.append_optimizer``)
    named = {n: p for n, p in net.named_parameters() if p.grad is not None}
    out["loss"] = loss.detach().numpy().copy()
    for name, p in named.items():
        out[f"grad({name})"] = p.grad.numpy().copy()
    if opt is None:
        return out
    if opt.max_grad_norm is not None:  # the single-device recipe's clipping
        norm = torch.nn.utils.clip_grad_norm_(list(named.values()), opt.max_grad_norm,
                                              foreach=False)
        out["clip.coef"] = np.array(min(1.0, opt.max_grad_norm / (float(norm) + optim.CLIP_EPS)))
        out["clip.total"] = np.array(float(norm) ** 2)
    torch_opt = _torch_optimizer(named, opt)
    for name, p in named.items():  # start from the drawn states, one step before the checked
        own = optim.config_of(opt, name)
        state: dict[str, Any] = {TORCH_STATE[s]: torch.from_numpy(
            np.array(values[f"{s}({name})"], dtype=np.float64)) for s in own.states}
        if isinstance(own, optim.Adam):
            state["step"] = torch.tensor(float(own.step - 1))
        if state:
            torch_opt.state[p] = state
    torch_opt.step()
    for name, p in named.items():
        out[f"new({name})"] = p.detach().numpy().copy()
        for s in optim.config_of(opt, name).states:
            out[f"new({s}({name}))"] = torch_opt.state[p][TORCH_STATE[s]].numpy().copy()
    return out


def check_reference(want: Mapping[str, np.ndarray], model: torch.nn.Module,
                    values: Mapping[str, np.ndarray], data: Sequence[str],
                    opt: optim.Recipe | None, tolerance: float, floor: float,
                    roundoff: Any = None) -> int:
    """Compare the reference IR's outputs ``want`` (its values at marked points included)
    with ``torch_step``; raises
    ``ReferenceDisagrees`` on a missing or differing output; returns how many were compared.
    Errors are relative to the largest entry of the output, or ``floor`` times the largest
    entry of all outputs if that is more (float64 round-off of one computation done in two
    orders). ``roundoff`` (``simulate.run.Roundoff``): an error the reference's own float64
    round-off explains is no difference."""
    points = list(point_values(want))
    eager = torch_step(model, values, data, opt, points)
    missing = sorted(set(eager) ^ set(want))
    if missing:
        ungraded = [m[len("grad("):-1] for m in missing
                    if m.startswith("grad(") and m in want and m not in eager]
        hint = (f": eager torch gives {', '.join(f'`{n}`' for n in ungraded[:3])} no "
                "gradient (a parameter read only under `torch.no_grad()`), and the checked "
                "step gives every parameter one; a constant is a buffer "
                "(`register_buffer`)") if ungraded else ""
        raise ReferenceDisagrees(f"the reference IR and eager torch do not produce the same "
                                 f"outputs: {', '.join(missing[:5])}{hint}")
    magnitude = max((float(np.max(np.abs(v))) for k, v in eager.items()
                     if np.size(v) and not k.startswith(POINT)), default=1.0)
    errors: dict[str, float] = {}
    scales: dict[str, float] = {}
    for name, expected in eager.items():
        got = np.asarray(want[name], dtype=np.float64)
        expected = np.asarray(expected, dtype=np.float64)
        if got.shape != expected.shape:
            raise ReferenceDisagrees(f"the reference IR gives `{name}` the shape {got.shape}, "
                                     f"eager torch {expected.shape}")
        # relative to the output's largest entry, never to less than a millionth of the
        # largest of all (a gradient that is zero in real arithmetic is round-off both sides)
        own = float(np.max(np.abs(expected))) if expected.size else 0.0
        scale = scales[name] = max(own, floor * magnitude, 1e-300)
        errors[name] = float(np.max(np.abs(got - expected))) / scale if expected.size else 0.0
    for name, error in errors.items():
        if not error < tolerance and not (
                roundoff is not None and roundoff.explains(error, name, scales[name])):
            own_backward = name.startswith("grad(") and errors.get("loss", np.inf) < tolerance
            raise ReferenceDisagrees(
                f"the reference step's IR differs from eager torch on `{name}` (relative error "
                f"{error:.3g}): the simulation's trusted base is wrong here, so no verdict "
                "is given; " + (
                    "the loss agrees and a gradient does not: if the model defines a backward "
                    "of its own (a `torch.autograd.Function` whose backward is not its "
                    "forward's derivative, a tensor hook), that is not supported (the "
                    "checked step differentiates the forward); otherwise please report it"
                    if own_backward else "please report it"))
    return len(eager)

