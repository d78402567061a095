"""``tvp import galvatron``: Galvatron's hybrid-parallel strategy JSON.

The end-to-end examples (a Llama3-8B strategy on 32 devices, a tiny one on 8 that simulates)
are in test_import_examples.py; here: how each setting lands in the plan, and the refusals.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from import_support import DATA, error_lines, import_file

ARGS = ("--config", "llama_tiny", "--seq", "8", "--world-size", "8")


def strategy(**changes: object) -> dict:
    """The tiny example strategy (pp=2, tp=2, dp=2, zero2, vtp=2) with ``changes``."""
    base = json.loads((DATA / "galvatron_llama_tiny.json").read_text(encoding="utf-8"))
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def galvatron(tmp_path: Path, config: dict, *args: str) -> tuple[int, str, str]:
    return import_file(tmp_path, "galvatron", "galvatron_config.json",
                       json.dumps(config, indent=4), *(args or ARGS))


def statements(text: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in text.splitlines()
            if line.strip() and not line.startswith("#")]


def test_the_mesh_follows_the_tensor_parallel_group_order(tmp_path: Path) -> None:
    """Consecutive tp groups are the innermost axis; strided ones sit outside dp."""
    assert "mesh pp=2, dp=2, tp=2" in statements(galvatron(tmp_path, strategy())[1])
    strided = strategy(tp_consecutive_flags="0,0")
    assert "mesh pp=2, tp=2, dp=2" in statements(galvatron(tmp_path, strided)[1])


def test_ddp_all_reduces_and_zero2_reduce_scatters_with_a_sharded_optimizer(
        tmp_path: Path) -> None:
    zero2 = statements(galvatron(tmp_path, strategy(), *ARGS, "--optimizer", "sgd lr=0.1")[1])
    assert "reduce-scatter grad(params) over dp dim=0 op=avg" in zero2
    assert zero2[-1] == "optimizer sgd lr=0.1 shard over dp"
    ddp = statements(galvatron(tmp_path, strategy(default_dp_type="ddp"), *ARGS,
                               "--optimizer", "sgd lr=0.1")[1])
    assert "all-reduce grad(params) over dp op=avg" in ddp
    assert ddp[-1] == "optimizer sgd lr=0.1"


def test_schedule_microbatches_and_stages(tmp_path: Path) -> None:
    body = statements(galvatron(tmp_path, strategy(pipeline_type="gpipe", chunks=2))[1])
    assert "microbatches 2 schedule gpipe" in body
    assert "loss-scale 1/microbatches" in body
    body = statements(galvatron(tmp_path, strategy(pp_division="2,0"))[1])
    assert "pipeline-stage 0: embed, layers[0:2]" in body
    assert "pipeline-stage 1: norm, output, loss" in body


def test_a_single_device_strategy_has_a_plain_plan(tmp_path: Path) -> None:
    single = strategy(pp_deg=1, pp_division=None, tp_sizes_enc="1,1", vtp=1, global_bsz=2,
                      chunks=2)
    code, out, err = galvatron(tmp_path, single, "--config", "llama_tiny", "--seq", "8",
                               "--world-size", "1")
    assert code == 0, err
    assert statements(out)[2:4] == ["mesh dp=1", "microbatches 2 schedule 1f1b"]
    assert not any(s.startswith(("split", "apply", "all-reduce")) for s in statements(out))


def test_checkpointing_is_noted_not_stated(tmp_path: Path) -> None:
    out = galvatron(tmp_path, strategy(checkpoint="1,1"))[1]
    assert "# Activation checkpointing on layers 0-1: recomputation gives the same values, " \
           "no statement." in out


REFUSALS = [
    (strategy(tp_sizes_enc="2,4"),
     "galvatron_config.json:3:21: error: tp_sizes_enc gives the layers different "
     "tensor-parallel degrees (2 for layer 0, 4 for layer 1); a plan has one mesh, so every "
     "layer uses the same degree and group order [TVP604]"),
    (strategy(tp_consecutive_flags="1,0"),
     "galvatron_config.json:4:29: error: tp_consecutive_flags gives the layers different "
     "tensor-parallel group orders (1 for layer 0, 0 for layer 1); a plan has one mesh, so "
     "every layer uses the same degree and group order [TVP604]"),
    (strategy(dp_types_enc="0,1"),
     "galvatron_config.json:5:21: error: ZeRO-3 shards the parameters between uses and "
     "gathers them for each; the plan language has no statement for gathering parameters "
     "[TVP604]"),
    (strategy(default_dp_type="zero3"),
     "galvatron_config.json:12:24: error: ZeRO-3 shards the parameters between uses and "
     "gathers them for each; the plan language has no statement for gathering parameters "
     "[TVP604]"),
    (strategy(use_sp="0,1"),
     "galvatron_config.json:6:15: error: use_sp is set for layer 1: Ulysses sequence "
     "parallelism is not imported yet [TVP607]"),
    (strategy(vtp=1),
     "galvatron_config.json:13:12: error: vtp 1 with layers at tensor degree 2: Galvatron "
     "moves the activations between the vocabulary strategy and the layers' one, which is "
     "not imported; only vtp equal to the layers' degree is [TVP607]"),
    (strategy(pp_division="2,1"),
     "galvatron_config.json:10:20: error: pp_division 2,1 does not give pp_deg=2 stages "
     "covering the 2 layers [TVP605]"),
    (strategy(tp_sizes_enc="2,2,2"),
     "galvatron_config.json:3:21: error: tp_sizes_enc has 3 entries, but llama_tiny has 2 "
     "layers [TVP605]"),
    (strategy(global_bsz=6),
     "galvatron_config.json:8:19: error: the global batch 6 does not split into 2 "
     "microbatch(es) on each of 2 data-parallel rank(s) [TVP605]"),
    (strategy(pp_deg="2"),
     'galvatron_config.json:2:15: error: pp_deg must be a positive integer, not "2" '
     "[TVP606]"),
    (strategy(chunks=None),
     "galvatron_config.json:1:1: error: the strategy has no chunks [TVP606]"),
    (strategy(pipeline_type="1f1b"),
     'galvatron_config.json:11:22: error: unknown pipeline_type "1f1b"; expected gpipe or '
     "pipedream_flush [TVP602]"),
    (strategy(default_dp_type="zero1"),
     'galvatron_config.json:12:24: error: unknown default_dp_type "zero1"; did you mean '
     "'zero3'? [TVP602]"),
]


@pytest.mark.parametrize(("config", "expected"), REFUSALS,
                         ids=[f"{r[1].split('[')[-1][:-1]}-{i}" for i, r in enumerate(REFUSALS)])
def test_refusals_name_the_key_and_the_reason(tmp_path: Path, config: dict,
                                              expected: str) -> None:
    code, out, err = galvatron(tmp_path, config)
    assert (code, out) == (1, "")
    assert expected in error_lines(err), err


def test_device_count_and_mesh_must_fit_the_strategy(tmp_path: Path) -> None:
    code, _, err = galvatron(tmp_path, strategy(), "--config", "llama_tiny", "--seq", "8",
                             "--world-size", "6")
    assert code == 1
    assert "6 devices do not split into pp_deg=2 stages of tensor-parallel groups of 2 " \
           "[TVP605]" in err
    code, _, err = galvatron(tmp_path, strategy(), "--config", "llama_tiny", "--seq", "8",
                             "--mesh", "pp=2,tp=2,dp=2")
    assert code == 1
    assert "--mesh pp=2,tp=2,dp=2 is not the strategy's mesh pp=2,dp=2,tp=2 [TVP605]" in err
    code, _, err = galvatron(tmp_path, strategy(), "--config", "llama_tiny", "--seq", "8",
                             "--world-size", "8", "--batch", "16")
    assert code == 1
    assert "global_bsz is 8 but --batch is 16 [TVP605]" in err
    code, _, err = galvatron(tmp_path, strategy(), "--config", "llama_tiny", "--seq", "8")
    assert code == 1
    assert "the device count is not in the strategy [TVP606]" in err


def test_gpt2_layers_use_the_templates_with_biases(tmp_path: Path) -> None:
    gpt2 = strategy(pp_deg=1, pp_division=None, global_bsz=4, chunks=1)
    code, out, err = galvatron(tmp_path, gpt2, "--config", "gpt2_tiny", "--seq", "8",
                               "--world-size", "4")
    assert code == 0, err
    body = statements(out)
    start = body.index("template gpt2_layer(l):") + 1
    assert body[start:start + 2] == ["apply attention_parallel_bias(l.attention, tp)",
                                     "apply mlp_parallel_bias(l.feed_forward, tp)"]
    code, _, err = galvatron(tmp_path, gpt2, "--config", "gpt2_tiny", "--seq", "8",
                             "--world-size", "4", "--sequence-parallel")
    assert code == 1
    assert "Megatron sequence parallelism is transcribed for Llama only, not GPT2 [TVP607]" \
        in err


def test_options_the_strategy_states_must_agree_with_it(tmp_path: Path) -> None:
    """`--microbatches`, `--schedule` and `--pp-division` were dropped without a word where
    the strategy's own `chunks`, `pipeline_type` and `pp_division` differ; `--loss-parallel`
    (a torchtitan option) was accepted."""
    config = strategy(pipeline_type="gpipe", chunks=2, pp_division="1,1")
    code, _, err = galvatron(tmp_path, config, *ARGS, "--microbatches", "4", "--schedule",
                             "1f1b", "--pp-division", "2,0", "--loss-parallel")
    assert code == 1
    messages = [line.split(": error: ")[1] for line in error_lines(err)]
    assert "chunks gives 2 but --microbatches is 4 [TVP605]" in messages
    assert "pipeline_type gives gpipe but --schedule is 1f1b [TVP605]" in messages
    assert "pp_division gives 1,1 but --pp-division is 2,0 [TVP605]" in messages
    assert any(m.startswith("--loss-parallel is an option of torchtitan") for m in messages)
    same = galvatron(tmp_path, config, *ARGS, "--microbatches", "2", "--schedule", "gpipe",
                     "--pp-division", "1,1")
    assert same[0] == 0, same[2]
