"""Symmetry: identical blocks are proven once.

A proof cut at every block boundary (``check/stages.py``) leaves each block of the step as a
stage of its own: the plan's stage program for the block on every rank of its pipeline place
and every microbatch, and the reference's forward and backward calls of the block, both
reading fresh variables for the hidden state ``X`` entering the block and the cotangent ``Y``
leaving it. The obligations of block ``j`` (the value and the cotangent it computes at its
two cuts, the final gradient of each of its parameters on every rank, their updates and
optimizer states, the claims on its points) are terms in its own parameters and optimizer
states, its two cut variables and the step's shared inputs (rope tables, ...).

The *canonical form* of a block's stage is everything those obligations are computed from,
with the block's own index written relative to the block (``layers.5.attention.wq.weight``
in block 5 reads ``layers.#.attention.wq.weight``, the boundary ``layers.4.out`` reads
``layers.#-1.out``) and the lowering's transfer names replaced by their points: the stage's
graph as printed IR, its input and output slots with their layouts, the two cuts (layouts
and cotangent ratio), each parameter's layout, final gradient layout and holders, the
gradient statements acting on each parameter, the optimizer update of each (its layouts,
ZeRO block, states and graph), the claims on its gradients and on the points its stage
observes, and the reference's calls for the block (which graph, which arguments, which
results) and for its parameters' updates. Two blocks whose canonical forms are equal as
text compute the same obligations up to a bijective renaming of variables (index ``j`` to
index ``k``): every obligation is an identity over all values of its variables, so the
representative's proof is the other's.

Only exact equality of canonical forms merges blocks; a block whose form is unique is
proven itself. Nothing is merged when the step couples its parameters (``clip-grad-norm``'s
global norm) or when an optimizer hyper-parameter depends on the rank (per-rank overrides,
which may name the pipeline coordinate). A block that orders computed values (top-k
routing) merges like any other: its representative's obligations are identities over every
value of its variables *under the routing the representative takes at its drawn values*
(``check/symbolic.py``), so the renaming proves the merged block under that same routing.
The verdict says so (``Symmetry.ordered``): the drawn routing a merged block is proven for is
its representative's, not the one its own drawn values would take. A renamed name that is
a known integer input (token ids, labels), whose value is fixed rather than a variable, also
stops the merge.

The proof then runs the programs with the merged blocks' stages and reference calls
replaced by zeros (``evaluate_parallel(skip=...)``, ``evaluate_program(skip=...)``) and
their parameters and optimizer states bound to zeros: the cut variables stand where their
values would be read, and the final checks of the merged blocks' tensors are the
representatives' (``Symmetry.covers``). A value at a cut computed by a merged stage has no
obligation (``SymbolicCuts``); the other direction of the same cut, computed by a stage
that runs, keeps its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainverify_dsl.check.pair import POINT, CheckPair
from trainverify_dsl.check.stages import CHECK as CUT_CHECK
from trainverify_dsl.check.symbolic import ORDERINGS
from trainverify_dsl.ir.compare import Comparison
from trainverify_dsl.ir.parallel import ParallelProgram, Stage
from trainverify_dsl.ir.printer import format_graph
from trainverify_dsl.ir.program import Program

_POINT = re.compile(r"^(?P<list>.+)\.(?P<index>\d+)\.(?:in|out)$")
_MARK = re.compile(r"\bmark_\d+\b")


@dataclass(frozen=True)
class Symmetry:
    """Which blocks' stages the proof does not run, and what covers them."""

    #: plan stage indices not evaluated (each has a representative with the same form)
    skipped_stages: frozenset[int]
    #: reference call indices not evaluated
    skipped_calls: frozenset[int]
    #: compared tensors whose comparisons the representatives' stand for: the merged
    #: blocks' ``grad(p)``, ``new(p)``, ``new(s(p))`` and the points their stages observe
    covered: frozenset[str]
    #: (representative stage, merged stages) per class with more than one member
    classes: tuple[tuple[int, tuple[int, ...]], ...]
    #: inputs of the step only skipped stages and calls read (the merged blocks'
    #: parameters and optimizer states): the proof binds them to zeros, not variables
    unread: frozenset[str] = frozenset()
    #: some merged block orders computed values (top-k routing): it is proven under its
    #: representative's drawn routing
    ordered: bool = False

    def covers(self, where: Comparison) -> bool:
        """Whether a comparison of the final checks is a merged block's (its representative's
        stands for it). The cuts' own comparisons are never covered here: a value at a cut
        is skipped by the stage that computes it (``SymbolicCuts``), and the cut between a
        merged block and a stage that runs has its other direction computed by that stage."""
        if where.check == CUT_CHECK:
            return False
        return where.tensor in self.covered

    def describe(self) -> str:
        merged = sum(len(m) for _, m in self.classes)
        return (f"{merged} block stages proven by their representatives' proofs "
                f"({len(self.classes)} classes of identical canonical form: "
                + "; ".join(f"stage {r} for {', '.join(map(str, m))}"
                            for r, m in self.classes[:4])
                + ("; ..." if len(self.classes) > 4 else "") + ")")


