"""A torchtitan / DTensor ``parallelize_module`` plan -> a plan.

Input: a JSON object, either the plan itself (keys are module paths below the model, with
``fnmatch`` patterns per path atom as ``parallelize_module`` matches them: ``layers.*.
attention.wq``) or ``{"plan": {...}, "layer_plan": {...}}`` where ``layer_plan`` is applied to
every layer (torchtitan's ``for transformer_block in model.layers.values():
parallelize_module(transformer_block, tp_mesh, layer_plan)``). Styles are strings in JSON
(``"RowwiseParallel(output_layouts=Shard(1))"``) and calls in a Python file, whose top-level
``plan = {...}`` / ``layer_plan = {...}`` literals are read without running anything.

Module names are torchtitan's Llama 3 names (``tok_embeddings``, ``layers.N.attention.wq``,
``feed_forward.w1``, ...), mapped onto stdlib/models/llama.py.

What a DTensor style communicates depends on what reaches the module: a plain tensor is
taken as the style's ``input_layouts`` (``from_local``: no forward communication, its backward
brings the gradient to that layout), a DTensor is redistributed; so the importer walks the
model's data flow layer by layer with the state of each activation (a local tensor, or a
DTensor and its placement) and writes the collectives DTensor would run
(docs/importers.md has the table). A gradient layout that DTensor decides at run time is
pinned down by requiring the consumers that decide it: a replicated DTensor may only feed
``ColwiseParallel`` linears (their input gradients are partial, so the redistribution that made
the DTensor reduces them). Anything outside the transcribed cases is refused.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from pathlib import Path

from trainverify_dsl.importers import patterns
from trainverify_dsl.importers.common import (
    PIPELINE,
    TENSOR,
    ImportOptions,
    MeshRoles,
    Refusals,
    Refused,
    check_batch,
    data_parallel,
    even_division,
    plan_name,
)
from trainverify_dsl.importers.emit import Line, PlanDraft, pipeline_stages
from trainverify_dsl.importers.models import (
    CONTAINER,
    EMBEDDING,
    LINEAR,
    Module,
    ReferenceModel,
)
from trainverify_dsl.importers.source import (
    Call,
    Node,
    Unreadable,
    is_python,
    quoted,
    read_json,
    read_python,
    read_style_string,
    read_text,
)
from trainverify_dsl.plan.messages import did_you_mean
from trainverify_dsl.report import codes_import as codes

#: torchtitan's Llama 3 names that differ from stdlib/models/llama.py's.
TOP_NAMES = {"Llama": {"tok_embeddings": "embed"}}

#: Style class -> its keyword arguments (torch.distributed.tensor.parallel).
STYLE_ARGS = {
    "ColwiseParallel": ("input_layouts", "output_layouts", "use_local_output"),
    "RowwiseParallel": ("input_layouts", "output_layouts", "use_local_output"),
    "SequenceParallel": ("sequence_dim", "use_local_output"),
    "PrepareModuleInput": ("input_layouts", "desired_input_layouts", "input_kwarg_layouts",
                           "desired_input_kwarg_layouts", "use_local_output"),
}
LOCAL_OUTPUT_DEFAULT = {"ColwiseParallel": True, "RowwiseParallel": True,
                        "SequenceParallel": False, "PrepareModuleInput": False}
#: Names refused with the reason (code, why).
REFUSED_STYLES = {
    **dict.fromkeys(("colwise_parallel", "rowwise_parallel", "prepare_module_input",
                     "await_rowwise_parallel"), (
        codes.UNKNOWN_STYLE, "a local alias in torchtitan's parallelize code, bound to a "
                             "plain or a Float8 style by the float8 setting; write the class "
                             "name (ColwiseParallel, RowwiseParallel, PrepareModuleInput)")),
    **dict.fromkeys(("Float8ColwiseParallel", "Float8RowwiseParallel",
                     "PrepareFloat8ModuleInput"), (
        codes.INEXPRESSIBLE_PLAN, "float8 matmuls compute other values than the reference "
                                  "step; the plan language's arithmetic is exact")),
    **dict.fromkeys(("PrepareModuleOutput", "PrepareModuleInputOutput", "NoParallel",
                     "ExpertParallel", "TensorParallel", "ExpertTensorParallel"), (
        codes.UNSUPPORTED_IMPORT, "the importer has no transcription for this style yet")),
}


# ---------------------------------------------------------------- placements and states


@dataclass(frozen=True, slots=True)
class Placement:
    kind: str  # "S", "R" or "P"
    dim: int | None = None

    def __str__(self) -> str:
        return f"Shard({self.dim})" if self.kind == "S" else \
            "Replicate()" if self.kind == "R" else "Partial()"


REPLICATE = Placement("R")


@dataclass(frozen=True, slots=True)
class State:
    """An activation between modules: a plain tensor, or a DTensor with its placement."""

    dtensor: Placement | None = None
    #: the style that made the DTensor (for messages)
    origin: Node | None = field(default=None, compare=False)

    @property
    def local(self) -> bool:
        return self.dtensor is None

    def __str__(self) -> str:
        return "a local tensor" if self.local else f"a DTensor placed {self.dtensor}"


LOCAL = State()


@dataclass(frozen=True, slots=True)
class Style:
    cls: str
    #: first input layout (or the only one); ``None``: not given
    input: Placement | None
    output: Placement | None
    desired: Placement | None
    local_output: bool
    sequence_dim: int
    node: Node
    key: str

    @property
    def note(self) -> str:
        return f"{self.key}: {self.cls}"


# ---------------------------------------------------------------- entry point


def import_torchtitan(path: str, options: ImportOptions, refusals: Refusals) -> PlanDraft:
    model = options.config.model
    if model.cls not in TOP_NAMES:
        raise refusals.stop(codes.UNSUPPORTED_IMPORT, "torchtitan module names are known for "
                            f"Llama only, not for the reference model {model.cls}")
    top_plan, layer_plan = _read(path, refusals)
    mesh = MeshRoles(options.mesh or ())
    assign = _Assignment(model, options.config.n_layers, TOP_NAMES[model.cls], refusals)
    assign.top_keys(top_plan)
    assign.layer_keys(layer_plan)
    if (assign.top or any(assign.layers)) and mesh.tp == 1:
        refusals.add(codes.INCONSISTENT_DEGREES, "the plan has tensor-parallel styles but the "
                     "mesh has no tp axis", help="give it with --mesh, e.g. --mesh tp=2")
    if refusals:
        raise Refused()
    flow = _Flow(model, options, refusals)
    before, layers, after = flow.run(assign)
    if refusals:
        raise Refused()
    stages: tuple[tuple[str, ...], ...] = ()
    if mesh.has(PIPELINE):
        stages = pipeline_stages(options.config, even_division(options, refusals, mesh.pp))
    batch_axes, gradients = data_parallel(mesh)
    check_batch(options, refusals, options.batch or 0,
                math.prod(mesh.size(a) for a in batch_axes), options.microbatches or 1)
    return PlanDraft(
        name=plan_name(options, Path(path).stem),
        comments=(f"Imported by `tvp import torchtitan` from {Path(path).name}.",
                  "DTensor parallel styles, transcribed as docs/importers.md says."),
        config=options.config, batch=options.batch or 0, seq=options.seq, mesh=mesh.axes,
        optimizer=options.optimizer, microbatches=options.microbatches or 1,
        schedule=options.schedule, batch_axes=batch_axes, stages=stages, before=before,
        layers=layers, after=after, gradients=gradients)


# ---------------------------------------------------------------- reading


def _read(path: str, refusals: Refusals) -> tuple[Node | None, Node | None]:
    try:
        text = read_text(path)
        if is_python(path):
            found = read_python(text, path)
            unknown = sorted(set(found) - {"plan", "layer_plan"})
            if unknown:
                raise refusals.stop(codes.MALFORMED_IMPORT, f"'{unknown[0]}': a Python plan "
                                    "file assigns `plan` and/or `layer_plan` only",
                                    found[unknown[0]].key_or_value_span)
            top, layer = found.get("plan"), found.get("layer_plan")
        else:
            top, layer = _split_json(read_json(text, path), refusals)
    except Unreadable as error:
        refusals.items.append(error.diagnostic)
        raise Refused() from None
    for node in (top, layer):
        if node is not None and not node.is_object:
            raise refusals.stop(codes.MALFORMED_IMPORT, "a plan must be a dict from module "
                                "paths to styles", node)
    if top is None and layer is None:
        raise refusals.stop(codes.MALFORMED_IMPORT, f"{path} holds no plan")
    return top, layer


def _split_json(root: Node, refusals: Refusals) -> tuple[Node | None, Node | None]:
    if not root.is_object:
        raise refusals.stop(codes.MALFORMED_IMPORT, "expected a JSON object", root)
    keys = {k for k, _ in root.items()}
    if keys and keys <= {"plan", "layer_plan"} and all(n.is_object for _, n in root.items()):
        return root.get("plan"), root.get("layer_plan")
    return root, None


def _style(node: Node, key: str, refusals: Refusals) -> Style | None:
    """The style a plan value describes, or ``None`` after a refusal."""
    try:
        call = node if isinstance(node.value, Call) else \
            read_style_string(node.value, node.span, node.path) if isinstance(node.value, str) \
            else None
    except Unreadable as error:
        refusals.items.append(error.diagnostic)
        return None
    if call is None or not isinstance(call.value, Call):
        refusals.add(codes.MALFORMED_IMPORT, f"the style of {quoted(key)} must be a style "
                     "call such as ColwiseParallel()", node)
        return None
    return _parse_style(call.value, node, key, refusals)


def _parse_style(call: Call, node: Node, key: str, refusals: Refusals) -> Style | None:
    name = call.name.rsplit(".", 1)[-1]
    if name in REFUSED_STYLES:
        code, why = REFUSED_STYLES[name]
        refusals.add(code, f"{quoted(key)}: {name}: {why}", node)
        return None
    if name not in STYLE_ARGS:
        hint = did_you_mean(name, STYLE_ARGS)
        refusals.add(codes.UNKNOWN_STYLE, f"{quoted(key)}: unknown parallel style "
                     f"{quoted(name)}" + (f"; {hint}" if hint else ""), node,
                     notes=["known styles: " + ", ".join(STYLE_ARGS)])
        return None
    if call.args:
        refusals.add(codes.MALFORMED_IMPORT, f"{quoted(key)}: {name} takes keyword arguments "
                     "only", node)
        return None
    args = dict(call.kwargs)
    wrong = [k for k in args if k not in STYLE_ARGS[name]]
    if wrong:
        refusals.add(codes.MALFORMED_IMPORT, f"{quoted(key)}: {name} has no argument "
                     f"{quoted(wrong[0])}", node,
                     notes=["its arguments: " + ", ".join(STYLE_ARGS[name])])
        return None
    try:
        return Style(
            cls=name, input=_layout(args.get("input_layouts"), refusals, key),
            output=_layout(args.get("output_layouts"), refusals, key),
            desired=_layout(args.get("desired_input_layouts"), refusals, key),
            local_output=_flag(args.get("use_local_output"), LOCAL_OUTPUT_DEFAULT[name],
                               refusals, key),
            sequence_dim=_int(args.get("sequence_dim"), 1, refusals, key),
            node=node, key=key)
    except _BadArgument:
        return None


class _BadArgument(Exception):
    pass


def _layout(node: Node | None, refusals: Refusals, key: str) -> Placement | None:
    """A placement, or the first of a tuple whose other entries are ``None`` (the attention's
    other inputs, its rotary tables, are not touched)."""
    if node is None or node.value is None:
        return None
    if isinstance(node.value, tuple):
        first, *rest = node.value or (None,)
        if any(n.value is not None for n in rest):
            refusals.add(codes.UNSUPPORTED_IMPORT, f"{quoted(key)}: layouts for inputs after "
                         "the first; the reference modules take the activation first and "
                         "tables after it", node)
            raise _BadArgument()
        return _layout(first, refusals, key)
    return _placement(node, refusals, key)


def _placement(node: Node, refusals: Refusals, key: str) -> Placement:
    call = node.value
    if not isinstance(call, Call):
        refusals.add(codes.MALFORMED_IMPORT, f"{quoted(key)}: expected a placement such as "
                     "Shard(1) or Replicate()", node)
        raise _BadArgument()
    name = call.name.rsplit(".", 1)[-1]
    if name == "Shard" and len(call.args) + len(call.kwargs) == 1:
        dim = (call.args or (dict(call.kwargs).get("dim"),))[0]
        if dim is not None and isinstance(dim.value, int) and not isinstance(dim.value, bool):
            return Placement("S", dim.value)
    elif name in ("Replicate", "Partial") and not call.args and not call.kwargs:
        return Placement(name[0])
    elif name == "Partial":
        refusals.add(codes.UNSUPPORTED_IMPORT, f"{quoted(key)}: a Partial placement with a "
                     "reduce op", node)
        raise _BadArgument()
    refusals.add(codes.UNKNOWN_STYLE, f"{quoted(key)}: unknown placement {quoted(name)}; "
                 "expected Shard(dim), Replicate() or Partial()", node)
    raise _BadArgument()


def _flag(node: Node | None, default: bool, refusals: Refusals, key: str) -> bool:
    if node is None:
        return default
    if not isinstance(node.value, bool):
        refusals.add(codes.MALFORMED_IMPORT, f"{quoted(key)}: use_local_output must be True "
                     "or False", node)
        raise _BadArgument()
    return node.value


def _int(node: Node | None, default: int, refusals: Refusals, key: str) -> int:
    if node is None:
        return default
    if not isinstance(node.value, int) or isinstance(node.value, bool):
        refusals.add(codes.MALFORMED_IMPORT, f"{quoted(key)}: expected an integer", node)
        raise _BadArgument()
    return node.value


# ---------------------------------------------------------------- keys -> modules


class _Assignment:
    """Which style applies to which module: ``top[path]`` and ``layers[i][path]`` (paths of
    the reference model, relative to the layer; ``""`` is the layer itself)."""

    def __init__(self, model: ReferenceModel, n_layers: int, renames: dict[str, str],
                 refusals: Refusals) -> None:
        self.model = model
        self.n_layers = n_layers
        ours_to_foreign = {ours: foreign for foreign, ours in renames.items()}
        self.foreign = {ours_to_foreign.get(m.path, m.path): m.path
                        for m in model.before + model.after}
        self.foreign[model.layer_list or "layers"] = ""
        self.refusals = refusals
        self.top: dict[str, Style] = {}
        self.layers: list[dict[str, Style]] = [{} for _ in range(n_layers)]

    def top_keys(self, plan: Node | None) -> None:
        for key, node in plan.items() if plan is not None else ():
            style = _style(node, key, self.refusals)
            head, _, rest = key.partition(".")
            tops = [f for f in self.foreign if fnmatch.fnmatchcase(f, head)]
            matched = False
            for foreign in tops:
                ours = self.foreign[foreign]
                if ours:
                    matched |= not rest and self._put(self.top, ours, style, node, key)
                else:
                    matched |= self._in_layers(rest, style, node, key)
            if not matched:
                self._unmapped(key, node)

    def layer_keys(self, plan: Node | None) -> None:
        for key, node in plan.items() if plan is not None else ():
            style = _style(node, key, self.refusals)
            matched = False
            for index in range(self.n_layers):
                matched |= self._match_layer(index, key, style, node)
            if not matched:
                self._unmapped(key, node)

    def _in_layers(self, rest: str, style: Style | None, node: Node, key: str) -> bool:
        index_atom, _, relative = rest.partition(".")
        matched = False
        for index in range(self.n_layers):
            if rest and fnmatch.fnmatchcase(str(index), index_atom):
                matched |= self._match_layer(index, relative, style, node, key)
        return matched

    def _match_layer(self, index: int, relative: str, style: Style | None, node: Node,
                     key: str | None = None) -> bool:
        paths = [m.path for m in self.model.layer
                 if _atoms_match(relative, m.path)]
        for path in paths:
            self._put(self.layers[index], path, style, node, key or relative)
        return bool(paths)

    def _put(self, table: dict[str, Style], path: str, style: Style | None, node: Node,
             key: str) -> bool:
        if style is None:
            return True
        if path in table:
            self.refusals.add(codes.MALFORMED_IMPORT, f"{quoted(key)} gives a second style "
                              f"to a module {quoted(table[path].key)} already styles",
                              node.key_or_value_span)
        else:
            table[path] = style
        return True

    def _unmapped(self, key: str, node: Node) -> None:
        known = list(self.foreign) + [f"layers.*.{m.path}" for m in self.model.layer if m.path]
        hint = did_you_mean(key, known)
        self.refusals.add(codes.UNMAPPED_MODULE, f"{quoted(key)} matches no module of the "
                          "reference model" + (f"; {hint}" if hint else ""),
                          node.key_or_value_span,
                          notes=["torchtitan names: " + ", ".join(known)])


def _atoms_match(pattern: str, path: str) -> bool:
    """``parallelize_module``'s matching: one fnmatch per dotted atom."""
    atoms, parts = pattern.split(".") if pattern else [], path.split(".") if path else []
    return len(atoms) == len(parts) and all(
        fnmatch.fnmatchcase(p, a) for a, p in zip(atoms, parts, strict=True))


