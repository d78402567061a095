"""Capture the spec model's forward as a Core-ATen FX graph with marked module boundaries.

The lowering rewrites this graph into each pipeline stage's local program. Module boundaries
the plan talks about (``X.in``, ``X.out``) are kept visible as ``tvp::mark`` nodes: a forward
pre-hook passes a module's first tensor argument through ``mark(x, "X.in")`` (so only the edge
into ``X`` goes through it, docs/semantics.md Rule 3.1; further floating-point arguments get
``X.in#k``, which only parallel algorithms read) and a forward hook passes its output
through ``mark(y, "X.out")`` (``spec/marks.py``, shared with the spec tracer). Marks are
identities; the rewrite replaces each by the plan's collectives at that point.

The capture runs on fake tensors (``torch.export`` non-strict, then the decompositions the
reference step's forward gets too, ``spec.trace.decompositions``), so a full-size model costs
no memory.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from trainverify_dsl.spec.fx_key import KeyMemo
from trainverify_dsl.spec.load import USER_CODE_ERRORS
from trainverify_dsl.spec.marks import MARK, install_marks  # noqa: F401 (MARK re-exported)
from trainverify_dsl.spec.trace import (
    canonical_names,
    check_loss_output,
    decompositions,
    export_key,
    refuse_buffer_writes,
    torch_deprecations_ignored,
    trace_error,
)

#: the attribute name prefix of a tensor the forward builds (a lifted constant of export)
CONSTANT_PREFIX = "_tvp_const_"


@dataclass(frozen=True, slots=True)
class Captured:
    """The forward graph and what its placeholders are."""

    gm: torch.fx.GraphModule
    #: placeholder name -> (kind, spec name); kind ``param``, ``buffer``, ``data``
    placeholders: Mapping[str, tuple[str, str]]
    #: module path -> class name, for every module of the model
    modules: Mapping[str, str]
    #: the points that were marked
    points: frozenset[str]


def capture_forward(model: nn.Module, inputs: Mapping[str, torch.Tensor],
                    marked: Iterable[str]) -> Captured:
    """The Core-ATen forward graph of ``model(**inputs)`` with ``marked`` modules' inputs and
    outputs marked. ``inputs`` are fake tensors in forward-argument order."""
    marked = sorted(set(marked))
    handles = install_marks(model, marked)
    try:
        with contextlib.redirect_stderr(io.StringIO()), torch_deprecations_ignored():
            exported = torch.export.export(model, tuple(inputs.values()), strict=False)
    except USER_CODE_ERRORS as error:  # the model's own code, or torch refusing it
        raise trace_error(error, model) from None
    finally:
        for handle in handles:
            handle.remove()
    check_loss_output(exported, model)  # the layout pass says it as the tracer does
    key = _capture_key(exported)
    decomposed = DECOMPOSED.get(key)
    if decomposed is None:
        # the reference step's table (spec/trace.py): both forwards decomposed alike
        with torch_deprecations_ignored():
            decomposed = exported.run_decompositions(decompositions())
        refuse_buffer_writes(decomposed)  # functional now: a write under no_grad shows too
        _drop_value_checks(decomposed.graph_module.graph)
        DECOMPOSED.put(key, decomposed)
    exported = decomposed
    signature = exported.graph_signature
    data_names = list(inputs)
    placeholders: dict[str, tuple[str, str]] = {}
    user = iter(data_names)
    # a tied parameter is one input of export per name; all of them are the parameter's
    # first name, the one the spec and the plan use (``named_parameters``)
    canonical = canonical_names(model)
    for spec in signature.input_specs:
        name = spec.arg.name
        kind = spec.kind.name
        if kind == "PARAMETER":
            placeholders[name] = ("param", canonical.get(spec.target, spec.target))
        elif kind == "BUFFER":
            placeholders[name] = ("buffer", canonical.get(spec.target, spec.target))
        elif kind == "USER_INPUT":
            placeholders[name] = ("data", next(user))
        elif kind == "CONSTANT_TENSOR":
            placeholders[name] = ("constant", spec.target)
        else:
            raise _unsupported_input(exported, kind)
    gm = exported.graph_module
    constants = getattr(exported, "constants", {}) or {}
    for name, (kind, target) in placeholders.items():
        if kind == "constant":
            setattr(gm, f"{CONSTANT_PREFIX}{name}", constants[target])
    modules = {path: type(m).__name__ for path, m in model.named_modules()}
    points = frozenset(f"{p}.{side}" for p in marked for side in ("in", "out"))
    return Captured(gm, placeholders, modules, points)


#: Decomposed captures by the canonical key of their export (``_capture_key``), for every
#: lowering of the process: ``tvp check`` lowers a plan twice to report a difference on its
#: own stages, and a search loop lowers many plans of one model at one size. Decomposition
#: is about two thirds of a capture; the export, which gives the key, is still made.
DECOMPOSED = KeyMemo(32)


def _capture_key(exported: torch.export.ExportedProgram) -> tuple[object, ...] | None:
    """The exact key of an export (``spec.trace.export_key``: graph, signature, constants,
    user frames) with each node's module stack and whole stack trace, which the lowering
    reads (stages, spans); ``None`` when not exactly known. Equal keys decompose to equal
    graphs (torch's decomposition is a function of the graph)."""
    return export_key(exported, where=True)


#: torch's value checks (``one_hot``'s "class values must be non-negative"): an assertion on
#: data, no value of the step
VALUE_CHECKS = frozenset({"_assert_async"})
#: the ops that compute only what such a check reads (comparisons, and their reductions)
CHECK_OPS = frozenset({"ge", "gt", "le", "lt", "eq", "ne", "logical_not", "logical_and",
                       "logical_or", "any", "all"})


def _drop_value_checks(graph: torch.fx.Graph) -> None:
    """Remove the model's value checks and what only they read: on a rank they test its
    own pieces (an ``any`` over a split batch), which no layout rule means as the whole
    batch's test, and they compute nothing the step uses. The reference step has none
    either (``spec/convert.py`` gives checks no value)."""
    todo = [n for n in graph.nodes
            if n.op == "call_function" and _op_name(n.target) in VALUE_CHECKS]
    while todo:
        node = todo.pop()
        if node.users:
            continue
        inputs = node.all_input_nodes
        graph.erase_node(node)
        todo.extend(n for n in inputs if n.op == "call_function" and not n.users and
                    _op_name(n.target) in CHECK_OPS)


def _unsupported_input(exported: torch.export.ExportedProgram, kind: str) -> Exception:
    """An export input the IR has no kind for (an effect ``TOKEN`` threaded through an op
    with side effects such as ``aten._print``, a script object) as the spec tracer reports
    the op that needs it: TVP304 at the model line calling it."""
    from trainverify_dsl.spec.fx_import import Unsupported, UnsupportedOps, user_frame
    from trainverify_dsl.spec.trace import unsupported_error

    items = [Unsupported(_op_name(node.args[1]), (module_stack(node) or ("",))[-1],
                         f"an op with side effects: torch.export threads a {kind} input "
                         "through it; remove the call from the training step",
                         user_frame(node.meta.get("stack_trace")))
             for node in exported.graph.nodes
             if node.op == "call_function" and _op_name(node.target) == "with_effects"
             and len(node.args) > 1]
    if not items:
        items = [Unsupported(f"<{kind.lower()} input>", "",
                             f"torch.export gives the forward a {kind} input")]
    return unsupported_error(UnsupportedOps(items))


def _op_name(target: object) -> str:
    return getattr(target, "__name__", str(target)).split(".")[0]


def module_stack(node: torch.fx.Node) -> tuple[str, ...]:
    """Module paths enclosing ``node``, outermost first (``("layers.0", "layers.0.attention")``)."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = []
    for value in stack.values():
        path = value[0] if isinstance(value, tuple) else str(value)
        paths.append(_clean_path(path))
    return tuple(p for p in paths if p)


def _clean_path(path: str) -> str:
    # torch.export spells list members ``layers.0`` or ``L['self'].layers[0]`` by version.
    path = path.replace("L['self'].", "").replace("L['self']", "")
    out = []
    for part in path.replace("[", ".").replace("]", "").split("."):
        if part.startswith("_modules['") and part.endswith("']"):
            part = part[len("_modules['"):-2]
        if part:
            out.append(part)
    return ".".join(out)
