"""``tvp import torchtitan``: DTensor ``parallelize_module`` plans.

The end-to-end examples (torchtitan's apply_tp with sequence parallelism and loss_parallel,
plain tensor parallelism) are in test_import_examples.py; here: what a style communicates
depending on what reaches it, layer-dependent plans, and the refusals.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from import_support import error_lines, import_file

TINY = ("--config", "llama_tiny", "--batch", "4", "--seq", "8", "--mesh", "tp=2")


def titan(tmp_path: Path, plan: dict, *args: str) -> tuple[int, str, str]:
    return import_file(tmp_path, "torchtitan", "plan.json", json.dumps(plan, indent=2),
                       *(args or TINY))


def statements(text: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in text.splitlines()
            if line.strip() and not line.startswith("#")]


def test_a_colwise_linear_copies_a_local_input_and_gathers_a_sequence_shard(
        tmp_path: Path) -> None:
    """The same style, two meanings: a plain replicated input is `from_local(Replicate)`
    (backward all-reduce: a copy); a Shard(1) input is all-gathered (backward
    reduce-scatter)."""
    code, out, err = titan(tmp_path, {
        "layers.*.attention.wq": "ColwiseParallel()",
        "layers.*.feed_forward.w1": "ColwiseParallel(input_layouts=Shard(1))"})
    assert code == 0, err
    body = statements(out)
    assert "apply column_parallel(l.attention.wq, tp)" in body
    assert "apply column_parallel_sp(l.feed_forward.w1, tp, 1)" in body


def test_a_prepared_replicated_dtensor_needs_no_copy_at_each_linear(tmp_path: Path) -> None:
    code, out, err = titan(tmp_path, {
        "layers.*.attention": "PrepareModuleInput(input_layouts=(Replicate(), None), "
                              "desired_input_layouts=(Replicate(), None))",
        "layers.*.attention.wq": "ColwiseParallel()",
        "layers.*.attention.wk": "ColwiseParallel()",
        "layers.*.attention.wv": "ColwiseParallel()",
        "layers.*.attention.wo": "RowwiseParallel()"})
    assert code == 0, err
    body = statements(out)
    start = body.index("template llama_layer(l):") + 1
    assert body[start:start + 5] == [
        "copy l.attention.in over tp", "split l.attention.wq.weight [tp, -]",
        "split l.attention.wk.weight [tp, -]", "split l.attention.wv.weight [tp, -]",
        "apply row_parallel(l.attention.wo, tp)"]


def test_a_rowwise_linear_scatters_a_replicated_input(tmp_path: Path) -> None:
    code, out, err = titan(tmp_path, {
        "layers.*.feed_forward.w2": "RowwiseParallel(input_layouts=Replicate())"})
    assert code == 0, err
    assert "scatter l.feed_forward.w2.in over tp dim=2" in statements(out)


def test_layer_patterns_match_as_parallelize_module_matches_them(tmp_path: Path) -> None:
    """fnmatch per atom over the real layer indices: a plan for layer 0 only gives two kinds
    of layers, one template, one loop over its range."""
    code, out, err = titan(tmp_path, {"layers.0.attention.w[qkv]": "ColwiseParallel()",
                                      "layers.[0].attention.wo": "RowwiseParallel()"})
    assert code == 0, err
    body = statements(out)
    assert "for l in layers[0:1]:" in body and "for l in layers:" not in body
    assert body[body.index("template llama_layer(l):") + 1:][:4] == [
        "apply column_parallel(l.attention.wq, tp)", "apply column_parallel(l.attention.wk, tp)",
        "apply column_parallel(l.attention.wv, tp)", "apply row_parallel(l.attention.wo, tp)"]


def test_a_layer_plan_applies_to_every_layer(tmp_path: Path) -> None:
    code, out, err = titan(tmp_path, {"plan": {}, "layer_plan": {
        "feed_forward.w[13]": "ColwiseParallel()", "feed_forward.w2": "RowwiseParallel()"}})
    assert code == 0, err
    assert "for l in layers:" in statements(out)


REFUSALS = [
    ({"layers.*.attention.wq": "colwise_parallel()"},
     'plan.json:2:28: error: "layers.*.attention.wq": colwise_parallel: a local alias in '
     "torchtitan's parallelize code, bound to a plain or a Float8 style by the float8 "
     "setting; write the class name (ColwiseParallel, RowwiseParallel, PrepareModuleInput) "
     "[TVP602]"),
    ({"layers.*.attention.wq": "ColwiseParalel()"},
     'plan.json:2:28: error: "layers.*.attention.wq": unknown parallel style '
     '"ColwiseParalel"; did you mean \'ColwiseParallel\'? [TVP602]'),
    ({"layers.*.attention.wq": "Float8ColwiseParallel()"},
     'plan.json:2:28: error: "layers.*.attention.wq": Float8ColwiseParallel: float8 matmuls '
     "compute other values than the reference step; the plan language's arithmetic is "
     "exact [TVP604]"),
    ({"layers.*.attention": "PrepareModuleOutput(output_layouts=Shard(1), "
                            "desired_output_layouts=Replicate())"},
     'plan.json:2:25: error: "layers.*.attention": PrepareModuleOutput: the importer has no '
     "transcription for this style yet [TVP607]"),
    ({"layers.*.attention.wq": "ColwiseParallel(output_layout=Shard(1))"},
     'plan.json:2:28: error: "layers.*.attention.wq": ColwiseParallel has no argument '
     '"output_layout" [TVP606]'),
    ({"layers.*.attention.wq": "ColwiseParallel(Shard(1))"},
     'plan.json:2:28: error: "layers.*.attention.wq": ColwiseParallel takes keyword '
     "arguments only [TVP606]"),
    ({"layers.*.attention.wq": "ColwiseParallel(input_layouts=Shard(x))"},
     'plan.json:2:28: error: the importer reads literals only (strings, numbers, lists, '
     "dicts and style calls such as ColwiseParallel()); this expression would have to run "
     "[TVP601]"),
    ({"layers.*.attn.wq": "ColwiseParallel()"},
     'plan.json:2:3: error: "layers.*.attn.wq" matches no module of the reference model; '
     "did you mean 'layers.*.attention.wq'? [TVP603]"),
    ({"tok_embeddings": "RowwiseParallel()"},
     'plan.json:2:21: error: "tok_embeddings": RowwiseParallel on an embedding takes its '
     "token ids as Shard(-1) unless input_layouts=Replicate(): DTensor would all-gather the "
     "ids along the sequence [TVP604]"),
    ({"output": "ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)"},
     'plan.json:2:13: error: the logits stay a DTensor split over the vocabulary '
     "(use_local_output=False): whether the train step computes the loss under "
     "loss_parallel() is not in the plan [TVP606]"),
    ({"layers.*.attention_norm": "SequenceParallel()"},
     'plan.json:2:30: error: attention.wq has no style but receives a DTensor placed '
     "Shard(1); torch cannot mix its plain parameters with a DTensor [TVP604]"),
    ({"layers.*.attention": "PrepareModuleInput(input_layouts=(Shard(1), None), "
                            "desired_input_layouts=(Replicate(), None))",
      "layers.*.attention.wq": "ColwiseParallel()", "layers.*.attention.wk": "ColwiseParallel()",
      "layers.*.attention.wv": "RowwiseParallel()"},
     'plan.json:5:28: error: attention\'s input becomes a replicated DTensor, but '
     "attention.wv is RowwiseParallel: its input gradient is not partial, and what DTensor "
     "does with the mixture is decided at run time [TVP604]"),
    ({"layers.*.attention.wq": "ColwiseParallel(use_local_output=False)"},
     'plan.json:2:28: error: "layers.*.attention.wq": the split output stays a DTensor '
     "[TVP607]"),
]


@pytest.mark.parametrize(("plan", "expected"), REFUSALS,
                         ids=[f"{r[1].split('[')[-1][:-1]}-{i}" for i, r in enumerate(REFUSALS)])
def test_refusals_name_the_style_and_the_reason(tmp_path: Path, plan: dict,
                                                expected: str) -> None:
    code, out, err = titan(tmp_path, plan)
    assert (code, out) == (1, "")
    assert expected in error_lines(err), err


def test_two_styles_for_one_module_are_refused(tmp_path: Path) -> None:
    code, _, err = titan(tmp_path, {"plan": {"layers.*.attention.wq": "ColwiseParallel()"},
                                    "layer_plan": {"attention.wq": "RowwiseParallel()"}})
    assert code == 1
    assert error_lines(err) == [
        'plan.json:6:5: error: "attention.wq" gives a second style to a module '
        '"layers.*.attention.wq" already styles [TVP606]']


def test_loss_parallel_is_an_option_the_plan_needs(tmp_path: Path) -> None:
    plan = {"output": "ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)"}
    code, out, _ = titan(tmp_path, plan, *TINY, "--loss-parallel")
    assert code == 0
    assert "algorithm vocab-parallel-cross-entropy for output, loss over tp" in statements(out)
    code, _, err = titan(tmp_path, plan, *TINY, "--no-loss-parallel")
    assert code == 1
    assert "a cross-entropy of DTensor logits outside loss_parallel() is not transcribed " \
           "[TVP607]" in err


def test_python_plans_are_read_without_running_them(tmp_path: Path) -> None:
    ok = ("from torch.distributed.tensor.parallel import ColwiseParallel\n"
          "plan = {'layers.*.attention.wq': ColwiseParallel()}\n")
    assert import_file(tmp_path, "torchtitan", "ok.py", ok, *TINY)[0] == 0
    running = ok + "def parallelize(model):\n    return plan\n"
    code, _, err = import_file(tmp_path, "torchtitan", "run.py", running, *TINY)
    assert code == 1
    assert error_lines(err) == [
        "run.py:3:1: error: the importer reads imports and NAME = literal assignments only; "
        "this statement would have to run [TVP601]"]
    other = ok + "mesh = {'tp': 2}\n"
    code, _, err = import_file(tmp_path, "torchtitan", "other.py", other, *TINY)
    assert code == 1
    assert error_lines(err) == ["other.py:3:1: error: 'mesh': a Python plan file assigns "
                                "`plan` and/or `layer_plan` only [TVP606]"]


def test_a_tp_plan_needs_a_tp_axis(tmp_path: Path) -> None:
    code, _, err = titan(tmp_path, {"layers.*.attention.wq": "ColwiseParallel()"},
                         "--config", "llama_tiny", "--batch", "4", "--seq", "8",
                         "--mesh", "dp=2")
    assert code == 1
    assert "the plan has tensor-parallel styles but the mesh has no tp axis [TVP605]" in err


def test_models_without_torchtitan_names_are_refused(tmp_path: Path) -> None:
    code, _, err = titan(tmp_path, {"layers.*.attention.wq": "ColwiseParallel()"},
                         "--config", "gpt2_tiny", "--batch", "4", "--seq", "8",
                         "--mesh", "tp=2")
    assert code == 1
    assert "torchtitan module names are known for Llama only, not for the reference model " \
           "GPT2 [TVP607]" in err


def test_a_style_imported_under_another_name_is_refused(tmp_path: Path) -> None:
    """`ColwiseParallel as RowwiseParallel` makes every `RowwiseParallel()` of the file
    torch's ColwiseParallel: read by its written name it gave Megatron's layout for a plan
    that is not (a wrong plan was verified). A module alias keeps the class's own name."""
    swapped = ("from torch.distributed.tensor.parallel import ColwiseParallel as "
               "RowwiseParallel\n"
               "plan = {'layers.*.attention.wq': RowwiseParallel()}\n")
    code, _, err = import_file(tmp_path, "torchtitan", "swapped.py", swapped, *TINY)
    assert code == 1
    assert error_lines(err) == [
        "swapped.py:1:1: error: `ColwiseParallel as RowwiseParallel` binds 'RowwiseParallel' "
        "to another name: the importer reads style names literally (import them without "
        "`as`) [TVP601]"]
    module_alias = ("import torch.distributed.tensor.parallel as tp\n"
                    "plan = {'layers.*.attention.wq': tp.ColwiseParallel()}\n")
    assert import_file(tmp_path, "torchtitan", "alias.py", module_alias, *TINY)[0] == 0


def test_a_batch_that_does_not_split_is_refused_not_an_internal_error(tmp_path: Path) -> None:
    plan = "{\"plan\": {\"layers.*.attention.wq\": \"ColwiseParallel()\"}}"
    code, _, err = import_file(tmp_path, "torchtitan", "plan.json", plan, "--config",
                               "llama_tiny", "--batch", "8", "--seq", "8", "--mesh",
                               "dp=2,tp=2", "--microbatches", "3")
    assert code == 1 and "internal error" not in err
    assert "does not split into 3 microbatch(es) on each of 2 data-parallel rank(s) " \
           "[TVP605]" in err
