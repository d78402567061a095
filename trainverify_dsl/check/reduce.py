"""What a proof at reduced sizes rests on: the shape-reduction classes of the step's ops.

``tvp check`` proves a pair built at shrunk widths (``shrink.py`` keeps every divisibility
of the plan, every width >= 2 that was, layer counts and top-k). That such a proof carries to
the full sizes is the argument of docs/checking.md, "Shape reduction", which holds for the
op classes of the registry (``ir.ops.REDUCTION_CLASSES``) under the preconditions listed
there. This module reads the classes off the pair: every op of the reference step and of the
parallel program (stage graphs, update, clipping and token-count graphs). An op without a
class makes a reduced proof ``inconclusive`` (``problem``); otherwise the verdict's
assumption names the classes the argument was needed for (``assumption``).
"""

from __future__ import annotations

from collections.abc import Iterator

from trainverify_dsl.ir.graph import Graph
from trainverify_dsl.ir.ops import OPS
from trainverify_dsl.ir.parallel import ParallelProgram
from trainverify_dsl.ir.program import Program


def _graphs(reference: Program, program: ParallelProgram) -> Iterator[Graph]:
    yield from (g for _, g in reference.graphs)
    yield from (st.graph for st in program.stages)
    if program.optimizer is not None:
        yield from (u.graph for u in program.optimizer.updates)
        yield from (g for o in program.optimizer.overrides for _, g in o.graphs)
    if program.clip is not None:
        clip = program.clip
        yield from (g for _, g in clip.squares + clip.scales)
        yield from (clip.add, clip.coefficient)
    if program.loss.count is not None:
        yield program.loss.count


def classes(reference: Program, program: ParallelProgram) -> dict[str | None, list[str]]:
    """The ops of both programs by shape-reduction class (``None``: ops without one)."""
    seen: dict[str | None, list[str]] = {}
    names = sorted({node.op for g in _graphs(reference, program) for node in g.nodes})
    for name in names:
        seen.setdefault(OPS[name].reduction_class, []).append(name)
    return seen


def problem(pair: object) -> str | None:
    """Why a proof of ``pair`` at its reduced sizes would not carry to the full ones, or
    ``None``. Only a shrunk pair (``pair.sizes``) needs the argument."""
    if not getattr(pair, "sizes", None):
        return None
    missing = classes(pair.reference, pair.program).get(None)  # type: ignore[attr-defined]
    if not missing:
        return None
    return (f"the step was reduced to smaller widths, but the ops {', '.join(missing)} have no "
            "shape-reduction class (ir/ops.py): a proof at the reduced sizes says nothing "
            "about the full ones")


def assumption(pair: object) -> str | None:
    """The shape-reduction assumption of a shrunk pair's verdict, naming the op classes."""
    sizes = getattr(pair, "sizes", None)
    if not sizes:
        return None
    found = classes(pair.reference, pair.program)  # type: ignore[attr-defined]
    kinds = ", ".join(f"{c} ({len(ops)})" for c, ops in sorted(
        ((c, ops) for c, ops in found.items() if c is not None), key=lambda item: item[0]))
    widths = ", ".join(f"{k}={v}" for k, v in sizes.items())
    return (f"shape reduction: proven at shrunk widths ({widths}) that keep every split's "
            f"divisibility (trainverify_dsl/shrink.py); the step's ops are of the classes "
            f"{kinds}, for which docs/checking.md argues (not proven) that the reduced proof "
            "carries to the full sizes under its preconditions")
