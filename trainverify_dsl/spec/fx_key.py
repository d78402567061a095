"""A canonical key of an FX graph: equal keys mean the same program up to node names.

Tracing a block of the model (export, decomposition, differentiation) costs about a second;
a model repeats the same block tens of times. Torch's pipeline is a deterministic function of
the graph it is given and the shapes and dtypes of its arguments, so two graphs with equal
keys give the same joint graph, up to names and the module paths carried in node metadata.
The key is exact, never a proxy: every node in order with its op, target and arguments (nodes
as positions), every placeholder's shape and dtype, every tensor constant's values. A graph
the key cannot describe exactly (a ``call_module`` node, a fake constant whose values are
unknown, an argument of an unknown type) has no key (``None``) and is traced itself.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import torch
import torch.fx

from trainverify_dsl.ir.graph import Graph
from trainverify_dsl.spec.convert import module_path


class _Opaque(ValueError):
    """A value the key cannot describe exactly."""


_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format)


def _value(value: Any, index: Mapping[torch.fx.Node, int]) -> Any:
    if isinstance(value, torch.fx.Node):
        return ("node", index[value])
    if isinstance(value, _PLAIN):
        return (type(value).__name__, repr(value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_value(v, index) for v in value))
    if isinstance(value, dict):
        items = sorted(((repr(k), v) for k, v in value.items()), key=lambda kv: kv[0])
        return ("dict", tuple((k, _value(v, index)) for k, v in items))
    if isinstance(value, slice):
        return ("slice", _value((value.start, value.stop, value.step), index))
    raise _Opaque(type(value).__name__)


def _target(target: Any) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket,
                           torch._ops.HigherOrderOperator)):
        return f"op:{target}"
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if module is None or name is None:
        raise _Opaque(repr(target))
    return f"fn:{module}.{name}"


def tensor_key(value: Any) -> tuple[Any, ...]:
    """Shape, dtype and values of a real tensor (a fake or meta one has no key)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor) or \
            value.device.type == "meta" or value.is_sparse:
        raise _Opaque("a tensor constant without known values")
    try:
        data = value.detach().cpu().contiguous().reshape(-1)
        raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
    except (RuntimeError, TypeError) as error:  # a dtype numpy cannot hold, a quantized one
        raise _Opaque(str(error)) from None
    return (tuple(value.shape), str(value.dtype), raw)


def _attr(gm: torch.fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _entries(gm: torch.fx.GraphModule) -> Iterator[tuple[Any, ...]]:
    index: dict[torch.fx.Node, int] = {}
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                yield ("placeholder", tuple(int(s) for s in val.shape), str(val.dtype),
                       bool(val.requires_grad))
            else:
                yield ("placeholder", _value(val, index))
        elif node.op == "get_attr":
            yield ("get_attr", tensor_key(_attr(gm, node.target)))
        elif node.op in ("call_function", "output"):
            yield (node.op, _target(node.target), _value(node.args, index),
                   _value(node.kwargs, index))
        else:  # call_module, call_method: code the key does not see
            raise _Opaque(node.op)


def graph_key(gm: torch.fx.GraphModule, *extra: Any) -> tuple[Any, ...] | None:
    """The canonical key of ``gm`` (with ``extra``, hashable facts of the caller), or
    ``None`` when some part of it cannot be described exactly (module docstring)."""
    try:
        return (tuple(_entries(gm)),) + extra
    except _Opaque:
        return None


def _where(node: torch.fx.Node) -> tuple[str, str]:
    from trainverify_dsl.spec.fx_import import user_frame

    return module_path(node.meta)[0], user_frame(node.meta.get("stack_trace"))


def relabel(graph: Graph, old: torch.fx.GraphModule, new: torch.fx.GraphModule
            ) -> Graph | None:
    """``graph``, imported from the joint of ``old``, with each node's origin (module path,
    user frame) moved to those of the node of ``new`` at the same position (``old`` and
    ``new`` have equal keys); ``None`` when the positions do not say it exactly (a path or
    frame of ``old`` at two different ones of ``new``, or one in ``graph`` that no node of
    ``old`` has)."""
    modules: dict[str, str] = {"": ""}
    frames: dict[str, str] = {"": ""}
    for a, b in zip(old.graph.nodes, new.graph.nodes, strict=True):
        (module_a, frame_a), (module_b, frame_b) = _where(a), _where(b)
        if modules.setdefault(module_a, module_b) != module_b or \
                frames.setdefault(frame_a, frame_b) != frame_b:
            return None
    # nodes that share one origin object keep sharing one, and an origin that does not move
    # stays the very object (the shared empty one): the proof cache's key pickles the
    # program, and pickle's bytes depend on which objects are shared
    moved: dict[int, Any] = {}
    nodes = []
    for node in graph.nodes:
        origin = node.origin
        if id(origin) not in moved:
            module, frame = modules.get(origin.module), frames.get(origin.stack)
            if module is None or frame is None:
                return None
            moved[id(origin)] = origin if (module, frame) == (origin.module, origin.stack) \
                else replace(origin, module=module, stack=frame)
        nodes.append(node.replace(origin=moved[id(origin)]))
    return replace(graph, nodes=tuple(nodes))


class KeyMemo:
    """What was made for each canonical key, the ``size`` most recently used kept: shared by
    every trace of the process, so a loop checking many plans of one model (an auto-parallel
    search through ``api.check``) differentiates each distinct block once, not once a plan."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any) -> Any:
        if key is None or key not in self._items:
            return None
        self._items.move_to_end(key)
        return self._items[key]

    def put(self, key: Any, value: Any) -> None:
        if key is None:
            return
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
