"""Trace a model's training step (forward + backward) into a ``SpecProgram``.

Everything runs on fake tensors (``FakeTensorMode``), so a 405B-parameter model costs no
memory. Each piece is traced with ``torch.export`` (non-strict, which records
``nn_module_stack`` on every node), its forward decomposed with ``decompositions()`` (Core
ATen and LayerNorm's arithmetic: the table the plan's stages are captured with,
``lower/capture.py``), and then differentiated by ``aot_export_joint_with_descriptors``
(which maps each backward node to its forward node's module path, ``fwd_nn_module_stack``);
attention runs under the math SDPA backend. Decomposing before differentiating makes every
backward torch's derivative of the same primitive ops on both sides of a check.

Block reuse: the largest ``nn.ModuleList`` is the block list. The outer model is traced with
the list replaced by a ``BlockStub`` (cut ops mark the block inputs and the final block output);
each distinct block (same class, parameter shapes, simple attributes and input types) is traced
once on its own, with a tangent input for its output. The joint graphs are split into forward
and backward phases and composed in a ``Program`` that calls the block graphs once per layer
with that layer's parameter names. ``reuse=False`` traces the whole model as one graph.

Marked points: ``points`` (``X.in``, ``X.in#k``, ``X.out``, the boundaries a plan names) are
marked while tracing (``spec/marks.py``) and become outputs ``point:<point>`` of the program.
Inside a block they are marked relative to the block (``point:@.attention.in``) and renamed per
layer by ``compose``, so marks do not stop layers from sharing one graph.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import functools
import inspect
import io
import logging
import time
import traceback
import types
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainverify_dsl.ir.graph import Graph, GraphInput
from trainverify_dsl.ir.program import Program, program_problems
from trainverify_dsl.ir.split import split_phases
from trainverify_dsl.ir.types import TensorType
from trainverify_dsl.report import codes_spec as codes
from trainverify_dsl.report.span import Span
from trainverify_dsl.spec.compose import Pieces, block_boundaries, compose, step_call
from trainverify_dsl.spec.convert import DTYPES
from trainverify_dsl.spec.cut import ANCHOR, BlockStub
from trainverify_dsl.spec.errors import SpecError, fail, fail_at, spec_span
from trainverify_dsl.spec.fx_import import UnsupportedOps, import_joint, user_frame
from trainverify_dsl.spec.fx_key import KeyMemo, graph_key, tensor_key
from trainverify_dsl.spec.marks import POINT, marks, module_of
from trainverify_dsl.spec.program import BlockGroup, SpecProgram

#: name -> (shape, dtype), in forward-argument order
InputSpecs = Mapping[str, tuple[tuple[int, ...], torch.dtype]]


class _NoReuse(Exception):
    """Block reuse is impossible for this model; the reason is a note."""


def fake_mode_of(model: nn.Module) -> Any:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    for tensor in list(model.parameters()) + list(model.buffers()):
        if isinstance(tensor, FakeTensor):
            return tensor.fake_mode
    return FakeTensorMode(allow_non_fake_inputs=True)


def _fakeify(model: nn.Module, mode: Any) -> nn.Module:
    """A copy of a real-valued model whose parameters and buffers are fake (same names)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if all(isinstance(t, FakeTensor) for t in list(model.parameters()) + list(model.buffers())):
        return model
    fake = copy.deepcopy(model)
    converted: dict[int, Any] = {}  # shared (tied) tensors stay shared
    for module in fake.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in converted:
                    converted[id(p)] = nn.Parameter(mode.from_tensor(p.detach()),
                                                    requires_grad=p.requires_grad)
                module._parameters[name] = converted[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = converted.setdefault(id(b), mode.from_tensor(b))
    return fake


#: The largest tensor dimension torch can describe (sizes are int64).
MAX_DIM = 2**63 - 1


def _input_spec_problem(name: Any, spec: Any) -> str | None:
    """Why one ``name -> (shape, dtype)`` entry is malformed, or ``None``."""
    if not isinstance(name, str):
        return f"input name {name!r} is not a string"
    if not (isinstance(spec, tuple | list) and len(spec) == 2):
        return f"input {name!r} maps to {spec!r}, not a (shape, dtype) pair"
    shape, dtype = spec
    if dtype not in DTYPES:
        return f"input {name!r} has dtype {dtype!r}; supported: " + ", ".join(
            str(d).removeprefix("torch.") for d in DTYPES)
    if not isinstance(shape, tuple | list | torch.Size) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in shape):
        return f"input {name!r} has shape {shape!r}, not a sequence of integers"
    if not all(1 <= s <= MAX_DIM for s in shape):
        return f"input {name!r} has shape {tuple(shape)}: every dimension must be at least 1 " \
               f"and at most {MAX_DIM}"
    return None