def list_path(pair: CheckPair) -> str | None:
    """The module list whose blocks the boundaries separate (``layers``)."""
    paths = {m.group("list") for b in pair.boundaries for p in b.points
             if (m := _POINT.match(p)) is not None}
    return next(iter(paths)) if len(paths) == 1 else None


def find(pair: CheckPair, cuts: list[Any]) -> Symmetry | None:
    """The classes of identical block stages of the cut proof, or ``None`` when nothing
    can be merged (module docstring)."""
    program, reference = pair.program, pair.reference
    path = list_path(pair)
    if path is None or program.clip is not None or \
            (program.optimizer is not None and program.optimizer.overrides):
        return None
    pattern = re.compile(r"(?<![\w])" + re.escape(path) + r"\.(\d+)(?!\d)")
    if any(pattern.search(name) for name in pair.known):
        return None
    marks = {t.value: t.point for t in program.transfers if t.point is not None}
    marks.update({t.sent: t.point for t in program.transfers
                  if t.sent is not None and t.point is not None})
    aliases = _aliases(pair.boundaries, path, program)
    by_dest = {t.dest: c for c in cuts for t in c.transfers if c.scale is not None}
    by_source = {t.source: c for c in cuts for t in c.transfers if c.scale is not None}
    classes: dict[str, list[tuple[int, int]]] = {}
    for stage in program.stages:
        block = _pure_block(program, stage, path)
        if block is None or stage.index not in by_dest or stage.index not in by_source:
            continue
        if any((t.dest == stage.index and t not in by_dest[stage.index].transfers) or
               (t.source == stage.index and t not in by_source[stage.index].transfers)
               for t in program.transfers):
            continue  # a value crossing into or out of the block that is not cut
        calls = _block_calls(reference, path, block, _params(stage))
        if not calls:
            continue  # no calls to skip
        key = _canonical(program, reference, stage, calls,
                         (by_dest[stage.index], by_source[stage.index]),
                         lambda text, b=block: _normalise(text, pattern, b, marks, aliases))
        classes.setdefault(key, []).append((stage.index, block))
    merged = [members for members in classes.values() if len(members) > 1]
    if not merged:
        return None
    skipped_stages: set[int] = set()
    skipped_calls: set[int] = set()
    covered: set[str] = set()
    unread: set[str] = set()
    out: list[tuple[int, tuple[int, ...]]] = []
    ordered = False
    for members in merged:
        (first, _), rest = members[0], members[1:]
        out.append((first, tuple(s for s, _ in rest)))
        for index, block in rest:
            stage = program.stages[index]
            skipped_stages.add(index)
            params = _params(stage)
            calls = _block_calls(reference, path, block, params)
            skipped_calls.update(calls)
            ordered = ordered or _orders([stage.graph] + [
                reference.graph(reference.calls[k].graph) for k in calls])
            covered.update(s.spec for s in stage.outputs if s.kind == "lineage")
            for p in params:
                covered.update({f"grad({p})", f"new({p})"})
                unread.add(p)
            for u in (program.optimizer.updates if program.optimizer else ()):
                if u.param in params:
                    covered.update(f"new({s}({u.param}))" for s in u.states)
                    unread.update(f"{s}({u.param})" for s in u.states)
    # a point observed by a stage that runs as well is compared there
    covered -= {s.spec for st in program.stages if st.index not in skipped_stages
                for s in st.outputs if s.kind == "lineage"}
    if not _closed(reference, skipped_calls, cuts) or \
            not _unread(program, reference, skipped_stages, skipped_calls, unread) or \
            not _points_run(program, reference, skipped_calls, covered):
        return None
    return Symmetry(frozenset(skipped_stages), frozenset(skipped_calls), frozenset(covered),
                    tuple(out), frozenset(unread), ordered)


