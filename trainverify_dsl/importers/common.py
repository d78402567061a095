"""What every importer shares: its options, its refusals, the mesh and the data-parallel part.

A foreign plan says how some modules are parallelised; it never says everything a `.tvp` plan
states (which reference model and config, batch, sequence, mesh sizes, the optimizer). Those
come from ``ImportOptions``, and a missing one is refused, never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from trainverify_dsl.importers.emit import Line
from trainverify_dsl.importers.models import ReferenceConfig
from trainverify_dsl.importers.source import Node
from trainverify_dsl.report import codes_import as codes
from trainverify_dsl.report.diagnostics import Code, Diagnostic
from trainverify_dsl.report.span import Span

#: The mesh axis names the importers give a meaning (docs/importers.md).
DATA, TENSOR, PIPELINE = "dp", "tp", "pp"
AXES = (PIPELINE, DATA, TENSOR)


@dataclass(frozen=True, slots=True)
class ImportOptions:
    """Inputs a foreign format lacks. ``None`` means not given."""

    config: ReferenceConfig
    seq: int
    batch: int | None = None
    #: ``((axis, size), ...)`` outermost first; axes from ``AXES``
    mesh: tuple[tuple[str, int], ...] | None = None
    microbatches: int | None = None
    schedule: str | None = None
    #: ``sgd lr=0.01`` (no ``shard over``): the plan's optimizer and the reference recipe
    optimizer: str | None = None
    name: str | None = None
    #: layers per pipeline stage
    pp_division: tuple[int, ...] | None = None
    #: torchtitan: the train step computes the loss under ``loss_parallel()``
    loss_parallel: bool | None = None
    #: Galvatron: the number of devices
    world_size: int | None = None
    #: Galvatron: ``--sequence-parallel`` (Megatron sequence parallelism) was on
    sequence_parallel: bool = False
    #: nnScaler: the operator table (cid -> signature, module)
    ops: str | None = None


class Refused(Exception):
    """Stop importing: the diagnostics collected so far say why."""


@dataclass(slots=True)
class Refusals:
    """Collects the reasons a foreign plan is refused; one run reports every one it can."""

    file: str
    items: list[Diagnostic] = field(default_factory=list)

    def add(self, code: Code, message: str, where: Node | Span | None = None, *,
            notes: Iterable[str] = (), help: str | None = None) -> None:
        """``where``: a node (its value), a span (a key: ``node.key_span``), or nothing (the
        file as a whole)."""
        span = where.span if isinstance(where, Node) else where or Span.point(self.file, 1, 1)
        diagnostic = Diagnostic(code, message, span, tuple(notes), help)
        if diagnostic not in self.items:  # the same problem found again in another layer
            self.items.append(diagnostic)

    def stop(self, code: Code, message: str, where: Node | Span | None = None, *,
             notes: Iterable[str] = (), help: str | None = None) -> Refused:
        """Add a refusal and return the exception that ends the import."""
        self.add(code, message, where, notes=notes, help=help)
        return Refused()

    def __bool__(self) -> bool:
        return bool(self.items)


@dataclass(frozen=True, slots=True)
class MeshRoles:
    """The mesh by role: sizes of the pipeline, data- and tensor-parallel axes (1 if absent)."""

    axes: tuple[tuple[str, int], ...]

    def size(self, axis: str) -> int:
        return dict(self.axes).get(axis, 1)

    @property
    def pp(self) -> int:
        return self.size(PIPELINE)

    @property
    def dp(self) -> int:
        return self.size(DATA)

    @property
    def tp(self) -> int:
        return self.size(TENSOR)

    def has(self, axis: str) -> bool:
        return axis in dict(self.axes)


def data_parallel(mesh: MeshRoles) -> tuple[tuple[str, ...], tuple[Line, ...]]:
    """Batch axes and the gradient statement of plain data parallelism over ``dp``: every
    rank's loss is the mean of its own batch rows, so the mean over ``dp`` is the gradient of
    the global mean (DDP; FSDP reduce-scatters the same average)."""
    if mesh.dp == 1:
        return (), ()
    return (DATA,), (Line(f"all-reduce grad(params) over {DATA} op=avg",
                          "data parallel: gradients averaged"),)


def even_division(options: ImportOptions, refusals: Refusals, stages: int,
                  where: Node | None = None) -> tuple[int, ...]:
    """Layers per stage: ``--pp-division`` if given (checked), else an equal share (refused
    when the stage count does not divide the layer count)."""
    layers = options.config.n_layers
    if options.pp_division is not None:
        division = options.pp_division
        if len(division) != stages or sum(division) != layers or min(division) < 0:
            raise refusals.stop(
                codes.INCONSISTENT_DEGREES,
                f"--pp-division {','.join(map(str, division))} does not give {stages} stages "
                f"covering the {layers} layers of {options.config.name}", where)
        return division
    if layers % stages:
        raise refusals.stop(
            codes.INCONSISTENT_DEGREES,
            f"{stages} pipeline stages do not divide the {layers} layers of "
            f"{options.config.name} evenly", where,
            help="give the layers of each stage with --pp-division, e.g. "
                 f"--pp-division {','.join(['1'] * (stages - 1) + [str(layers - stages + 1)])}")
    return (layers // stages,) * stages


def check_batch(options: ImportOptions, refusals: Refusals, batch: int, dp: int,
                microbatches: int, where: Node | None = None) -> None:
    """The global batch must split evenly over the data-parallel ranks and microbatches."""
    if batch % (dp * microbatches):
        raise refusals.stop(
            codes.INCONSISTENT_DEGREES,
            f"the global batch {batch} does not split into {microbatches} microbatch(es) on "
            f"each of {dp} data-parallel rank(s)", where)


def plan_name(options: ImportOptions, fallback: str) -> str:
    """``--name``, else the fallback (the input file's stem) made a valid plan name."""
    import re

    name = options.name or re.sub(r"\W", "_", fallback) or "imported"
    return name if name[0].isalpha() or name[0] == "_" else f"p_{name}"
