"""Optimizer steps as IR, appended to a traced training step.

Each optimizer is a frozen config; ``append_optimizer`` adds, for every parameter ``p``, a call
of an elementwise update graph (one graph per distinct parameter type, reused across
parameters) reading ``p``, ``grad(p)`` and the states, and producing ``new(p)`` and the new
states. States are program inputs of kind ``state`` named ``m(p)``/``v(p)`` (Adam) or
``momentum(p)`` (SGD with momentum), outputs ``new(m(p))``... The step number ``t`` and the
hyperparameters are constants in the update graph. The arithmetic follows ``torch.optim``'s
single-tensor (``foreach=False``) implementation, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainverify_dsl.ir.graph import Graph, GraphBuilder, GraphInput, Origin
from trainverify_dsl.ir.program import Call, Program
from trainverify_dsl.ir.types import TensorType
from trainverify_dsl.spec.program import SpecProgram

OPTIMIZER_ORIGIN = Origin(phase="optimizer")


@dataclass(frozen=True, slots=True)
class SGD:
    """torch.optim.SGD: weight decay, momentum (buffer = grad on step 1), dampening, nesterov."""

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    step: int = 1
    #: the recipe's ``clip_grad_norm_`` before the step (``None``: no clipping)
    max_grad_norm: float | None = None

    @property
    def states(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()


@dataclass(frozen=True, slots=True)
class Adam:
    """torch.optim.Adam (L2 weight decay added to the gradient) at step ``step``."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    step: int = 1
    decoupled: bool = False
    #: the recipe's ``clip_grad_norm_`` before the step (``None``: no clipping)
    max_grad_norm: float | None = None

    @property
    def states(self) -> tuple[str, ...]:
        return ("m", "v")


def AdamW(lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
          weight_decay: float = 0.01, step: int = 1, max_grad_norm: float | None = None) -> Adam:
    """torch.optim.AdamW: decoupled weight decay ``p *= 1 - lr * wd`` before the Adam step."""
    return Adam(lr, betas, eps, weight_decay, step, decoupled=True, max_grad_norm=max_grad_norm)


Optimizer = SGD | Adam


@dataclass(frozen=True, slots=True)
class Groups:
    """A recipe with torch.optim parameter groups: each group's parameters (by name) are
    updated with its config, every other parameter with ``default``. Clipping is one global
    norm: ``default``'s ``max_grad_norm``."""

    default: Optimizer
    groups: tuple[tuple[frozenset[str], Optimizer], ...]

    def config(self, param: str) -> Optimizer:
        return next((opt for names, opt in self.groups if param in names), self.default)

    def index(self, param: str) -> int:
        """The group of ``param`` (``-1``: ``default``)."""
        return next((k for k, (names, _) in enumerate(self.groups) if param in names), -1)

    @property
    def max_grad_norm(self) -> float | None:
        return self.default.max_grad_norm


#: A reference recipe: one optimizer for every parameter, or parameter groups.
Recipe = Optimizer | Groups


def config_of(recipe: Recipe, param: str) -> Optimizer:
    """The optimizer that updates ``param`` under ``recipe``."""
    return recipe.config(param) if isinstance(recipe, Groups) else recipe


class _Ops:
    """Elementwise helpers over one update graph; scalars become 0-d constants."""

    def __init__(self, builder: GraphBuilder, type_: TensorType) -> None:
        self.b, self.type = builder, type_

    def c(self, value: float) -> int:
        return self.b.add("full", (), {"shape": (), "value": float(value),
                                       "dtype": self.type.dtype}, origin=OPTIMIZER_ORIGIN)

    def op(self, name: str, *operands: int) -> int:
        return self.b.add(name, operands, origin=OPTIMIZER_ORIGIN)

    def scale(self, x: int, k: float) -> int:
        return self.op("mul", x, self.c(k))

    def axpy(self, x: int, k: float, y: int) -> int:
        """x + k * y"""
        return self.op("add", x, self.scale(y, k))