def _orders(graphs: list[Any]) -> bool:
    return any(node.op in ORDERINGS for graph in graphs for node in graph.nodes)


def _params(stage: Stage) -> tuple[str, ...]:
    return tuple(s.spec for s in stage.inputs if s.kind == "param")


def _pure_block(program: ParallelProgram, stage: Stage, path: str) -> int | None:
    """The block a stage computes when it computes nothing else: every parameter it reads
    is one block's and held by this stage alone; it seeds no backward, computes no loss or
    token count, reads no pipeline coordinate, and no layout of its slots names the
    pipeline axis (its values do not depend on the place it runs on)."""
    params = _params(stage)
    if not params:
        return None
    found = {m.group(1) for p in params
             if (m := re.match(re.escape(path) + r"\.(\d+)\.", p)) is not None}
    if len(found) != 1 or not all(p.startswith(f"{path}.{next(iter(found))}.")
                                  for p in params):
        return None
    if any(program.holders(p) != (stage.index,) for p in params):
        return None
    pipeline = program.pipeline_axis
    for slot in stage.inputs + stage.outputs:
        if slot.kind in ("seed", "denominator", "loss") or \
                (slot.kind == "coord" and slot.spec == pipeline):
            return None
        if pipeline is not None and _names_axis(slot.layout, pipeline):
            return None
    return int(next(iter(found)))


def _names_axis(layout: Any, axis: str) -> bool:
    if layout.partial is not None and axis in layout.partial[1]:
        return True
    return any(axis in f.axes for dim in layout.dims for f in dim)


def _block_calls(reference: Program, path: str, block: int, params: tuple[str, ...]
                 ) -> list[int]:
    """The reference's calls for the block (its forward and backward) and for its
    parameters' updates, by index."""
    prefix = f"{path}.{block}"
    updates = {f"new({p})" for p in params}
    return [k for k, call in enumerate(reference.calls)
            if call.prefix == prefix or updates.intersection(call.results)]


def _canonical(program: ParallelProgram, reference: Program, stage: Stage,
               calls: list[int], cuts: tuple[Any, Any], norm: Any) -> str:
    params = set(_params(stage))
    final = program.final_grad_layouts()
    layouts = dict(program.param_layouts)
    parts = [format_graph(stage.graph, "stage"), repr(stage.inputs), repr(stage.outputs)]
    for cut in cuts:  # the boundary by its value and cotangent (its points are aliases)
        parts.append(repr((cut.point, cut.boundary.value, cut.boundary.cotangent, cut.layout,
                           cut.cotangent_layout, cut.scale)))
    for p in sorted(params):
        parts.append(repr((p, layouts[p], final[p])))
    for i, sync in enumerate(program.grad_syncs):
        mine = tuple(p for p in sync.params if p in params)
        if mine:
            parts.append(repr((i, sync.kind, sync.axes, sync.op, sync.dim, sync.after, mine)))
    if program.optimizer is not None:
        for u in program.optimizer.updates:
            if u.param in params:
                parts.append(repr((u.param, u.layout, u.block, u.states)))
                parts.append(format_graph(u.graph, "update"))
    observed = {s.spec for s in stage.outputs if s.kind == "lineage"}
    for claim in program.claims:
        target = claim.target
        inner = target[5:-1] if target.startswith("grad(") else target
        if inner in params or target in observed:
            parts.append(repr((target, claim.layout)))
    for k in calls:
        call = reference.calls[k]
        parts.append(repr((call.graph, call.args, call.results, call.prefix, call.label)))
    return norm("\n".join(parts))