# ---------------------------------------------------------------- the data flow


class _Flow:
    """The Llama forward, module by module, with the state of each activation."""

    def __init__(self, model: ReferenceModel, options: ImportOptions,
                 refusals: Refusals) -> None:
        self.model = model
        self.options = options
        self.refusals = refusals
        self.rank = model.activation_rank
        self.last = model.feature_dim

    def run(self, assign: _Assignment) -> tuple[tuple[Line, ...], tuple[tuple[Line, ...], ...],
                                                 tuple[Line, ...]]:
        top = assign.top
        before, x = self.site("embed", self.module("embed"), top.get("embed"), LOCAL)
        layers = []
        for index, styles in enumerate(assign.layers):
            lines, x = self.layer(styles, x, index)
            layers.append(lines)
        after, x = self.site("norm", self.module("norm"), top.get("norm"), x)
        head, logits = self.site("output", self.module("output"), top.get("output"), x,
                                 head=True)
        return before, tuple(layers), after + head + self.loss(logits, top.get("output"))

    def module(self, path: str) -> Module:
        module = self.model.top(path) or self.model.in_layer(path)
        assert module is not None, path
        return module

    def layer(self, styles: dict[str, Style], x: State, index: int) -> tuple[
            tuple[Line, ...], State]:
        lines, x = self.site("l", self.module(""), styles.get(""), x)
        self.require_local(x, f"the input of layer {index}", styles.get(""))
        attention, h = self.block(styles, "attention_norm", "attention",
                                  ("attention.wq", "attention.wk", "attention.wv"),
                                  "attention.wo", x)
        ffn, out = self.block(styles, "ffn_norm", "feed_forward",
                              ("feed_forward.w1", "feed_forward.w3"), "feed_forward.w2", h)
        return lines + attention + ffn, out

    def block(self, styles: dict[str, Style], norm: str, container: str,
              inputs: tuple[str, ...], output: str, x: State) -> tuple[tuple[Line, ...], State]:
        """``x + container(norm(x))`` where the container's ``inputs`` linears read its input
        and ``output`` reads their (local) results."""
        lines, normed = self.site(f"l.{norm}", self.module(norm), styles.get(norm), x)
        more, inner = self.site(f"l.{container}", self.module(container), styles.get(container),
                                normed)
        lines += more
        if not inner.local and inner.dtensor == REPLICATE:
            self.require_colwise(styles, inputs, container)
        for name in inputs:
            more, result = self.site(f"l.{name}", self.module(name), styles.get(name), inner)
            lines += more
            self.require_local(result, f"the output of {name}", styles.get(name))
        more, result = self.site(f"l.{output}", self.module(output), styles.get(output), LOCAL)
        self.require_local(result, f"the output of {output} (added to the residual stream)",
                           styles.get(output))
        return lines + more, LOCAL

    def require_colwise(self, styles: dict[str, Style], inputs: tuple[str, ...],
                        container: str) -> None:
        """A replicated DTensor's gradient is reduced where it was made only if every consumer
        returns a partial gradient, as ColwiseParallel's input gradient is."""
        for name in inputs:
            style = styles.get(name)
            if style is None or style.cls != "ColwiseParallel":
                where = style.node if style else styles[container].node
                self.refusals.add(codes.INEXPRESSIBLE_PLAN, f"{container}'s input becomes a "
                                  f"replicated DTensor, but {name} is "
                                  f"{'not styled' if style is None else style.cls}: its input "
                                  "gradient is not partial, and what DTensor does with the "
                                  "mixture is decided at run time", where)

    def require_local(self, state: State, what: str, style: Style | None) -> None:
        if not state.local:
            self.refusals.add(codes.UNSUPPORTED_IMPORT, f"{what} is {state}; DTensor "
                              "activations outside the transcribed cases are not imported",
                              style.node if style else state.origin,
                              help="set use_local_output=True, or write this part by hand")

    # ---------------------------------------------------------------- one module

    def site(self, path: str, module: Module, style: Style | None, x: State,
             head: bool = False) -> tuple[tuple[Line, ...], State]:
        if style is None:
            return (), x if module.kind == CONTAINER else self.plain(path, x)
        if style.cls == "SequenceParallel":
            return self.sequence_parallel(path, module, style, x)
        if style.cls == "PrepareModuleInput":
            return self.prepare_input(path, module, style, x)
        if module.kind == LINEAR:
            return self.colwise(path, module, style, x, head) if style.cls == \
                "ColwiseParallel" else self.rowwise(path, module, style, x)
        if module.kind == EMBEDDING and style.cls == "RowwiseParallel":
            return self.vocab_embedding(path, style, x)
        return self.refuse(style, f"{style.cls} on {_name(path)}, a {module.kind}, is not "
                                  "transcribed (it applies to linear layers here)", x)

    def plain(self, path: str, x: State) -> State:
        if not x.local:
            self.refusals.add(codes.INEXPRESSIBLE_PLAN, f"{_name(path)} has no style but "
                              f"receives {x}; torch cannot mix its plain parameters with a "
                              "DTensor", x.origin)
        return LOCAL

    def refuse(self, style: Style, why: str, x: State,
               code=codes.UNSUPPORTED_IMPORT) -> tuple[tuple[Line, ...], State]:
        self.refusals.add(code, f"{quoted(style.key)}: {why}", style.node)
        return (), LOCAL

    def dim(self, placement: Placement) -> Placement:
        if placement.kind == "S" and placement.dim is not None and placement.dim < 0:
            return Placement("S", placement.dim + self.rank)
        return placement

    def arriving(self, style: Style, x: State, declared: Placement) -> Placement:
        """What DTensor holds at the module input: a DTensor's own placement, or a plain
        tensor taken as ``declared`` (from_local)."""
        return self.dim(x.dtensor if x.dtensor is not None else declared)

    def colwise(self, path: str, module: Module, style: Style, x: State,
                head: bool) -> tuple[tuple[Line, ...], State]:
        arriving = self.arriving(style, x, style.input or REPLICATE)
        if arriving == REPLICATE:
            lines = patterns.split_rows(path, module.has_bias, TENSOR, style.note) if \
                not x.local else \
                patterns.column_parallel(path, module.has_bias, TENSOR, style.note)
        elif arriving.kind == "S" and arriving.dim == self.model.seq_dim and \
                not module.has_bias:
            lines = patterns.column_parallel_gather(path, TENSOR, arriving.dim, style.note)
        else:
            return self.refuse(style, f"ColwiseParallel receiving {arriving} is not "
                                      "transcribed", x)
        output = self.dim(style.output or Placement("S", self.last))
        if output == Placement("S", self.last):
            if style.local_output or head:
                return lines, LOCAL if style.local_output else State(output, style.node)
            return self.refuse(style, "the split output stays a DTensor", x)
        if output == REPLICATE and style.local_output:
            return lines + (Line(f"all-gather {path}.out over {TENSOR} dim={self.last} "
                                 "backward scatter", style.note),), LOCAL
        return self.refuse(style, f"ColwiseParallel with output_layouts={output} and "
                                  f"use_local_output={style.local_output}", x)

    def rowwise(self, path: str, module: Module, style: Style,
                x: State) -> tuple[tuple[Line, ...], State]:
        arriving = self.arriving(style, x, style.input or Placement("S", self.last))
        lines: tuple[Line, ...] = ()
        if arriving == REPLICATE:
            lines = (Line(f"scatter {path}.in over {TENSOR} dim={self.last}", style.note),)
        elif arriving != Placement("S", self.last):
            return self.refuse(style, f"RowwiseParallel receiving {arriving}", x)
        if not style.local_output:
            return self.refuse(style, "the output stays a DTensor (use_local_output=False)", x)
        output = self.dim(style.output or REPLICATE)
        if output == REPLICATE:
            return lines + patterns.row_parallel(path, module.has_bias, TENSOR,
                                                 style.note), LOCAL
        if output == Placement("S", self.model.seq_dim) and not module.has_bias:
            return lines + patterns.row_parallel_scatter(path, TENSOR, self.model.seq_dim,
                                                         style.note), LOCAL
        return self.refuse(style, f"RowwiseParallel with output_layouts={output}"
                                  + (" and a bias" if module.has_bias else ""), x)

    def vocab_embedding(self, path: str, style: Style,
                        x: State) -> tuple[tuple[Line, ...], State]:
        if self.arriving(style, x, style.input or Placement("S", -1)) != REPLICATE:
            return self.refuse(style, "RowwiseParallel on an embedding takes its token ids as "
                                      "Shard(-1) unless input_layouts=Replicate(): DTensor "
                                      "would all-gather the ids along the sequence", x,
                               codes.INEXPRESSIBLE_PLAN)
        if not style.local_output:
            return self.refuse(style, "the output stays a DTensor (use_local_output=False)", x)
        output = self.dim(style.output or REPLICATE)
        if output == REPLICATE:
            return patterns.vocab_parallel_embedding(path, TENSOR, None, style.note), LOCAL
        if output == Placement("S", self.model.seq_dim):
            return patterns.vocab_parallel_embedding(path, TENSOR, self.model.seq_dim,
                                                     style.note), LOCAL
        return self.refuse(style, f"an embedding with output_layouts={output}", x)

    def sequence_parallel(self, path: str, module: Module, style: Style,
                          x: State) -> tuple[tuple[Line, ...], State]:
        """Replicated parameters whose gradients are partial (each rank saw its own tokens),
        computed on the sequence shard a plain input is taken to be."""
        if not module.params:
            return self.refuse(style, f"SequenceParallel on {_name(path)}, which has no "
                                      "parameters", x)
        shard = self.dim(Placement("S", style.sequence_dim))
        if not x.local and x.dtensor != shard:
            return self.refuse(style, f"SequenceParallel receiving {x}", x)
        lines = patterns.gradient_all_reduce(path, module.params, TENSOR, style.note)
        return lines, LOCAL if style.local_output else State(shard, style.node)

    def prepare_input(self, path: str, module: Module, style: Style,
                      x: State) -> tuple[tuple[Line, ...], State]:
        if module.kind != CONTAINER:
            return self.refuse(style, f"PrepareModuleInput on {_name(path)}, a {module.kind}",
                               x)
        if style.local_output:
            return self.refuse(style, "PrepareModuleInput with use_local_output=True", x)
        declared, desired = style.input, style.desired
        if declared is None or desired is None:
            return self.refuse(style, "PrepareModuleInput without input_layouts and "
                                      "desired_input_layouts for the first input", x)
        declared, desired = self.dim(declared), self.dim(desired)
        if not x.local and x.dtensor != declared:
            return self.refuse(style, f"input_layouts says {declared} but the input is {x}",
                               x, codes.INEXPRESSIBLE_PLAN)
        if declared == desired == REPLICATE and x.local:
            return (Line(f"copy {path}.in over {TENSOR}", style.note),), \
                State(desired, style.node)
        if declared == desired:
            return (), State(desired, style.node)
        if declared.kind == "S" and desired == REPLICATE:
            return (Line(f"all-gather {path}.in over {TENSOR} dim={declared.dim}",
                         style.note),), State(desired, style.node)
        return self.refuse(style, f"PrepareModuleInput from {declared} to {desired}", x)

    def loss(self, logits: State, style: Style | None) -> tuple[Line, ...]:
        if logits.local:
            return ()
        if self.options.loss_parallel is None:
            self.refusals.add(codes.MALFORMED_IMPORT, "the logits stay a DTensor split over "
                              "the vocabulary (use_local_output=False): whether the train "
                              "step computes the loss under loss_parallel() is not in the plan",
                              style.node if style else None,
                              help="pass --loss-parallel (torchtitan's default) or "
                                   "--no-loss-parallel")
            return ()
        if not self.options.loss_parallel:
            self.refusals.add(codes.UNSUPPORTED_IMPORT, "a cross-entropy of DTensor logits "
                              "outside loss_parallel() is not transcribed",
                              style.node if style else None)
            return ()
        note = style.note + " + loss_parallel()" if style else "loss_parallel()"
        return patterns.vocab_parallel_loss("output", TENSOR, note)


def _name(path: str) -> str:
    return path.removeprefix("l.") if path != "l" else "the layer"