def _sgd_graph(opt: SGD, type_: TensorType) -> Graph:
    b = GraphBuilder()
    p, g = b.add_input("param", "param", type_), b.add_input("grad", "activation", type_)
    buf = b.add_input("momentum", "state", type_) if opt.momentum else None
    o = _Ops(b, type_)
    if opt.weight_decay:
        g = o.axpy(g, opt.weight_decay, p)
    if buf is not None:
        if opt.step > 1:
            buf = o.axpy(o.scale(buf, opt.momentum), 1.0 - opt.dampening, g)
        else:
            buf = g
        g = o.axpy(g, opt.momentum, buf) if opt.nesterov else buf
    b.add_output("new(param)", o.axpy(p, -opt.lr, g))
    if buf is not None:
        b.add_output("new(momentum)", buf)
    return b.build()


def _adam_graph(opt: Adam, type_: TensorType) -> Graph:
    b = GraphBuilder()
    p, g = b.add_input("param", "param", type_), b.add_input("grad", "activation", type_)
    m, v = b.add_input("m", "state", type_), b.add_input("v", "state", type_)
    o = _Ops(b, type_)
    beta1, beta2 = opt.betas
    if opt.weight_decay and opt.decoupled:
        p = o.scale(p, 1.0 - opt.lr * opt.weight_decay)
    elif opt.weight_decay:
        g = o.axpy(g, opt.weight_decay, p)
    m = o.axpy(m, 1.0 - beta1, o.op("sub", g, m))  # torch: m.lerp_(g, 1 - beta1)
    v = o.axpy(o.scale(v, beta2), 1.0 - beta2, o.op("mul", g, g))
    correction1 = 1.0 - beta1 ** opt.step
    correction2_sqrt = (1.0 - beta2 ** opt.step) ** 0.5
    denom = o.op("add", o.op("div", o.op("sqrt", v), o.c(correction2_sqrt)), o.c(opt.eps))
    step = o.op("div", m, denom)
    b.add_output("new(param)", o.axpy(p, -opt.lr / correction1, step))
    b.add_output("new(m)", m)
    b.add_output("new(v)", v)
    return b.build()


def update_graph(opt: Optimizer, type_: TensorType) -> Graph:
    """The elementwise update of one parameter of type ``type_``."""
    return _sgd_graph(opt, type_) if isinstance(opt, SGD) else _adam_graph(opt, type_)


def _graph_name(type_: TensorType) -> str:
    return f"optimizer.{type_.dtype}[{','.join(map(str, type_.shape))}]"


# -- gradient clipping (docs/semantics.md §6.3) ----------------------------------------------

#: torch.nn.utils.clip_grad_norm_'s guard: ``coef = max_norm / (total_norm + 1e-6)``
CLIP_EPS = 1e-6
CLIP_ORIGIN = Origin(phase="clip-grad-norm")


def _scalar(dtype: str) -> TensorType:
    return TensorType((), dtype)


def square_sum_graph(type_: TensorType) -> Graph:
    """``grad -> sum(grad * grad)`` (a 0-d value): one tensor's share of the squared norm."""
    b = GraphBuilder()
    g = b.add_input("grad", "activation", type_)
    square = b.add("mul", (g, g), origin=CLIP_ORIGIN)
    b.add_output("square", b.add("sum", (square,), {"dims": tuple(range(len(type_.shape))),
                                                    "keepdim": False}, origin=CLIP_ORIGIN))
    return b.build()


def scalar_add_graph(dtype: str) -> Graph:
    """``(a, b) -> a + b`` on 0-d values: squared norms accumulate through it."""
    b = GraphBuilder()
    x, y = b.add_input("a", "activation", _scalar(dtype)), \
        b.add_input("b", "activation", _scalar(dtype))
    b.add_output("sum", b.add("add", (x, y), origin=CLIP_ORIGIN))
    return b.build()


