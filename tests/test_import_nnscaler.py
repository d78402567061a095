"""``tvp import nnscaler``: AutoDist plans with their operator table.

The end-to-end example (llama_tiny on 4 devices: dp=2 x Megatron tp=2, which means exactly
plans/llama_tiny_tp.tvp) is in test_import_examples.py; here: variants of it made by editing
its partitions, and the refusals.
"""

from __future__ import annotations

import json
from pathlib import Path

from import_support import DATA, ROOT, error_lines, run_tvp

ARGS = ("--config", "llama_tiny", "--batch", "4", "--seq", "8")
ROWS, COLUMNS = [[1, 0], 2], [[1, 1], 2]


def example() -> tuple[dict, dict]:
    plan = json.loads((DATA / "nnscaler_llama_tiny_plan.json").read_text(encoding="utf-8"))
    ops = json.loads((DATA / "nnscaler_llama_tiny_ops.json").read_text(encoding="utf-8"))
    return plan, ops


def descs(plan: dict, stage: int = 0) -> list:
    return plan["desc"]["spmd_descs"][stage]["partition_descs"]


def cid_of(ops: dict, module: str, signature: str = "torch.nn.functional.linear",
           nth: int = 0) -> int:
    found = [int(c) for c, op in ops.items()
             if op["module"] == module and op["signature"] == signature]
    return found[nth]


def set_desc(plan: dict, cid: int, desc: list) -> None:
    for stage in plan["desc"]["spmd_descs"]:
        for entry in stage["partition_descs"]:
            if entry[0] == cid:
                entry[1] = desc


def nnscaler(tmp_path: Path, plan: dict, ops: dict, *args: str) -> tuple[int, str, str]:
    plan_path, ops_path = tmp_path / "autodist_plan.json", tmp_path / "ops.json"
    plan_path.write_text(json.dumps(plan, indent=1), encoding="utf-8")
    ops_path.write_text(json.dumps(ops, indent=1), encoding="utf-8")
    return run_tvp(["import", "nnscaler", str(plan_path), "--ops", str(ops_path),
                    *(args or ARGS)])


def statements(text: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in text.splitlines()
            if line.strip() and not line.startswith("#")]


def test_pure_data_parallel(tmp_path: Path) -> None:
    """Every operator split over 4 devices along the batch: dp=4 and no template."""
    plan, ops = example()
    for entry in descs(plan):
        reads = ops[str(entry[0])].get("reads_batch", True)
        entry[1] = [[[0, 0], 4]] if reads else [[[-1, -1], 4]]
    code, out, err = nnscaler(tmp_path, plan, ops)
    assert code == 0, err
    body = statements(out)
    assert "mesh dp=4" in body and "all-reduce grad(params) over dp op=avg" in body
    assert not any(line.startswith(("template", "apply")) for line in body)


def test_tensor_parallel_order_sets_the_mesh_order(tmp_path: Path) -> None:
    plan, ops = example()
    for entry in descs(plan):
        entry[1] = entry[1][::-1]
    code, out, err = nnscaler(tmp_path, plan, ops)
    assert code == 0, err
    assert "mesh tp=2, dp=2" in statements(out)


def test_two_pipeline_stages(tmp_path: Path) -> None:
    """The operators of layer 1 and after on a second stage of 4 devices."""
    plan, ops = example()
    entries = descs(plan)
    first = next(i for i, (cid, _) in enumerate(entries) if ops[str(cid)]["module"]
                 .startswith("layers.1."))
    stage = dict(plan["desc"]["spmd_descs"][0])
    plan["desc"]["spmd_descs"] = [{**stage, "partition_descs": entries[:first]},
                                  {**stage, "partition_descs": entries[first:]}]
    plan["desc"]["mesh_desc"] = [2, 4]
    code, out, err = nnscaler(tmp_path, plan, ops)
    assert code == 0, err
    body = statements(out)
    assert "mesh pp=2, dp=2, tp=2" in body
    assert "pipeline-stage 0: embed, layers[0:1]" in body
    assert "pipeline-stage 1: layers[1:2], norm, output, loss" in body
    cut = next(i for i, (cid, _) in enumerate(entries) if ops[str(cid)]["module"]
               == "layers.0.feed_forward")
    plan["desc"]["spmd_descs"] = [{**stage, "partition_descs": entries[:cut]},
                                  {**stage, "partition_descs": entries[cut:]}]
    code, _, err = nnscaler(tmp_path, plan, ops)
    assert code == 1
    assert "the stages do not hold each layer once, in order: a layer cut between stages " \
           "has no pipeline-stage statement [TVP604]" in err


def test_an_operator_missing_from_the_table(tmp_path: Path) -> None:
    plan, ops = example()
    gone = cid_of(ops, "layers.0.attention.wo")
    del ops[str(gone)]
    code, _, err = nnscaler(tmp_path, plan, ops)
    assert code == 1
    assert [line.split(": error: ")[1] for line in error_lines(err)] == [
        f'operator "{gone}" is not in the operator table [TVP606]']


def test_a_module_the_reference_model_lacks(tmp_path: Path) -> None:
    plan, ops = example()
    ops[str(cid_of(ops, "layers.0.attention.wq"))]["module"] = "layers.0.self_attn.q_proj"
    code, _, err = nnscaler(tmp_path, plan, ops)
    assert code == 1
    assert 'the module "layers.0.self_attn.q_proj" is not a module of the reference model ' \
           "Llama [TVP603]" in err