def check_input_specs(specs: Any, where: str = "") -> None:
    """A ``SpecError`` (TVP307) unless ``specs`` is a non-empty ``{name: (shape, dtype)}``
    of whole positive sizes and dtypes the IR has."""
    if not isinstance(specs, Mapping) or not specs:
        raise fail(codes.BAD_INPUT_SPEC, f"input specs must be a non-empty mapping "
                   f"{{name: (shape, dtype)}}, got {specs!r:.200}", where)
    for name, spec in specs.items():
        problem = _input_spec_problem(name, spec)
        if problem is not None:
            raise fail(codes.BAD_INPUT_SPEC, problem, where)


def _example_inputs(specs: InputSpecs) -> tuple[torch.Tensor, ...]:
    check_input_specs(specs)
    inputs = []
    for name, spec in specs.items():
        shape, dtype = spec
        try:
            inputs.append(torch.zeros(tuple(shape), dtype=dtype))
        except RuntimeError as error:  # e.g. more elements than torch can index
            raise fail(codes.BAD_INPUT_SPEC, f"input {name!r} of shape {tuple(shape)} cannot "
                       f"be built: {str(error).strip().splitlines()[0]}") from None
    return tuple(inputs)


def decompositions() -> dict[Any, Any]:
    """The one decomposition table of both programs: Core ATen's, plus LayerNorm and batch
    normalisation as their arithmetic (so layouts propagate through them). The reference
    step's forward (``_joint``) and each plan stage's forward (``lower/capture.py``) are
    decomposed with it
    *before* they are differentiated, and so are the joint graphs and the algorithms'
    local programs (``lower/joint.py``, ``lower/algorithms.py``): both backwards are then
    torch's derivatives of the same primitive ops. Two decompositions of one function are
    equal in value but not in form, and the checker compares forms: with the reference
    differentiating ``native_layer_norm`` as one op (its fused backward formula) and the
    plan differentiating LayerNorm's arithmetic, no GPT-2 plan could be proven."""
    return dict(_decomposition_table())  # a copy: torch may edit the table it is given


@functools.cache
def _decomposition_table() -> dict[Any, Any]:
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = dict(core_aten_decompositions())
    table.update(get_decompositions([
        torch.ops.aten.native_layer_norm,
        # batch normalisation as its arithmetic (the IR has no op for it; its layouts are
        # var_mean's and elementwise ops'): in training mode with batch statistics, and in
        # eval mode reading the running statistics (`.default` with training=False); in
        # training mode with running statistics the forward writes them (TVP304)
        torch.ops.aten._native_batch_norm_legit.no_stats,
        torch.ops.aten._native_batch_norm_legit.default,
        torch.ops.aten._native_batch_norm_legit_no_training.default,
        # group normalisation likewise: var_mean over each group's channels and positions
        torch.ops.aten.native_group_norm.default]))
    # `detach` stops the gradient; Core ATen's table turns it into `alias`, and the forward
    # is differentiated after decomposing: `h * sigmoid(h).detach()` got the gradient
    # through the detached factor too (the reference check said the trusted base was wrong)
    table.pop(torch.ops.aten.detach.default, None)
    from trainverify_dsl.spec.decompose import DECOMPOSITIONS

    table.update(DECOMPOSITIONS)
    return table


def _joint(module: nn.Module, args: tuple[Any, ...], *,
           returns_loss: bool = False) -> torch.fx.GraphModule:
    """The joint forward+backward graph; ``returns_loss`` first checks that ``module``
    returns one scalar floating-point tensor (the loss the backward starts from)."""
    exported = _export(module, args)
    if returns_loss:
        check_loss_output(exported, module)
    return _differentiate(exported, args)