def clip_coefficient_graph(max_norm: float, dtype: str) -> Graph:
    """``total -> min(1, max_norm / (sqrt(total) + 1e-6))``: torch's clip coefficient from
    the total squared norm (``clip_grad_norm_`` with ``norm_type=2``)."""
    b = GraphBuilder()
    total = b.add_input("total", "activation", _scalar(dtype))
    o = _Ops(b, _scalar(dtype))
    norm = o.op("add", o.op("sqrt", total), o.c(CLIP_EPS))
    coef = o.op("div", o.c(max_norm), norm)
    b.add_output("coef", b.add("clamp", (coef,), {"min": None, "max": 1.0},
                               origin=CLIP_ORIGIN))
    return b.build()


def clip_scale_graph(type_: TensorType) -> Graph:
    """``(grad, coef) -> grad * coef``: the clipped gradient."""
    b = GraphBuilder()
    g = b.add_input("grad", "activation", type_)
    coef = b.add_input("coef", "activation", _scalar(type_.dtype))
    b.add_output("clipped", b.add("mul", (g, coef), origin=CLIP_ORIGIN))
    return b.build()


def _append_clip(graphs: dict[str, Graph], calls: list[Call], grads: list[tuple[str, TensorType]],
                 max_norm: float) -> tuple[dict[str, str], str | None]:
    """Calls clipping every gradient by the total norm (the single-device
    ``clip_grad_norm_(model.parameters(), max_norm)``); returns grad -> its clipped value,
    and the name of the total squared norm."""
    total = None
    dtype = grads[0][1].dtype if grads else "f32"
    if any(t.dtype != dtype for _, t in grads):
        raise ValueError("clip-grad-norm over gradients of several dtypes is not supported")
    for grad, type_ in grads:
        name = f"clip.square{_graph_name(type_).removeprefix('optimizer')}"
        graphs.setdefault(name, square_sum_graph(type_))
        square = f"square({grad})"
        calls.append(Call(name, (grad,), (square,), label=f"{grad} squared norm"))
        if total is None:
            total = square
            continue
        graphs.setdefault(f"clip.add.{dtype}", scalar_add_graph(dtype))
        calls.append(Call(f"clip.add.{dtype}", (total, square), (f"total.{grad}",),
                          label="squared norm so far"))
        total = f"total.{grad}"
    if total is None:
        return {}, None
    graphs["clip.coefficient"] = clip_coefficient_graph(max_norm, dtype)
    calls.append(Call("clip.coefficient", (total,), ("clip.coef",), label="clip coefficient"))
    clipped = {}
    for grad, type_ in grads:
        name = f"clip.scale{_graph_name(type_).removeprefix('optimizer')}"
        graphs.setdefault(name, clip_scale_graph(type_))
        clipped[grad] = f"clipped({grad})"
        calls.append(Call(name, (grad, "clip.coef"), (clipped[grad],),
                          label=f"{grad} clipped"))
    return clipped, total


def append_optimizer(spec: SpecProgram, opt: Recipe) -> SpecProgram:
    """``spec`` with an update call per parameter and outputs ``new(p)``, ``new(<state>(p))``;
    with ``opt.max_grad_norm``, the gradients the updates read are clipped first."""
    program = spec.program
    graphs, calls = dict(program.graphs), list(program.calls)
    states, outputs = [], list(program.outputs)
    defined = {tensor for _, tensor in program.outputs}
    held = [p for p in spec.params if f"grad({p.name})" in defined]
    clipped: dict[str, str] = {}
    if opt.max_grad_norm is not None:
        clipped, total = _append_clip(graphs, calls,
                                      [(f"grad({p.name})", p.type) for p in held],
                                      opt.max_grad_norm)
        if clipped:
            # the squared norm too: a plan summing its norm over the wrong group computes
            # the coefficient 1 as the spec does whenever the norm stays below the bound
            outputs += [("clip.coef", "clip.coef"), ("clip.total", total)]
    for param in held:
        own = config_of(opt, param.name)
        name = _graph_name(param.type)
        group = opt.index(param.name) if isinstance(opt, Groups) else -1
        if group >= 0:
            name = f"{name}.group{group}"
        graphs.setdefault(name, update_graph(own, param.type))
        state_names = [f"{s}({param.name})" for s in own.states]
        states += [GraphInput(s, "state", param.type) for s in state_names]
        results = [f"new({param.name})"] + [f"new({s})" for s in state_names]
        grad = f"grad({param.name})"
        calls.append(Call(name, (param.name, clipped.get(grad, grad), *state_names),
                          tuple(results), label=f"{param.name} update"))
        outputs += [(r, r) for r in results]
    new_program = Program(program.inputs + tuple(states), tuple(graphs.items()), tuple(calls),
                          tuple(outputs))
    return replace(spec, program=new_program)