def test_a_block_that_is_not_megatron_s_pattern(tmp_path: Path) -> None:
    """wo replicated while wq, wk, wv are split: nnScaler would all-gather the heads before
    wo, an adapter the importer does not transcribe."""
    plan, ops = example()
    wo = cid_of(ops, "layers.1.attention.wo")
    set_desc(plan, wo, [[[0, 0], 2], [[-1, -1], 2]])
    code, _, err = nnscaler(tmp_path, plan, ops)
    assert code == 1
    lines = error_lines(err)
    assert any(f"op {cid_of(ops, 'layers.1.attention.wq')} (linear in "
               "layers.1.attention.wq) is split by weight rows over tp; in attention the "
               "importer reads Megatron's pattern (wq, wk, wv split by rows, wo by columns, "
               "the operators between them split) or a replicated block [TVP607]" in line
               for line in lines), lines


def test_an_operator_between_the_linears_left_whole(tmp_path: Path) -> None:
    plan, ops = example()
    silu = cid_of(ops, "layers.0.feed_forward", "torch.nn.functional.silu")
    set_desc(plan, silu, [[[0, 0], 2], [[-1, -1], 2]])
    code, _, err = nnscaler(tmp_path, plan, ops)
    assert code == 1
    assert f"op {silu} (silu in layers.0.feed_forward) is replicated over tp; in " \
           "feed_forward" in err


def test_degrees_must_agree(tmp_path: Path) -> None:
    plan, ops = example()
    set_desc(plan, cid_of(ops, "layers.0.attention.wq"), [[[1, 0], 4]])
    code, _, err = nnscaler(tmp_path, plan, ops)
    assert code == 1
    assert "linears are split [2, 4] ways in one stage; a plan has one tensor-parallel " \
           "degree [TVP604]" in err
    plan, ops = example()
    set_desc(plan, cid_of(ops, "layers.0.ffn_norm", "torch.rsqrt"), [[[0, 0], 2]])
    code, _, err = nnscaler(tmp_path, plan, ops)
    assert code == 1
    assert "is partitioned into 2 pieces on a stage of 4 devices [TVP605]" in err


def test_mixed_partition_orders_are_refused(tmp_path: Path) -> None:
    plan, ops = example()
    wq = cid_of(ops, "layers.0.attention.wq")
    set_desc(plan, wq, [ROWS, [[0, 0], 2]])
    code, _, err = nnscaler(tmp_path, plan, ops)
    assert code == 1
    assert "operators order their data- and tensor-parallel partitions differently; one " \
           "mesh has one order [TVP604]" in err


def test_a_split_outside_the_blocks_is_refused(tmp_path: Path) -> None:
    """A vocabulary-split output head needs a gathered or vocab-parallel loss: adapters the
    importer does not read."""
    plan, ops = example()
    head = cid_of(ops, "output")
    set_desc(plan, head, [[[0, 0], 2], ROWS])
    code, _, err = nnscaler(tmp_path, plan, ops)
    assert code == 1
    assert f"op {head} (linear in output) is split by weight rows over tp outside an " \
           "attention or feed-forward block; nnScaler's adapters around it are not " \
           "transcribed [TVP607]" in err


def test_the_operator_table_is_required_and_checked(tmp_path: Path) -> None:
    plan_path = DATA / "nnscaler_llama_tiny_plan.json"
    code, _, err = run_tvp(["import", "nnscaler", str(plan_path), *ARGS])
    assert code == 2
    assert "--ops required" in err
    plan, ops = example()
    ops["7"] = {"module": "embed"}
    code, _, err = nnscaler(tmp_path, plan, ops)
    assert code == 1
    assert 'operator "7" must be a cid mapped to {"signature": str, "module": str[, ' \
           '"reads_batch": bool]} [TVP606]' in err


def test_columns_split_with_a_bias_is_refused(tmp_path: Path) -> None:
    """GPT-2's output projections have biases; how nnScaler splits a bias's value is not in
    the plan. (The example's operators, without w3, are GPT-2's module paths.)"""
    plan, ops = example()
    w3 = {c for c, op in ops.items() if op["module"].endswith("feed_forward.w3")}
    ops = {c: op for c, op in ops.items() if c not in w3}
    descs(plan)[:] = [e for e in descs(plan) if str(e[0]) not in w3]
    code, _, err = nnscaler(tmp_path, plan, ops, "--config", "gpt2_tiny", "--batch", "4",
                            "--seq", "8")
    assert code == 1
    wo = cid_of(ops, "layers.0.attention.wo")
    assert f"op {wo} (linear in layers.0.attention.wo): a column-split linear with a bias " \
           "(how nnScaler splits the bias's value is not in the plan) [TVP607]" in err


def test_a_data_parallel_mlp_plan_is_the_shipped_mlp_plan(tmp_path: Path) -> None:
    """An AutoDist plan splitting every operator of the MLP along the batch on 2 devices, with
    2 microbatches, means plans/mlp_tiny_dp.tvp."""
    from test_import_examples import meaning

    output = tmp_path / "mlp.tvp"
    code, _, err = run_tvp(["import", "nnscaler", str(DATA / "nnscaler_mlp_dp_plan.json"),
                            "--ops", str(DATA / "nnscaler_mlp_dp_ops.json"), "--config",
                            "mlp_tiny", "--batch", "8", "--seq", "1", "--microbatches", "2",
                            "--optimizer", "sgd lr=0.1", "-o", str(output)])
    assert code == 0, err
    assert meaning(output) == meaning(ROOT / "plans/mlp_tiny_dp.tvp")