@contextlib.contextmanager
def torch_deprecations_ignored() -> Any:
    """Torch's own deprecation notices (``FutureWarning``) while it exports or decomposes are
    not the user's: an API caller's stderr stays as clean as the CLI's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _export(module: nn.Module, args: tuple[Any, ...]) -> Any:
    # On failure torch.export prints the partial graph to stderr; the error is reported as a
    # diagnostic instead.
    with contextlib.redirect_stderr(io.StringIO()), torch_deprecations_ignored():
        return torch.export.export(module, args, strict=False)


def refuse_buffer_writes(exported: Any) -> None:
    """TVP304 at the model line when the forward writes a buffer in place (a running sum of
    activations, BatchNorm's running statistics): the step would carry state from one step
    to the next, which the IR has no meaning for (its value was silently wrong: the reference
    disagreed with eager torch on a gradient)."""
    from trainverify_dsl.report.diagnostics import Diagnostic

    mutated = dict(getattr(exported.graph_signature, "buffers_to_mutate", {}) or {})
    if not mutated:
        return
    nodes = {n.name: n for n in exported.graph.nodes}
    diagnostics = []
    for output, buffer in mutated.items():
        node = nodes.get(output)
        frame = user_frame(node.meta.get("stack_trace")) if node is not None else ""
        diagnostics.append(Diagnostic(
            codes.UNSUPPORTED_OP, f"the forward writes the buffer `{buffer}` in place: the "
            "training step would carry state to the next step, which the spec does not model",
            stack_span(frame), (), "keep the statistics outside the training step's forward "
            "(a hook or a separate pass), or make them a value the loss uses"))
    raise SpecError(diagnostics)


def export_key(exported: Any, where: bool = False) -> tuple[Any, ...] | None:
    """The canonical key of an exported forward (``spec/fx_key.py``): its graph, its
    signature and the values of its lifted constants; ``None`` when not exactly known. A
    non-persistent buffer (export keeps it among the constants; fake when the model is) is
    an input of the step, like every buffer: its shape and dtype are what the graph
    depends on, not its values. ``where``: each node's module stack and whole stack trace
    too, for a graph whose origins are absolute (not a block's, relative to the block)."""
    buffers = {spec.target for spec in exported.graph_signature.input_specs
               if spec.kind.name == "BUFFER"}
    try:
        constants = tuple(
            (name, ("buffer", tuple(value.shape), str(value.dtype))) if name in buffers
            else (name, tensor_key(value)) if isinstance(value, torch.Tensor)
            else (name, repr(value))
            for name, value in sorted(exported.constants.items()))
    except ValueError:
        return None
    frames = tuple(user_frame(n.meta.get("stack_trace")) for n in exported.graph.nodes)
    if where:
        frames += tuple((repr(n.meta.get("nn_module_stack")), n.meta.get("stack_trace"))
                        for n in exported.graph.nodes)
    return graph_key(exported.graph_module, str(exported.graph_signature), constants, frames)


def _differentiate(exported: Any, args: tuple[Any, ...]) -> torch.fx.GraphModule:
    """An exported forward decomposed with the shared table, then differentiated."""
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    table = decompositions()
    with torch_deprecations_ignored():
        exported = exported.run_decompositions(table)  # as a plan stage's forward is
    refuse_buffer_writes(exported)  # functional now: a write under no_grad shows too
    with contextlib.ExitStack() as stack:
        joint = aot_export_joint_with_descriptors(stack, exported.module(), args,
                                                  decompositions=table)
        return joint.graph_module


def _describe_output(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        kind = "tensor" if value.dim() == 0 else f"tensor of shape {tuple(value.shape)}"
        return f"a {str(value.dtype).removeprefix('torch.')} {kind}"
    return "None" if value is None else f"a {type(value).__name__}"


def check_loss_output(exported: Any, module: nn.Module) -> None:
    """``forward`` must return exactly one scalar floating-point tensor."""
    output = next(n for n in exported.graph.nodes if n.op == "output")
    values = list(output.args[0])[-len(exported.graph_signature.user_outputs):]
    values = [v.meta.get("val") if isinstance(v, torch.fx.Node) else v for v in values]
    if not exported.call_spec.out_spec.is_leaf():
        got = f"a {exported.call_spec.out_spec.type.__name__} of {len(values)} values"
    elif isinstance(values[0], torch.Tensor) and values[0].dim() == 0 and \
            values[0].is_floating_point():
        return
    else:
        got = _describe_output(values[0])
    raise fail_at(codes.TRACE_FAILED, f"{type(module).__name__}.forward must return the "
                  f"scalar training loss, but it returns {got}", model_span(module),
                  help="return one floating-point 0-d tensor, e.g. loss.mean()")


def _desc_kind(desc: Any) -> str:
    return type(desc).__name__


def canonical_names(model: nn.Module) -> dict[str, str]:
    """Every name of a (possibly shared) parameter or buffer -> its first name (the one
    ``named_parameters()`` reports); tied weights thus have one input and one gradient."""
    first: dict[int, str] = {}
    names: dict[str, str] = {}
    for name, tensor in list(model.named_parameters(remove_duplicate=False)) + list(
            model.named_buffers(remove_duplicate=False)):
        names[name] = first.setdefault(id(tensor), name)
    return names


def _outer_namer(data_names: list[str], names: dict[str, str]) -> Any:
    def name_input(desc: Any) -> tuple[str | None, str]:
        kind = _desc_kind(desc)
        if kind == "ParamAOTInput" and names.get(desc.target) == "":
            return None, "param"  # the stub anchor: a constant nobody reads
        if kind == "ParamAOTInput":
            return names.get(desc.target, desc.target), "param"
        if kind == "BufferAOTInput":
            return names.get(desc.target, desc.target), "buffer"
        if kind == "PlainAOTInput":
            return data_names[desc.idx], "data"
        if kind == "TangentAOTInput":
            return None, "tangent"
        raise UnsupportedOps([])

    return name_input


def _outer_output(names: dict[str, str]) -> Any:
    def name_output(desc: Any) -> str | None:
        kind = _desc_kind(desc)
        if kind == "PlainAOTOutput" and desc.idx == 0:
            return "loss"
        if kind == "GradAOTOutput" and _desc_kind(desc.grad_of) == "ParamAOTInput":
            name = names.get(desc.grad_of.target, desc.grad_of.target)
            return f"grad({name})" if name else None
        return None

    return name_output


def _block_input(desc: Any) -> tuple[str | None, str]:
    kind = _desc_kind(desc)
    if kind in ("ParamAOTInput", "BufferAOTInput"):
        prefix = "block."
        target = desc.target[len(prefix):] if desc.target.startswith(prefix) else desc.target
        return target, "param" if kind == "ParamAOTInput" else "buffer"
    if kind == "PlainAOTInput":
        return f"in.{desc.idx}", "activation"
    if kind == "TangentAOTInput":
        return "grad(out)", "tangent"
    raise UnsupportedOps([])


def _block_output(desc: Any) -> str | None:
    kind = _desc_kind(desc)
    if kind == "PlainAOTOutput" and desc.idx == 0:
        return "out"
    if kind == "GradAOTOutput":
        of = desc.grad_of
        if _desc_kind(of) == "ParamAOTInput":
            return f"grad({of.target.removeprefix('block.')})"
        if _desc_kind(of) == "PlainAOTInput" and of.idx == 0:
            return "grad(in.0)"
    return None


class _BlockCall(nn.Module):
    """Calls ``block`` with the captured non-tensor arguments baked in."""

    def __init__(self, block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]):
        super().__init__()
        self.block = block
        self.template = (args, kwargs)

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        feed = iter(tensors)
        args, kwargs = self.template
        call_args = [next(feed) if isinstance(a, torch.Tensor) else a for a in args]
        call_kwargs = {k: next(feed) if isinstance(v, torch.Tensor) else v
                       for k, v in kwargs.items()}
        return self.block(*call_args, **call_kwargs)


def find_block_list(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The ``nn.ModuleList`` holding the most parameters (the transformer blocks), if any."""
    best, best_size = None, 0
    for path, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 and path:
            size = sum(p.numel() for p in module.parameters())
            if size > best_size:
                best, best_size = (path, module), size
    return best


#: Attributes every ``nn.Module`` has: torch's bookkeeping, described separately (hooks) or not
#: at all (the parameter/buffer/submodule tables are covered by the tensor part of the key).
_MODULE_INTERNALS = frozenset(vars(nn.Module()))
_HOOK_TABLES = tuple(n for n in _MODULE_INTERNALS if "hook" in n)
_SIMPLE = (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device)
_MAX_DEPTH = 8


class _Opaque(Exception):
    """An attribute whose effect on the computation ``block_key`` cannot describe."""


def _describe(value: Any, depth: int = 0) -> Any:
    """A hashable, canonical description of an attribute value, or ``_Opaque``. Containers and
    dataclasses are described through their contents; plain named functions by their qualified
    name; anything else (closures, lambdas, arbitrary objects) is opaque."""
    if isinstance(value, _SIMPLE):
        return (type(value).__name__, repr(value))
    if depth >= _MAX_DEPTH:
        raise _Opaque
    if isinstance(value, list | tuple | set | frozenset):
        items = [_describe(v, depth + 1) for v in value]
        return (type(value).__name__, tuple(sorted(items, key=repr) if isinstance(
            value, set | frozenset) else items))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), _describe(v, depth + 1))
                                     for k, v in value.items())))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__qualname__, tuple(
            (f.name, _describe(getattr(value, f.name), depth + 1))
            for f in dataclasses.fields(value)))
    if isinstance(value, enum.Enum):
        return (type(value).__qualname__, value.name)
    if isinstance(value, types.FunctionType | types.BuiltinFunctionType) and not getattr(
            value, "__closure__", None) and value.__name__ != "<lambda>":
        return ("function", value.__module__, value.__qualname__)
    raise _Opaque


def _module_attrs(block: nn.Module) -> tuple[Any, ...]:
    """Every submodule's class and every attribute torch does not own, described exactly;
    ``_Opaque`` when one cannot be (or when a per-instance hook is registered)."""
    items = []
    for path, module in block.named_modules():
        if any(getattr(module, table, None) for table in _HOOK_TABLES):
            raise _Opaque
        cls = type(module)
        items.append((path, cls.__module__, cls.__qualname__))
        for key, value in sorted(vars(module).items()):
            if key not in _MODULE_INTERNALS:
                items.append((path, key, _describe(value)))
    return tuple(items)


def block_key(block: nn.Module, in_types: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Blocks with equal keys compute the same function of (their parameters, inputs): same
    classes (per submodule), parameter/buffer names and types, every instance attribute
    (a stored ``layer_id``, a list of scales, a config dataclass) and input types. ``None``
    when some attribute cannot be described exactly (a closure, an arbitrary object, a hook):
    the caller then traces that block itself and groups it by its traced graph. What the key
    cannot see is code shared by all instances of a class (module globals), which is the same
    for every layer by construction."""
    tensors = [(n, tuple(t.shape), t.dtype, t.requires_grad)
               for n, t in list(block.named_parameters()) + list(block.named_buffers())]
    try:
        attrs = _module_attrs(block)
    except _Opaque:
        return None
    return (tuple(tensors), in_types, attrs)


def _tensor_types(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    values = list(args) + list(kwargs.values())
    return tuple((tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else repr(v)
                 for v in values)


def _block_point(relative: str) -> str:
    """The point prefix of a module inside a block (``@.attention``; ``@`` is the block)."""
    return "@" + (f".{relative}" if relative else "")


#: The graphs of blocks already traced, by the canonical key of their exported forward and
#: its user frames (``spec/fx_key.py``), for every trace of the process.
BLOCKS = KeyMemo(256)


def _trace_block(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 marked: tuple[str, ...] = (), memo: bool = False) -> tuple[Graph, Graph]:
    """A block's forward and backward graphs. ``memo``: a block whose forward exports to the
    key of a block already traced (``BLOCKS``) is not decomposed and differentiated again
    (torch's pipeline gives equal graphs for equal keys; module paths in a block are
    relative, and the key holds each node's user frame, so origins are the block's own)."""
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    inputs = [tensors[0].detach().requires_grad_(True)] + [t.detach() for t in tensors[1:]]
    with marks(block, marked, _block_point):
        exported = _export(_BlockCall(block, args, kwargs), tuple(inputs))
        key = export_key(exported) if memo else None
        known = BLOCKS.get(key)
        if known is not None:
            return known
        gm = _differentiate(exported, tuple(inputs))
    graph = import_joint(gm, _block_input, _block_output, strip="block")
    if "out" not in graph.output_names or graph.value_type(graph.output_value("out")) != \
            graph.inputs[graph.input_index("in.0")].type:
        raise _NoReuse("a block's output type differs from its hidden-state input")
    forward, backward = split_phases(graph, {"grad(out)": 1}, 2)
    BLOCKS.put(key, (forward, backward))
    return forward, backward


def capture_stub_call(model: nn.Module, list_path: str,
                       inputs: tuple[torch.Tensor, ...]) -> tuple[BlockStub, nn.ModuleList]:
    """How the model calls its blocks, from a run with the list replaced by two stubs: each
    must be called once, the second on exactly what the first returned and with the same
    other arguments. The outer graph is traced around one stub (``_trace_outer``), so the
    block-by-block trace is the model's step only when the loop is ``h = block(h, ...)``: an
    op of the parent between two blocks (``h = h + relu(block(h))``) would be traced once,
    not once per block, and such a model is traced whole instead (``_NoReuse``)."""
    parent_path, _, attr = list_path.rpartition(".")
    parent = model.get_submodule(parent_path)
    original = getattr(parent, attr)
    stubs = [BlockStub(record=True), BlockStub(record=True)]
    setattr(parent, attr, nn.ModuleList(stubs))
    try:
        model(*inputs)
    finally:
        setattr(parent, attr, original)
    if [len(s.calls) for s in stubs] != [1, 1]:
        raise _NoReuse(f"the block list {list_path!r} is not called as a loop over layers")
    (first_args, first_kwargs), (args, kwargs) = stubs[0].calls[0], stubs[1].calls[0]
    first, second = _call_tensors(first_args, first_kwargs), _call_tensors(args, kwargs)
    if not second or second[0] is not stubs[0].returned[0]:
        raise _NoReuse(f"the model computes between the blocks of {list_path!r} (a block's "
                       "input is not the previous block's output)")
    if len(first) != len(second) or not all(
            _same_view(a, b) for a, b in zip(first[1:], second[1:], strict=True)) or \
            _non_tensors(first_args, first_kwargs) != _non_tensors(args, kwargs):
        raise _NoReuse(f"the blocks of {list_path!r} are called with different arguments")
    return stubs[0], original


def _call_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    return [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]


def _non_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    return [repr(a) for a in args if not isinstance(a, torch.Tensor)] + \
        [f"{k}={v!r}" for k, v in sorted(kwargs.items()) if not isinstance(v, torch.Tensor)]


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same tensor, or the same view of the same storage (a table sliced again in each
    iteration, ``freqs[:seq]``)."""
    if a is b:
        return True
    try:
        return (a.shape, a.stride(), a.storage_offset(), a.dtype) == \
            (b.shape, b.stride(), b.storage_offset(), b.dtype) and \
            a.untyped_storage()._cdata == b.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 - a tensor without a storage: not known to be the same
        return False


#: The joint graphs of the model around its block list, by the key of their export: a loop
#: checking many plans of one model at one size (a search, a test suite) differentiates the
#: outer graph once. The graph is only read (``import_joint``) after it is made.
OUTERS = KeyMemo(16)


def _trace_outer(model: nn.Module, list_path: str, inputs: tuple[torch.Tensor, ...],
                 data_names: list[str], marked: tuple[str, ...] = ()) -> list[Graph]:
    parent_path, _, attr = list_path.rpartition(".")
    parent = model.get_submodule(parent_path)
    original = getattr(parent, attr)
    setattr(parent, attr, nn.ModuleList([BlockStub()]))
    try:
        with marks(model, marked):
            exported = _export(model, inputs)
            check_loss_output(exported, model)
            key = export_key(exported, where=True)
            gm = OUTERS.get(key)
            if gm is None:
                gm = _differentiate(exported, inputs)
                OUTERS.put(key, gm)
        names = canonical_names(model)
    finally:
        setattr(parent, attr, original)
    names[f"{list_path}.0.{ANCHOR}"] = ""  # the stub's anchor: not a model parameter
    graph = import_joint(gm, _outer_namer(data_names, names), _outer_output(names))
    return split_phases(graph, {"block_out": 1, "grad(block_in.0)": 2}, 3)


def _split_marks(modules: tuple[str, ...], list_path: str, n_blocks: int
                 ) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Marked modules outside the block list, and per block the ones inside it (relative to
    the block; ``""`` is the block itself)."""
    outer = tuple(m for m in modules if m != list_path and not m.startswith(f"{list_path}."))
    inner: list[list[str]] = [[] for _ in range(n_blocks)]
    for m in modules:
        if m.startswith(f"{list_path}."):
            index, _, rest = m[len(list_path) + 1:].partition(".")
            if index.isdigit() and int(index) < n_blocks:
                inner[int(index)].append(rest)
    return outer, [tuple(sorted(r)) for r in inner]


def _trace_pieces(model: nn.Module, inputs: tuple[torch.Tensor, ...],
                  data_names: list[str], exact: bool, marked: tuple[str, ...] = ()) -> Pieces:
    found = find_block_list(model)
    if found is None:
        raise _NoReuse("the model has no nn.ModuleList of blocks")
    list_path, blocks = found
    if _shares_a_block_parameter(model, list_path):
        raise _NoReuse("a block shares a parameter with another module (tied weights): its "
                       "gradient sums over the modules, not one block's")
    stub, _ = capture_stub_call(model, list_path, inputs)
    args, kwargs = stub.calls[0]
    tensors = [t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]
    if any(t.requires_grad for t in tensors[1:]):
        raise _NoReuse("a block receives a gradient-carrying tensor besides the hidden state")
    sample = blocks[0](*args, **kwargs)
    if not isinstance(sample, torch.Tensor) or (sample.shape, sample.dtype) != (
            tensors[0].shape, tensors[0].dtype):
        raise _NoReuse("a block does not return one tensor shaped like its hidden-state input")
    in_types = _tensor_types(args, kwargs)
    outer_marks, block_marks = _split_marks(marked, list_path, len(blocks))
    groups: dict[Any, str] = {}
    traced: dict[str, tuple[Graph, Graph]] = {}
    layer_graph = []
    for block, inner in zip(blocks, block_marks, strict=True):
        # Group by block_key (classes, tensor types, every attribute, input types, marked
        # modules); a block the key cannot describe, and every block when exact, is traced
        # (exported; decomposed and differentiated unless an equal export was) and grouped
        # by its traced graphs themselves.
        key = None if exact else block_key(block, in_types)
        graphs = _trace_block(block, args, kwargs, inner, memo=True) if key is None else None
        key = graphs if key is None else (key, inner)
        if key not in groups:
            groups[key] = f"block{len(groups)}"
            traced[groups[key]] = graphs or _trace_block(block, args, kwargs, inner)
        layer_graph.append(groups[key])
    outer = _trace_outer(model, list_path, inputs, data_names, outer_marks)
    return Pieces(outer, traced, layer_graph, list_path)


def _shares_a_block_parameter(model: nn.Module, list_path: str) -> bool:
    """Whether a parameter of a block is also another module's (``blocks.3.lin.weight``
    tied to ``blocks.0.lin.weight``, or to a module outside the list)."""
    holders: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        holders.setdefault(id(p), set()).add(name)
    prefix = f"{list_path}."
    for names in holders.values():
        if len(names) > 1 and any(n.startswith(prefix) for n in names):
            return True
    return False


def _flat_program(model: nn.Module, inputs: tuple[torch.Tensor, ...], data_names: list[str],
                  program_inputs: tuple[GraphInput, ...], outputs: list[str],
                  marked: tuple[str, ...] = ()) -> Program:
    names = canonical_names(model)
    with marks(model, marked):
        joint = _joint(model, inputs, returns_loss=True)
    graph = import_joint(joint, _outer_namer(data_names, names), _outer_output(names))
    call = step_call("step", graph, "step", {}, label="training step")
    defined = set(call.results)
    return Program(program_inputs, (("step", graph),), (call,),
                   tuple((o, o) for o in outputs if o in defined))


def _program_inputs(model: nn.Module, specs: InputSpecs) -> tuple[GraphInput, ...]:
    from trainverify_dsl.spec.convert import tensor_type

    inputs = [GraphInput(n, "param", tensor_type(p)) for n, p in model.named_parameters()]
    inputs += [GraphInput(n, "buffer", tensor_type(b)) for n, b in model.named_buffers()]
    for name, (shape, dtype) in specs.items():
        inputs.append(GraphInput(name, "data", TensorType(tuple(int(s) for s in shape),
                                                          DTYPES[dtype])))
    return tuple(inputs)


def trace_training_step(model: nn.Module, input_specs: InputSpecs, optimizer: Any = None, *,
                        reuse: bool = True, exact_reuse: bool = False,
                        points: Any = ()) -> SpecProgram:
    """Trace ``model(**inputs) -> loss`` and its backward into a ``SpecProgram``.

    ``points``: marked points (``X.in``, ``X.in#k``, ``X.out``) whose values become outputs
    ``point:<point>``; a point the forward never reaches (a module not called, an integer
    argument) has no output.

    ``reuse`` traces one block per distinct ``block_key`` and reuses it for the other layers
    (the key is a cheap proxy for "same computation"); ``exact_reuse`` traces every layer and
    shares a graph only between layers whose traced graphs are equal.

    ``optimizer`` (an ``spec.optim`` config) appends the update step. Raises ``SpecError``
    with diagnostics on failure; never lets a torch traceback escape.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    start = time.perf_counter()
    mode = fake_mode_of(model)
    try:
        fake = _fakeify(model, mode)
        # Tensors built in forward by factories (torch.linspace, torch.arange) become IR
        # literals; torch.tensor(data) reads values while tracing: TVP305, with the hint
        # to register a buffer (tests/test_spec_convert.py).
        allow, mode.allow_non_fake_inputs = mode.allow_non_fake_inputs, True
        try:
            with mode, sdpa_kernel(SDPBackend.MATH), _quiet_torch_logs():
                spec = _trace_in_mode(fake, input_specs, reuse, exact_reuse, tuple(points))
        finally:
            mode.allow_non_fake_inputs = allow
    except SpecError as error:
        raise _located(error, model) from None
    except UnsupportedOps as error:
        raise unsupported_error(error) from None
    except (Exception, SystemExit) as error:  # torch and user code raise anything
        raise trace_error(error, model) from None
    if optimizer is not None:
        from trainverify_dsl.spec.optim import append_optimizer

        spec = append_optimizer(spec, optimizer)
    problems = program_problems(spec.program)
    if problems:
        raise fail(codes.IR_INVALID, problems[0], notes=tuple(problems[1:6]))
    elapsed = time.perf_counter() - start
    return dataclasses.replace(spec, trace_seconds=elapsed)


def _trace_in_mode(model: nn.Module, specs: InputSpecs, reuse: bool,
                   exact: bool, points: tuple[str, ...] = ()) -> SpecProgram:
    inputs = _example_inputs(specs)
    data_names = list(specs)
    program_inputs = _program_inputs(model, specs)
    outputs = ["loss"] + [f"grad({n})" for n, _ in model.named_parameters()]
    outputs += [f"{POINT}{p}" for p in sorted(set(points))]
    marked = tuple(sorted({module_of(p) for p in points}))
    notes: list[str] = []
    if reuse:
        try:
            pieces = _trace_pieces(model, inputs, data_names, exact, marked)
        except _NoReuse as why:
            notes.append(f"block reuse off: {why}")
        except (SpecError, UnsupportedOps):
            raise
        except Exception as error:  # noqa: BLE001 - the flat trace reports real model errors
            notes.append(f"block reuse off: cutting at the block list failed "
                         f"({type(error).__name__}: {str(error).strip()[:120]})")
        else:
            groups = tuple(BlockGroup(name, tuple(i for i, g in enumerate(pieces.layer_graph)
                                                  if g == name)) for name in pieces.blocks)
            program = compose(pieces, program_inputs, outputs)
            boundaries = block_boundaries(pieces.list_path, len(pieces.layer_graph))
            return SpecProgram(program, pieces.list_path, groups, 0.0, tuple(notes),
                               boundaries)
    program = _flat_program(model, inputs, data_names, program_inputs, outputs, marked)
    return SpecProgram(program, "", (), 0.0, tuple(notes))


def stack_span(stack: str) -> Any:
    path, _, line = stack.rpartition(":")
    return Span(path, int(line), 1, int(line), 1) if line.isdigit() else spec_span("")


def unsupported_error(error: UnsupportedOps) -> SpecError:
    from trainverify_dsl.report.diagnostics import Diagnostic

    seen, diagnostics = set(), []
    for item in error.items:
        if (item.op, item.module) in seen:
            continue
        seen.add((item.op, item.module))
        where = f" in module {item.module!r}" if item.module else ""
        diagnostics.append(Diagnostic(codes.UNSUPPORTED_OP,
                                      f"ATen op {item.op!r}{where} has no IR equivalent",
                                      stack_span(item.stack), (item.detail,)))
    return SpecError(diagnostics or [Diagnostic(codes.UNSUPPORTED_OP, "unsupported input",
                                                stack_span(""))])


@contextlib.contextmanager
def _quiet_torch_logs():
    """Silence torch's warnings while tracing (a failed guard logs whole FX graphs on
    stderr); every problem reaches the user as a diagnostic instead."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name == "torch" or name.startswith("torch.")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def model_span(model: nn.Module) -> Span:
    """Where a whole-model problem is reported: the model's ``def forward`` line, else the
    line of its ``class``, else the class name (no source known)."""
    cls = type(model)
    forward = getattr(cls, "forward", None)
    code = getattr(forward, "__code__", None)
    if code is not None and forward is not nn.Module.forward:
        return Span(code.co_filename, code.co_firstlineno, 1, code.co_firstlineno, 1)
    try:
        file, line = inspect.getsourcefile(cls), inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return spec_span(cls.__qualname__)
    return Span(file or cls.__module__, line, 1, line, 1)


def _located(error: SpecError, model: nn.Module) -> SpecError:
    """``error`` with the diagnostics that name no place moved to ``model_span``."""
    unplaced = spec_span("")
    return SpecError([dataclasses.replace(d, span=model_span(model)) if d.span == unplaced
                      else d for d in error.diagnostics])


def _user_frames(error: BaseException) -> list[traceback.FrameSummary]:
    """The traceback frames in user code (outside torch, Python's library and this package)
    of ``error``, else of the exceptions it was raised from or while handling."""
    skip = (str(Path(torch.__file__).parent.parent), str(Path(inspect.__file__).parent),
            str(Path(__file__).parent.parent))
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = [f for f in traceback.extract_tb(current.__traceback__)
                  if not f.filename.startswith(skip) and not f.filename.startswith("<")]
        if frames:
            return frames
        current = current.__cause__ or current.__context__
    return []


def run_error(error: BaseException, model: nn.Module) -> SpecError:
    """The model's own code failing when it runs eagerly on the drawn inputs (the check of
    the reference step against torch): a diagnostic at the user's line, never a traceback
    (an index the model does not guard, a value its code rejects)."""
    found = trace_error(error, model)
    (d,) = found.diagnostics
    return SpecError([dataclasses.replace(d, message="running the model eagerly on the drawn "
                                                     f"inputs failed: {d.message}")])


def trace_error(error: BaseException, model: nn.Module) -> SpecError:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    user = _user_frames(error)
    # Errors raised while re-running a traced graph quote the user's line in their text.
    quoted = user_frame(str(error))
    if user:
        span = Span(user[-1].filename, user[-1].lineno or 1, 1, user[-1].lineno or 1, 1)
    else:
        span = stack_span(quoted) if quoted else model_span(model)
    if "DynamicOutputShape" in type(error).__name__ or "data-dependent" in str(error) or \
            "DataDependent" in type(error).__name__:
        return fail_at(codes.DATA_DEPENDENT_SHAPE, f"value-dependent tracing: {text}", span,
                       help="shapes and Python control flow must not read tensor values "
                            "(.item(), nonzero, masks); tensor constants created in forward "
                            "(torch.tensor([...])) are read this way: register them as a "
                            "buffer")
    frames = user[-3:] or traceback.extract_tb(error.__traceback__)[-3:]
    notes = tuple(f"at {f.filename}:{f.lineno} in {f.name}" for f in frames)
    return fail_at(codes.TRACE_FAILED, f"{type(error).__name__}: {text}", span, notes=notes)