# -- optimizers named in text (the plan's `optimizer` statement, the spec line's recipe) -----

#: Hyper-parameters each optimizer accepts, with torch.optim's defaults.
DEFAULTS: dict[str, dict[str, object]] = {
    "sgd": {"lr": None, "momentum": 0.0, "dampening": 0.0, "weight-decay": 0.0,
            "nesterov": False},
    "adam": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight-decay": 0.0},
    "adamw": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight-decay": 0.01},
}

def _number(value: object) -> float:
    if isinstance(value, tuple):
        raise ValueError("expected a number, got a tuple")
    return float(value)  # type: ignore[arg-type]


def hyper_values(kind: str, hyper: dict[str, object]) -> dict[str, object]:
    """Every hyper-parameter of ``kind`` with its value (the stated one or torch's default),
    as floats (``betas`` a pair, ``nesterov`` a bool). Raises ``ValueError`` on an unknown
    kind or key, a missing ``lr`` (SGD has no default) or a malformed value."""
    if kind not in DEFAULTS:
        raise ValueError(f"unknown optimizer {kind!r} (known: {', '.join(DEFAULTS)})")
    unknown = sorted(set(hyper) - set(DEFAULTS[kind]))
    if unknown:
        raise ValueError(f"{kind} has no hyper-parameter {', '.join(unknown)}")
    out: dict[str, object] = {}
    for key, default in DEFAULTS[kind].items():
        value = hyper.get(key, default)
        if value is None:
            raise ValueError(f"{kind} needs `{key}`")
        if key == "betas":
            pair = tuple(value) if isinstance(value, tuple) else ()
            if len(pair) != 2:
                raise ValueError("`betas` is a pair (beta1, beta2)")
            out[key] = (_number(pair[0]), _number(pair[1]))
        elif key == "nesterov":
            out[key] = value in (True, "true", "True", 1)
        else:
            out[key] = _number(value)
    return out


#: The step number of the checked update: a steady-state step, where every optimizer state is
#: read (torch's first SGD step ignores the momentum buffer; with the buffer a free input,
#: step 2 covers every step's state, docs/semantics.md §6.1).
CHECKED_STEP = 2


def optimizer_config(kind: str, hyper: dict[str, object],
                     max_grad_norm: object = None) -> Optimizer:
    """The ``spec.optim`` config of an optimizer named in text (see ``hyper_values``), at
    step ``CHECKED_STEP``, clipping at ``max_grad_norm`` when given."""
    v = hyper_values(kind, hyper)
    clip = None if max_grad_norm is None else _number(max_grad_norm)
    if kind == "sgd":
        return SGD(lr=v["lr"], momentum=v["momentum"], dampening=v["dampening"],  # type: ignore[arg-type]
                   weight_decay=v["weight-decay"], nesterov=v["nesterov"],  # type: ignore[arg-type]
                   step=CHECKED_STEP, max_grad_norm=clip)
    return Adam(lr=v["lr"], betas=v["betas"], eps=v["eps"],  # type: ignore[arg-type]
                weight_decay=v["weight-decay"], step=CHECKED_STEP,
                decoupled=kind == "adamw", max_grad_norm=clip)  # type: ignore[arg-type]
