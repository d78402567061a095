"""``tvp import hf``: transformers' tensor- and pipeline-parallel plans.

The end-to-end examples are in test_import_examples.py; here: what each style becomes, and
every refusal with its location and reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from import_support import error_lines, import_file

TINY = ("--config", "llama_tiny", "--batch", "4", "--seq", "8", "--mesh", "dp=2,tp=2")


def hf(tmp_path: Path, plan: dict, *args: str, name: str = "plan.json") -> tuple[int, str, str]:
    return import_file(tmp_path, "hf", name, json.dumps(plan, indent=2), *(args or TINY))


def statements(text: str) -> list[str]:
    """The plan's statements without comments."""
    return [line.split("  #")[0].strip() for line in text.splitlines()
            if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize(("style", "expected"), [
    ("colwise", ["apply column_parallel(l.attention.wq, tp)"]),
    ("colwise_rep", ["apply column_parallel(l.attention.wq, tp)",
                     "all-gather l.attention.wq.out over tp dim=2 backward scatter"]),
    ("colwise_gather_output", ["apply column_parallel(l.attention.wq, tp)",
                               "all-gather l.attention.wq.out over tp dim=2 backward scatter"]),
    ("rowwise", ["apply row_parallel(l.attention.wq, tp)"]),
    ("rowwise_rep", ["scatter l.attention.wq.in over tp dim=2",
                     "apply row_parallel(l.attention.wq, tp)"]),
    ("local_colwise", ["split l.attention.wq.weight [tp, -]"]),
    ("local_rowwise", ["split l.attention.wq.weight [-, tp]"]),
    ("replicate", ["replicate l.attention.wq.weight over tp"]),
    ("replicated_with_grad_allreduce", ["all-reduce grad(l.attention.wq.weight) over tp"]),
    ("all_reduce", ["all-reduce l.attention.wq.out over tp"]),
])
def test_each_linear_style_has_one_transcription(tmp_path: Path, style: str,
                                                 expected: list[str]) -> None:
    code, out, err = hf(tmp_path, {"layers.*.self_attn.q_proj": style})
    assert code == 0, err
    body = statements(out)
    start = body.index("template llama_layer(l):") + 1
    assert body[start:start + len(expected)] == expected


def test_top_level_modules_and_the_model_prefix(tmp_path: Path) -> None:
    """`model.` prefixed keys (a CausalLM's merged plan) and top-level modules map too."""
    code, out, err = hf(tmp_path, {"model.embed_tokens": "embedding_rowwise",
                                   "model.norm": "replicated_with_grad_allreduce",
                                   "lm_head": "colwise_gather_output"})
    assert code == 0, err
    body = statements(out)
    assert "apply vocab_parallel_embedding(embed, tp)" in body
    assert body.index("all-reduce grad(norm.weight) over tp") < \
        body.index("apply column_parallel(output, tp)")
    assert "all-gather output.out over tp dim=2 backward scatter" in body


def test_a_pipeline_plan_splits_the_layers_evenly_or_as_told(tmp_path: Path) -> None:
    plan = {"base_model_pp_plan": {"embed_tokens": [["input_ids"], ["inputs_embeds"]],
                                   "layers": [["hidden_states"], ["hidden_states"]],
                                   "norm": [["hidden_states"], ["hidden_states"]]}}
    args = ("--config", "llama_tiny", "--batch", "4", "--seq", "8", "--mesh", "pp=2,dp=2",
            "--microbatches", "2")
    code, out, err = hf(tmp_path, plan, *args)
    assert code == 0, err
    body = statements(out)
    assert body[body.index("microbatches 2") + 1] == "loss-scale 1/microbatches"
    assert "pipeline-stage 0: embed, layers[0:1]" in statements(out)
    assert "pipeline-stage 1: layers[1:2], norm, output, loss" in statements(out)
    code, out, err = hf(tmp_path, plan, *args, "--pp-division", "2,0")
    assert code == 0, err
    assert "pipeline-stage 1: norm, output, loss" in statements(out)


REFUSALS = [
    ({"layers.*.self_attn.q_proj": "colwize"},
     'plan.json:2:32: error: unknown tensor-parallel style "colwize"; did you mean '
     "'colwise'? [TVP602]"),
    ({"layers.*.self_attn.qkv_proj": "colwise"},
     'plan.json:2:3: error: no module of the reference model corresponds to '
     '"layers.*.self_attn.qkv_proj"; did you mean \'layers.*.self_attn.v_proj\'? [TVP603]'),
    ({"layers.0.mlp.down_proj": "rowwise"},
     'plan.json:2:3: error: "layers.0.mlp.down_proj" names layer 0 by its number; '
     "transformers replaces layer numbers by '*' before looking a module up, so this rule "
     "never applies [TVP604]"),
    ({"layers.*.mlp.up_proj.weight": "colwise"},
     'plan.json:2:3: error: "layers.*.mlp.up_proj.weight" names a parameter; transformers '
     "4.x installs the style's hooks on its module, 5.x only shards the parameter [TVP604]"),
    ({"layers.*.input_layernorm": "sequence_parallel"},
     'plan.json:2:31: error: "layers.*.input_layernorm": sequence_parallel: its meaning '
     "differs between transformers releases: 4.x scatters the input along the sequence and "
     "all-gathers the output, 5.x takes the local input as a sequence shard and keeps the "
     "output local; a style string cannot say which [TVP604]"),
    ({"layers.*.mlp": "gather"},
     'plan.json:2:19: error: "layers.*.mlp": gather: GatherParallel all-reduces '
     "`outputs[0]` in place; for a module returning one tensor (as every reference module "
     "does) that is its first batch row only, which no statement can say [TVP604]"),
    ({"embed_tokens": "colwise"},
     'plan.json:2:19: error: "embed_tokens": colwise on an embedding: its meaning differs '
     "between transformers releases: 4.x splits the vocabulary rows, 5.x splits the hidden "
     "columns; a style string cannot say which [TVP604]"),
    ({"layers.*.input_layernorm": "colwise"},
     'plan.json:2:31: error: "layers.*.input_layernorm": colwise applies to linear modules, '
     "and attention_norm is a norm [TVP604]"),
    ({"layers.*.mlp.gate_up_proj": "packed_colwise"},
     'plan.json:2:3: error: no module of the reference model corresponds to '
     '"layers.*.mlp.gate_up_proj"; did you mean \'layers.*.mlp.gate_proj\'? [TVP603]'),
    ({"layers.*.mlp.gate_proj": "packed_colwise"},
     'plan.json:2:29: error: "layers.*.mlp.gate_proj": packed_colwise: it splits a fused '
     "weight ([gate; up]) in interleaved halves; the reference model's projections are "
     "separate modules [TVP604]"),
    ({"layers.*.mlp.gate_proj": "grouped_gemm"},
     'plan.json:2:29: error: "layers.*.mlp.gate_proj": grouped_gemm: an expert-parallel or '
     "MLA style: the reference model has no such module [TVP607]"),
    ({"layers.*.mlp.gate_proj": 2},
     'plan.json:2:29: error: the style of "layers.*.mlp.gate_proj" must be a string '
     "[TVP606]"),
]


@pytest.mark.parametrize(("plan", "expected"), REFUSALS, ids=[r[1].split("[")[-1][:-1] + "-"
                                                              + str(i)
                                                              for i, r in enumerate(REFUSALS)])
def test_refusals_name_the_key_and_the_reason(tmp_path: Path, plan: dict,
                                              expected: str) -> None:
    code, out, err = hf(tmp_path, plan)
    assert (code, out) == (1, "")
    assert error_lines(err) == [expected]
    assert "nothing written" in err


def test_every_problem_of_a_file_is_reported_in_file_order(tmp_path: Path) -> None:
    code, _, err = hf(tmp_path, {"layers.*.self_attn.q_proj": "colwize",
                                 "layers.*.mlp": "gather",
                                 "layers.*.self_attn.qkv_proj": "colwise"})
    assert code == 1
    assert [line.split(":")[1] for line in error_lines(err)] == ["2", "3", "4"]


def test_config_sizes_must_be_the_reference_config_s(tmp_path: Path) -> None:
    code, _, err = hf(tmp_path, {"model_type": "mistral", "num_hidden_layers": 32,
                                 "tie_word_embeddings": True,
                                 "base_model_tp_plan": {"layers.*.mlp.up_proj": "colwise"}})
    assert code == 1
    assert [line.split(" [")[0].split(": error: ")[1] for line in error_lines(err)] == [
        'model_type "mistral" is not the reference model\'s (llama)',
        "num_hidden_layers is 32, but the config llama_tiny has n_layers 2",
        "tie_word_embeddings is true, but the reference model's output head is untied"]


def test_config_fields_that_change_the_model_must_be_the_reference_s(tmp_path: Path) -> None:
    """Biases, another head_dim, activation, RoPE base or scaling, norm epsilon or dropout
    describe another model: imported silently, the plan was verified against llama_tiny."""
    plan = {"attention_bias": True, "mlp_bias": False, "head_dim": 16, "hidden_act": "gelu",
            "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "attention_dropout": 0.1,
            "rope_scaling": {"rope_type": "linear", "factor": 4.0},
            "base_model_tp_plan": {"layers.*.mlp.up_proj": "colwise"}}
    code, _, err = hf(tmp_path, plan)
    assert code == 1
    assert [line.split(": error: ")[1].split(",")[0] for line in error_lines(err)] == [
        "attention_bias is true", "head_dim is 16", 'hidden_act is "gelu"',
        "rope_theta is 10000.0", "attention_dropout is 0.1",
        'rope_scaling is {"rope_type": "linear"']
    same = {"attention_bias": False, "head_dim": 8, "hidden_act": "silu", "rope_theta": 5e5,
            "rms_norm_eps": 1e-5, "rope_scaling": None, "attention_dropout": 0.0,
            "base_model_tp_plan": {"layers.*.mlp.up_proj": "colwise"}}
    assert hf(tmp_path, same)[0] == 0


def test_pipeline_axis_without_a_pipeline_plan_and_pipeline_plan_order(
        tmp_path: Path) -> None:
    args = ("--config", "llama_tiny", "--batch", "4", "--seq", "8", "--mesh", "pp=2,tp=2")
    code, _, err = hf(tmp_path, {"layers.*.mlp.up_proj": "colwise"}, *args)
    assert code == 1
    assert "the mesh has a pp axis but the file has no base_model_pp_plan [TVP606]" in err
    code, _, err = hf(tmp_path, {"base_model_pp_plan": {
        "norm": [["hidden_states"], ["hidden_states"]],
        "layers": [["hidden_states"], ["hidden_states"]],
        "vision_tower": [["pixel_values"], ["image_features"]]}}, *args)
    assert code == 1
    assert [line.split(": error: ")[1] for line in error_lines(err)] == [
        "the pipeline plan lists its modules out of forward order [TVP604]",
        'no module of the reference model corresponds to the pipeline entry '
        '"vision_tower" [TVP603]']


def test_uneven_pipeline_division_is_refused(tmp_path: Path) -> None:
    plan = {"base_model_pp_plan": {"layers": [["hidden_states"], ["hidden_states"]]}}
    code, _, err = hf(tmp_path, plan, "--config", "llama_tiny", "--batch", "4", "--seq", "8",
                      "--mesh", "pp=2", "--pp-division", "1,2")
    assert code == 1
    assert "--pp-division 1,2 does not give 2 stages covering the 2 layers of llama_tiny " \
           "[TVP605]" in err


def test_a_tp_plan_without_a_tp_axis_is_refused(tmp_path: Path) -> None:
    code, _, err = hf(tmp_path, {"layers.*.mlp.up_proj": "colwise"}, "--config",
                      "llama_tiny", "--batch", "4", "--seq", "8", "--mesh", "dp=4")
    assert code == 1
    assert "the file has a tensor-parallel plan but the mesh has no tp axis [TVP605]" in err


def test_a_python_config_that_changes_its_plan_elsewhere_is_refused(tmp_path: Path) -> None:
    source = ("class LlamaConfig:\n"
              "    base_model_tp_plan = {'layers.*.mlp.up_proj': 'colwise'}\n"
              "    def __init__(self):\n"
              "        self.base_model_tp_plan = {}\n")
    code, _, err = import_file(tmp_path, "hf", "configuration_x.py", source, *TINY)
    assert code == 1
    assert error_lines(err) == [
        "configuration_x.py:4:9: error: 'base_model_tp_plan' is used or changed outside its "
        "class literal; the importer cannot know its value without running the file [TVP601]"]


def test_invalid_json_is_located(tmp_path: Path) -> None:
    code, _, err = import_file(tmp_path, "hf", "plan.json",
                               '{\n  "layers.*.mlp.up_proj": "colwise",\n}\n', *TINY)
    assert code == 1
    assert error_lines(err) == [
        "plan.json:2:36: error: not valid JSON: a trailing comma before '}' [TVP601]"]


def test_a_batch_that_does_not_split_is_refused_not_an_internal_error(tmp_path: Path) -> None:
    """The written plan failed its own lint (TVP234) and the import said "internal error"."""
    code, _, err = hf(tmp_path, {"base_model_tp_plan": {"layers.*.mlp.up_proj": "colwise"}},
                      "--config", "llama_tiny", "--batch", "8", "--seq", "8", "--mesh",
                      "dp=2,tp=2", "--microbatches", "3")
    assert code == 1 and "internal error" not in err
    assert "the global batch 8 does not split into 3 microbatch(es) on each of 2 " \
           "data-parallel rank(s) [TVP605]" in err


def test_a_config_size_of_the_wrong_type_is_malformed(tmp_path: Path) -> None:
    """`"hidden_size": "32"` was "hidden_size is 32, but the config llama_tiny has hidden
    32" (TVP605, two equal numbers); a size is a whole number (transformers builds the
    layers from it), anything else is TVP606."""
    code, _, err = hf(tmp_path, {"hidden_size": "32",
                                 "base_model_tp_plan": {"layers.*.mlp.up_proj": "colwise"}})
    assert code == 1
    assert [line.split(": error: ")[1] for line in error_lines(err)] == [
        'hidden_size is "32", not a whole number [TVP606]']


def test_a_folder_given_as_the_file_says_so(tmp_path: Path) -> None:
    from trainverify_dsl.cli.main import main

    assert main(["import", "hf", str(tmp_path), "--config", "llama_tiny", "--seq", "8",
                 "--batch", "8", "--mesh", "tp=2"]) == 1
