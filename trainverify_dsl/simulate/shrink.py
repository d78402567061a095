"""Small model sizes for simulating a full-size plan, keeping its mesh.

The mesh, the microbatch count, the layer count (pipeline stages name layer indices) and every
divisibility the plan relies on are kept; widths shrink to the least sizes the mesh divides:
the batch to (batch axes x microbatches), the sequence to a few positions per rank of the axes
that may split it, heads and kv heads to the tensor-parallel degree (keeping grouped-query
attention's ratio at 2 when the model had one), hidden and FFN widths and the vocabulary to
small multiples of the axes that split them, routed experts to a multiple of the expert axis.

A model whose config is already small (every width at most ``SMALL``) is not shrunk.
"""

from __future__ import annotations

import math
from typing import Any

from trainverify_dsl.plan.model import Plan

#: Widths at or below this are simulated as they are.
SMALL = 128
#: Spec-line settings that are not model config fields.
NOT_CONFIG = ("config", "batch", "seq")


def _config(plan: Plan) -> dict[str, Any]:
    from trainverify_dsl.spec.load import read_configs

    assert plan.spec is not None
    return dict(read_configs().get(plan.spec.config or "", {}))


def _axes_size(plan: Plan, skip: tuple[str, ...]) -> int:
    assert plan.mesh is not None
    return math.prod(a.size for a in plan.mesh.axes if a.name not in skip)


def _batch_axes(plan: Plan) -> tuple[str, ...]:
    for layout in plan.layouts:
        if str(layout.target) in ("tokens", "x"):
            return tuple(a for a in layout.axes_of_dim(0) if a != "pp")
    return ()


def shrunk_sizes(plan: Plan, settings: dict[str, Any]) -> tuple[dict[str, Any], int | None,
                                                                 int | None]:
    """``(config overrides, batch, seq)`` to simulate ``plan``; empty when already small."""
    assert plan.mesh is not None and plan.spec is not None
    config = {**_config(plan), **{k: v for k, v in settings.items() if k not in NOT_CONFIG}}
    widths = [v for k, v in config.items() if isinstance(v, int) and k not in (
        "n_layers", "n_dense_layers", "n_group", "topk_group", "n_activated_experts",
        "n_shared_experts", "max_seq_len", "rope_original_max_seq_len")]
    batch_axes = _batch_axes(plan)
    sizes = {a.name: a.size for a in plan.mesh.axes}
    n_batch = math.prod(sizes[a] for a in batch_axes) * plan.microbatches
    if all(w <= SMALL for w in widths) and (plan.spec.batch or 0) <= 64:
        return {}, None, None
    tp = sizes.get("tp", 1)
    ep = sizes.get("ep", 1)
    cp = sizes.get("cp", 1)
    # ZeRO-1 needs every parameter's local dimension 0 divisible by the shard group (Rule 6.1)
    z = math.prod(sizes[a] for a in plan.optimizer.shard_axes) if plan.optimizer else 1

    def unit(k: int) -> int:
        """The least multiple of ``k`` that a ZeRO block divides."""
        return math.lcm(k, z)

    batch = n_batch
    seq = 2 * tp * cp
    model = config.get("model")
    out: dict[str, Any] = {}
    if model == "MLP":
        out = {"d_in": unit(2 * tp), "d_hidden": unit(2 * tp), "d_out": unit(2 * tp)}
        seq = 1
    elif model in ("Llama", "GPT2"):
        heads, head_dim = 2 * tp, unit(2)
        out = {"hidden": heads * head_dim, "n_heads": heads, "ffn_hidden": tp * unit(2),
               "vocab_size": tp * unit(4), "max_seq_len": max(seq, 8)}
        if model == "Llama":
            gqa = config.get("n_kv_heads", heads) < config.get("n_heads", 0)
            out["n_kv_heads"] = tp if gqa else heads
            out["rope_original_max_seq_len"] = config.get("rope_original_max_seq_len", 8192)
    elif model == "DeepSeekV3":
        groups = config.get("n_group", 1)
        experts = math.lcm(ep * unit(2), 2 * groups)
        out = {"hidden": unit(8), "n_heads": tp, "dense_ffn": tp * unit(2),
               "moe_inter": tp * unit(2), "vocab_size": tp * unit(4),
               "n_routed_experts": experts, "qk_nope_head_dim": unit(2),
               "qk_rope_head_dim": unit(2), "v_head_dim": unit(2), "kv_lora_rank": unit(4),
               "max_seq_len": max(seq, 8),
               "n_activated_experts": min(config.get("n_activated_experts", 2), 2),
               "topk_group": min(config.get("topk_group", 1), groups)}
        if config.get("q_lora_rank"):
            out["q_lora_rank"] = unit(4)
    return out, batch, seq
