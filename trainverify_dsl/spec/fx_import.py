"""An AOTAutograd joint FX graph to one IR ``Graph``.

Placeholders become named graph inputs through a naming function over their AOT descriptors
(``ParamAOTInput``, ``PlainAOTInput``, ``TangentAOTInput``...); outputs likewise. A tangent
named ``None`` is the backward seed and becomes the constant 1. The cut ops of
``spec.cut`` become graph inputs/outputs (``block_in.k``, ``block_out``, ``grad(block_out)``,
``grad(block_in.0)``). Every node keeps its torch module path and phase as its origin.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.fx

from trainverify_dsl.ir.graph import Graph, GraphBuilder, Origin, prune
from trainverify_dsl.resources import RESOURCES
from trainverify_dsl.spec.convert import (
    UnsupportedOp,
    V,
    convert_call,
    module_path,
    packet_name,
    tensor_type,
)
from trainverify_dsl.spec.cut import ANCHOR_GRAD, LEAVE, LEAVE_GRAD

#: Largest tensor constant (elements) embedded in the IR as a ``literal``.
MAX_LITERAL = 65536

#: desc -> (name, kind); a tangent mapped to (None, "tangent") is the constant-1 seed.
InputNamer = Callable[[Any], tuple[str | None, str]]
#: desc -> output name, or None to drop the output.
OutputNamer = Callable[[Any], str | None]


@dataclass(frozen=True, slots=True)
class Unsupported:
    op: str
    module: str
    detail: str
    #: ``path:line`` of the user code that called the op, or ``""``.
    stack: str = ""


class UnsupportedOps(Exception):
    def __init__(self, items: list[Unsupported]) -> None:
        super().__init__(", ".join(sorted({i.op for i in items})))
        self.items = items


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def user_frame(stack_trace: str | None) -> str:
    """The innermost frame in model code (a stdlib model, installed or not, or a user's file;
    not torch's or this package's own sources), as ``path:line`` (or ``""``). Stdlib files
    are named ``stdlib/...`` and other files under the project root relative to it."""
    frames = [m for m in _FRAME.finditer(stack_trace or "") if _is_model_code(m["file"])]
    if not frames:
        return ""
    path = frames[-1]["file"]
    for root in (RESOURCES.stdlib_base, RESOURCES.project_root):
        if path.startswith(f"{root}/"):
            path = path.removeprefix(f"{root}/")
            break
    return f"{path}:{frames[-1]['line']}"


def _is_model_code(path: str) -> bool:
    if path.startswith(f"{RESOURCES.stdlib_dir}/"):
        return True
    # not torch's, not ours, and no code generated at run time (FX's `<eval_with_key>.N`)
    return "site-packages" not in path and "/trainverify_dsl/" not in path and \
        not path.startswith("<")


def _origin(node: torch.fx.Node, strip: str) -> Origin:
    path, phase = module_path(node.meta)
    if strip and (path == strip or path.startswith(strip + ".")):
        path = path[len(strip) + 1:]
    return Origin(module=path, phase=phase, source=str(node.target),
                  stack=user_frame(node.meta.get("stack_trace")))


def _map_args(value: Any, env: dict[torch.fx.Node, Any]) -> Any:
    if isinstance(value, torch.fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        return type(value)(_map_args(v, env) for v in value)
    return value


def _cut_inputs(graph: torch.fx.Graph) -> list[tuple[str, Any]]:
    """Graph inputs created by cut ops: (name, fake value)."""
    extra: list[tuple[str, Any]] = []
    for node in graph.nodes:
        if node.op == "call_function" and packet_name(node.target) == LEAVE:
            extra.append(("block_out", node.meta["val"]))
        if node.op == "call_function" and packet_name(node.target) == LEAVE_GRAD:
            extra.append(("grad(block_in.0)", node.meta["val"]))
    return extra


class _Importer:
    def __init__(self, gm: torch.fx.GraphModule, name_input: InputNamer, strip: str) -> None:
        self.gm, self.name_input, self.strip = gm, name_input, strip
        self.builder = GraphBuilder()
        self.env: dict[torch.fx.Node, Any] = {}
        self.cut_outputs: list[tuple[str, V]] = []
        self.unsupported: list[Unsupported] = []
        self.input_values: dict[str, V] = {}

    def add_inputs(self) -> None:
        seeds = []
        for node in self.gm.graph.nodes:
            if node.op != "placeholder":
                continue
            name, kind = self.name_input(node.meta.get("desc"))
            if name is None:
                seeds.append(node)
            elif name in self.input_values:  # a tied parameter under a second name
                self.env[node] = self.input_values[name]
            else:
                value = V(self.builder.add_input(name, kind, tensor_type(node.meta["val"])))
                self.env[node] = self.input_values[name] = value
        cut_values = {}
        for name, val in _cut_inputs(self.gm.graph):
            cut_values[name] = V(self.builder.add_input(name, "activation", tensor_type(val)))
        self.cut_values = cut_values
        for node in seeds:
            t = tensor_type(node.meta["val"])
            self.env[node] = V(self.builder.add("full", (), {"shape": t.shape, "value": 1.0,
                                                              "dtype": t.dtype}))

    def run_cut(self, node: torch.fx.Node, name: str) -> None:
        args = _map_args(node.args, self.env)
        if name == LEAVE:
            self.cut_outputs.append(("block_in.0", args[0]))
            self.cut_outputs += [(f"block_in.{k + 1}", v) for k, v in enumerate(args[1])]
            self.env[node] = self.cut_values["block_out"]
        elif name == ANCHOR_GRAD:
            self.cut_outputs.append(("grad(block_out)", args[0]))
            self.env[node] = None
        else:
            self.env[node] = self.cut_values["grad(block_in.0)"]

    def run_constant(self, node: torch.fx.Node, value: Any) -> None:
        """A tensor constant of the traced code (``torch.tensor([...])`` in a forward)."""
        from torch._subclasses.fake_tensor import FakeTensor

        origin = _origin(node, self.strip)
        if not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor) or \
                value.numel() > MAX_LITERAL:
            self.unsupported.append(Unsupported("tensor constant", origin.module,
                                                f"{node.target} is not a small real tensor",
                                                origin.stack))
            self.env[node] = None
            return
        type_ = tensor_type(value)
        values = tuple(value.detach().reshape(-1).tolist())
        self.env[node] = V(self.builder.add("literal", (), {"shape": type_.shape,
                                                            "dtype": type_.dtype,
                                                            "values": values}, type_, origin))

    def run_node(self, node: torch.fx.Node) -> None:
        name = packet_name(node.target)
        if name in (LEAVE, LEAVE_GRAD, ANCHOR_GRAD):
            self.run_cut(node, name)
            return
        if any(self.env.get(n) is None for n in node.all_input_nodes):
            self.env[node] = None  # derived only from the cut's anchor gradient: dead
            return
        args = _map_args(node.args, self.env)
        if name == "getitem":
            lazy = args[0][args[1]]
            self.env[node] = lazy() if callable(lazy) else lazy
            return
        kwargs = _map_args(dict(node.kwargs), self.env)
        origin = _origin(node, self.strip)
        try:
            self.env[node] = convert_call(self.builder, node.target, tuple(args), kwargs,
                                          node.meta.get("val"), origin)
        except UnsupportedOp as error:
            self.unsupported.append(Unsupported(name, origin.module, str(error), origin.stack))
            self.env[node] = None


def _prescan(gm: torch.fx.GraphModule, strip: str) -> list[Unsupported]:
    from trainverify_dsl.spec.convert import CONVERTERS

    known = set(CONVERTERS) | {"getitem", LEAVE, LEAVE_GRAD, ANCHOR_GRAD}
    items = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and packet_name(n.target) not in known:
            origin = _origin(n, strip)
            items.append(Unsupported(packet_name(n.target), origin.module, "no converter",
                                     origin.stack))
    return items


def import_joint(gm: torch.fx.GraphModule, name_input: InputNamer, name_output: OutputNamer,
                 strip: str = "") -> Graph:
    """Convert ``gm``; raises ``UnsupportedOps`` listing every op the IR cannot express."""
    missing = _prescan(gm, strip)
    if missing:
        raise UnsupportedOps(missing)
    importer = _Importer(gm, name_input, strip)
    importer.add_inputs()
    output_node = None
    for node in gm.graph.nodes:
        if node.op == "call_function":
            importer.run_node(node)
        elif node.op == "get_attr":
            importer.run_constant(node, getattr(gm, node.target, None))
        elif node.op == "output":
            output_node = node
    if importer.unsupported:
        raise UnsupportedOps(importer.unsupported)
    assert output_node is not None
    _add_outputs(importer, output_node, name_output)
    return prune(importer.builder.build())


def _add_outputs(importer: _Importer, output_node: torch.fx.Node,
                 name_output: OutputNamer) -> None:
    values = output_node.args[0]
    descs = output_node.meta.get("desc") or [None] * len(values)
    named: dict[str, int] = {}
    for value, desc in zip(values, descs, strict=True):
        name = name_output(desc) if desc is not None else None
        if name is None or value is None:
            continue
        handle = importer.env[value].id
        if name in named:  # a tied parameter's gradients add up
            handle = importer.builder.add("add", (named[name], handle))
        named[name] = handle
    for name, handle in named.items():
        importer.builder.add_output(name, handle)
    for name, handle in importer.cut_outputs:
        importer.builder.add_output(name, handle.id)
