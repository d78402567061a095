"""Faithful transcriptions of Megatron-LM's tensor-parallel layers (docs/semantics.md §3.5):
each either agrees with the spec under the default backwards, or gets a diagnostic at the
statement naming the `backward` to write — never a silent gradient ×tp.

Megatron's mappings (``megatron/core/tensor_parallel/mappings.py``) and their plan statements:

- ``ColumnParallelLinear(gather_output=False)`` + ``RowParallelLinear(input_is_parallel=True)``:
  ``copy`` (``copy_to_tensor_model_parallel_region``) and ``all-reduce``
  (``reduce_from_tensor_model_parallel_region``) with their default backwards;
- ``ColumnParallelLinear(gather_output=True)``: ``gather_from_tensor_model_parallel_region``
  is an all-gather whose backward *splits* — ``all-gather ... backward scatter``; the default
  (reduce-scatter, the sequence-parallel gather's backward) is TVP406 with that help;
- ``RowParallelLinear(input_is_parallel=False)``: ``scatter_to_tensor_model_parallel_region``
  is ``scatter`` with its default all-gather backward;
- ``torch.distributed.nn.functional.all_reduce`` (backward: all-reduce) in place of
  Megatron's reduction: TVP406, help ``backward identity``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl.api import SimulationSetupError, layout_diagnostics, simulate_file

MLP = """plan t
spec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1
spec-optimizer sgd lr=0.1
mesh tp=2
use "stdlib/megatron.tvp"
{body}
optimizer sgd lr=0.1
"""

LLAMA = """plan t
spec "stdlib/models/llama.py:Llama" config llama_tiny batch 2 seq 8
spec-optimizer sgd lr=0.01
mesh tp=2
use "stdlib/megatron.tvp"
for l in layers:
    apply attention_parallel(l.attention, tp)
    apply column_parallel(l.feed_forward.w1, tp)
    apply column_parallel(l.feed_forward.w3, tp)
    split l.feed_forward.w2.weight [-, tp]
    all-reduce l.feed_forward.w2.out over tp{backward}
optimizer sgd lr=0.01
"""

GATHER_OUTPUT = """split fc1.weight [tp, -]
split fc1.bias [tp]
copy fc1.in over tp
all-gather fc1.out over tp dim=1{backward}"""

INPUT_NOT_PARALLEL = """scatter fc2.in over tp dim=1
apply row_parallel_bias(fc2, tp)"""

DEFAULTS = """apply column_parallel_bias(fc1, tp)
apply row_parallel_bias(fc2, tp)"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.tvp"
    path.write_text(text)
    return path


def _only_error(path: Path) -> tuple[str, int, str]:
    errors = [d for d in layout_diagnostics(path) if d.severity.name == "ERROR"]
    assert len(errors) == 1, [d.message for d in errors]
    return errors[0].code.id, errors[0].span.line, errors[0].help or ""


@pytest.mark.parametrize("body", [DEFAULTS, INPUT_NOT_PARALLEL,
                                  GATHER_OUTPUT.format(backward=" backward scatter")],
                         ids=["column+row", "row(input_is_parallel=False)",
                              "column(gather_output=True) backward scatter"])
def test_faithful_transcription_agrees(tmp_path: Path, body: str) -> None:
    result = simulate_file(_write(tmp_path, MLP.format(body=body)))
    assert result.agrees, result.first


def test_gather_output_with_the_default_backward_names_the_backward_to_write(
        tmp_path: Path) -> None:
    path = _write(tmp_path, MLP.format(body=GATHER_OUTPUT.format(backward="")))
    code, line, help_ = _only_error(path)
    assert (code, line) == ("TVP406", 9)
    assert "`backward scatter`" in help_ and "gather_from_tensor_model_parallel_region" in help_
    with pytest.raises(SimulationSetupError):
        simulate_file(path)


def test_an_all_reduce_with_torch_distributed_nn_backward_names_identity(
        tmp_path: Path) -> None:
    path = _write(tmp_path, LLAMA.format(backward=" backward all-reduce"))
    code, line, help_ = _only_error(path)
    assert (code, line) == ("TVP406", 11)
    assert "`backward identity`" in help_


def test_the_same_llama_plan_with_the_default_backward_has_no_error(tmp_path: Path) -> None:
    path = _write(tmp_path, LLAMA.format(backward=""))
    assert [d for d in layout_diagnostics(path) if d.severity.name == "ERROR"] == []