def _aliases(boundaries: tuple[Any, ...], path: str, program: ParallelProgram
             ) -> tuple[re.Pattern[str], dict[str, str]] | None:
    """One name for each block boundary, whatever names it: the hidden state entering block
    ``j`` is ``{path}.j.in`` whether the plan's transfer or the reference calls it
    ``layers.j-1.out``, the embedding's output or ``outer/block_in.0``; its value is
    ``{path}.j/in``, its cotangent ``{path}.j/grad(in)`` (the boundary after the last block
    is that of a block past the end). So the first and last blocks read and write their
    boundaries under the names the others do. Returns the substitution (names as they stand
    quoted, or after a ``.``, ``(`` or ``@``: a slot or reference name, never an op)."""
    names: dict[str, str] = {}
    for b in boundaries:
        entering = next((p for p in b.points if p.endswith(".in")), None)
        if entering is None:
            m = re.fullmatch(re.escape(path) + r"\.(\d+)\.out", b.points[0])
            if m is None:
                continue
            entering = f"{path}.{int(m.group(1)) + 1}.in"
        block = entering[:-len(".in")]
        names.update({p: entering for p in b.points})
        names[b.value] = f"{block}/in"
        names[b.cotangent] = f"{block}/grad(in)"
    for t in program.transfers:  # a value received before its `.in` mark (the embedding's)
        if t.point in names and not _MARK.fullmatch(t.value):
            names[t.value] = f"@{names[t.point]}"
    if not names:
        return None
    keys = sorted(names, key=len, reverse=True)
    found = re.compile(r"(?<=['\"(.@])(?:" + "|".join(map(re.escape, keys)) + r")(?=['\"), ])")
    return found, names


def _normalise(text: str, pattern: re.Pattern[str], block: int,
               marks: Mapping[str, str],
               aliases: tuple[re.Pattern[str], dict[str, str]] | None = None) -> str:
    """``text`` with transfer names replaced by their points, every block boundary by its
    one name (``_aliases``) and every index of the block list written relative to
    ``block``."""
    text = _MARK.sub(lambda m: f"@{marks[m.group(0)]}" if m.group(0) in marks
                     else m.group(0), text)
    if aliases is not None:
        found, names = aliases
        text = found.sub(lambda m: names[m.group(0)], text)

    def relative(m: re.Match[str]) -> str:
        d = int(m.group(1)) - block
        return m.group(0)[:-len(m.group(1))] + ("#" if d == 0 else f"#{d:+d}")
    return pattern.sub(relative, text)


def _closed(reference: Program, skipped: set[int], cuts: list[Any]) -> bool:
    """Every value a run call reads from a skipped call is a cut (read as fresh variables),
    so zeros in the skipped calls' place change nothing that is compared."""
    replaced = {c.boundary.value for c in cuts} | \
        {c.boundary.cotangent for c in cuts if c.scale is not None}
    produced: set[str] = set()
    for k in sorted(skipped):
        produced.update(reference.calls[k].results)
    for k, call in enumerate(reference.calls):
        if k in skipped:
            continue
        if any(a in produced and a not in replaced for a in call.args):
            return False
    return True


def _unread(program: ParallelProgram, reference: Program, stages: set[int], calls: set[int],
            names: set[str]) -> bool:
    """No stage or reference call that runs reads one of ``names`` (besides the optimizer
    step of the merged parameters, whose results are covered comparisons)."""
    for stage in program.stages:
        if stage.index not in stages and any(s.spec in names for s in stage.inputs):
            return False
    return not any(k not in calls and names.intersection(call.args)
                   for k, call in enumerate(reference.calls))


def _points_run(program: ParallelProgram, reference: Program, calls: set[int],
                covered: set[str]) -> bool:
    """Every claim and lineage that is still compared reads a reference value computed by a
    call that runs (a point observed by a stage that runs, but computed on the reference's
    side by a skipped call, would compare zeros with zeros)."""
    skipped = {r for k in calls for r in reference.calls[k].results}
    targets = {c.target for c in program.claims} | {lin.point for lin in program.lineages}
    outputs = dict(reference.outputs)
    return not any(outputs.get(f"{POINT}{t}") in skipped for t in targets
                   if t not in covered and not t.startswith("grad(") and t != "loss")
