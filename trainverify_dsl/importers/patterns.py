"""Statement builders for the parallel patterns several importers transcribe.

Each returns the plan lines for one module ``m`` (a path such as ``l.attention.wq``), using a
stdlib/megatron.tvp template where one says exactly that and plain statements otherwise.
Their meaning is the language's (docs/semantics.md); which builder an importer picks is the
importer's transcription of the foreign style, documented in docs/importers.md.
"""

from __future__ import annotations

from trainverify_dsl.importers.emit import Line


def split_rows(m: str, bias: bool, axis: str, note: str) -> tuple[Line, ...]:
    """Weight [out, in] split by output rows (and the bias with them); no collective."""
    lines = (Line(f"split {m}.weight [{axis}, -]", note),)
    return lines + ((Line(f"split {m}.bias [{axis}]", note),) if bias else ())


def split_columns(m: str, axis: str, note: str) -> tuple[Line, ...]:
    """Weight split by input columns; no collective (a bias stays replicated)."""
    return (Line(f"split {m}.weight [-, {axis}]", note),)


def column_parallel(m: str, bias: bool, axis: str, note: str) -> tuple[Line, ...]:
    """Rows split, input copied (forward identity, backward all-reduce)."""
    name = "column_parallel_bias" if bias else "column_parallel"
    return (Line(f"apply {name}({m}, {axis})", note),)


def column_parallel_gather(m: str, axis: str, seq_dim: int, note: str) -> tuple[Line, ...]:
    """Rows split, the sequence-split input all-gathered (backward reduce-scatter)."""
    return (Line(f"apply column_parallel_sp({m}, {axis}, {seq_dim})", note),)


def row_parallel(m: str, bias: bool, axis: str, note: str) -> tuple[Line, ...]:
    """Columns split, the partial output all-reduced (backward identity); with a bias the
    row-parallel-linear algorithm adds it once, after the reduction."""
    name = "row_parallel_bias" if bias else "row_parallel"
    return (Line(f"apply {name}({m}, {axis})", note),)


def row_parallel_scatter(m: str, axis: str, seq_dim: int, note: str) -> tuple[Line, ...]:
    """Columns split, the partial output reduce-scattered along the sequence."""
    return (Line(f"apply row_parallel_sp({m}, {axis}, {seq_dim})", note),)


def vocab_parallel_embedding(m: str, axis: str, seq_dim: int | None,
                             note: str) -> tuple[Line, ...]:
    """Embedding rows split by vocabulary, local lookup; the partial output all-reduced, or
    reduce-scattered along the sequence when ``seq_dim`` is given."""
    if seq_dim is None:
        return (Line(f"apply vocab_parallel_embedding({m}, {axis})", note),)
    return (Line(f"apply vocab_parallel_embedding_sp({m}, {axis}, {seq_dim})", note),)


def vocab_parallel_loss(m: str, axis: str, note: str) -> tuple[Line, ...]:
    """The loss computed from logits split over the vocabulary."""
    return (Line(f"algorithm vocab-parallel-cross-entropy for {m}, loss over {axis}", note),)


def gradient_all_reduce(m: str, params: tuple[str, ...], axis: str,
                        note: str) -> tuple[Line, ...]:
    """A replicated module whose parameter gradients are partial over ``axis``."""
    return tuple(Line(f"all-reduce grad({m}.{p}) over {axis}", note) for p in params)


def replicated(m: str, params: tuple[str, ...], axis: str, note: str) -> tuple[Line, ...]:
    return tuple(Line(f"replicate {m}.{p} over {axis}", note) for p in params)
