"""The loop an auto-parallel search runs: many generated variants of one Llama plan checked
one after another through the Python API (``trainverify_dsl.api.check`` on plan text), in
one process, and the throughput in plans per minute after the first.

    python bench/search_bench.py                      # 50 variants, print the table
    python bench/search_bench.py --write              # also bench/results/search.md
    python bench/search_bench.py --count 10 --config llama3_8b --time-limit 300

A variant picks a mesh (dp, tp, pp), a microbatch count, how the layers are split into
pipeline stages (balanced or not), and the optimizer (plain, or AdamW with ZeRO-1 states
sharded over dp), then writes the plan a search tool would: Megatron tensor parallel
statements, data-parallel input splits, gradient averaging. The variants are enumerated in a
fixed order and shuffled with a fixed seed, so every run checks the same plans. Each is
checked twice with a proof cache that starts empty: the first pass proves every variant (they
are distinct programs, so each is a miss) and fills it; the second meets the same plans
again, as a search does (only the proof is skipped: the lowering and the numeric pre-check
run again).
"""

from __future__ import annotations

import argparse
import itertools
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainverify_dsl import api  # noqa: E402


def stage_splits(layers: int, pp: int) -> list[tuple[int, ...]]:
    """The layer counts per stage a search would try: balanced, and (where it exists) one
    layer moved from the first stage to the last (the first holds the embedding, the last
    the head)."""
    if pp == 1:
        return [(layers,)]
    if layers % pp:
        return []
    balanced = (layers // pp,) * pp
    out = [balanced]
    if balanced[0] > 1:
        out.append((balanced[0] - 1,) + balanced[1:-1] + (balanced[-1] + 1,))
    return out


def variants(layers: int, max_ranks: int) -> list[dict]:
    out = []
    for dp, tp, pp, mb in itertools.product((1, 2, 4), (1, 2), (1, 2, 4), (1, 2, 4)):
        if dp * tp * pp > max_ranks or dp * tp * pp == 1:
            continue
        for split in stage_splits(layers, pp):
            for zero in (False, True):
                if zero and dp == 1:
                    continue
                out.append({"dp": dp, "tp": tp, "pp": pp, "mb": mb, "split": split,
                            "zero": zero})
    return out


def plan_text(v: dict, config: str, layers: int, index: int) -> str:
    dp, tp, pp, mb = v["dp"], v["tp"], v["pp"], v["mb"]
    axes = [(name, size) for name, size in (("pp", pp), ("dp", dp), ("tp", tp)) if size > 1]
    batch = dp * mb
    optimizer = "adamw lr=3e-4 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1" if v["zero"] \
        else "sgd lr=0.01"
    lines = [
        f"plan variant_{index}",
        f'spec "stdlib/models/llama.py:Llama" config {config} batch {batch} seq 8 '
        f"n_layers {layers}",
        f"spec-optimizer {optimizer}",
        f"mesh {', '.join(f'{a}={s}' for a, s in axes)}",
        f"microbatches {mb} schedule 1f1b",
        "loss-scale 1/microbatches",
        'use "stdlib/megatron.tvp"',
        "",
    ]
    if dp > 1:
        lines += ["split tokens [dp, -]", "split labels [dp, -]"]
    if pp > 1:
        start = 0
        for s, count in enumerate(v["split"]):
            members = [f"layers[{start}:{start + count}]"]
            start += count
            if s == 0:
                members.insert(0, "embed")
            if s == pp - 1:
                members += ["norm", "output", "loss"]
            lines.append(f"pipeline-stage {s}: {', '.join(members)}")
    if tp > 1:
        lines += [
            "for l in layers:",
            "    apply attention_parallel(l.attention, tp)",
            "    apply column_parallel(l.feed_forward.w1, tp)",
            "    apply column_parallel(l.feed_forward.w3, tp)",
            "    split l.feed_forward.w2.weight [-, tp]",
            "    all-reduce l.feed_forward.w2.out over tp",
        ]
    if dp > 1:
        lines.append("all-reduce grad(params) over dp op=avg")
    lines.append(f"optimizer {optimizer}" + (" shard over dp" if v["zero"] else ""))
    return "\n".join(lines) + "\n"


def describe(v: dict) -> str:
    split = "/".join(map(str, v["split"])) if v["pp"] > 1 else "-"
    return f"dp={v['dp']} tp={v['tp']} pp={v['pp']} mb={v['mb']} stages {split}" + \
        (" zero-1" if v["zero"] else "")


def run(plans: list[str], time_limit: float, cache_dir: Path | None) -> list[tuple]:
    out = []
    for text in plans:
        start = time.perf_counter()
        verdict = api.check(text, base_dir=ROOT, time_limit=time_limit,
                            cache=cache_dir is not None, cache_dir=cache_dir)
        out.append((verdict.verdict, time.perf_counter() - start, verdict.reason,
                    verdict.stages_total, verdict.stages_unique))
    return out


def per_minute(seconds: list[float]) -> float:
    """Plans per minute after the first (the first pays the imports and warm-up)."""
    rest = seconds[1:] or seconds
    return 60.0 * len(rest) / sum(rest)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default="llama_tiny")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--max-ranks", type=int, default=16)
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()

    pool = variants(args.layers, args.max_ranks)
    random.Random(args.seed).shuffle(pool)
    chosen = pool[:args.count]
    plans = [plan_text(v, args.config, args.layers, i) for i, v in enumerate(chosen)]
    with tempfile.TemporaryDirectory() as folder:
        cold = run(plans, args.time_limit, Path(folder))
        warm = run(plans, args.time_limit, Path(folder))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    rows = []
    for i, (v, c, w) in enumerate(zip(chosen, cold, warm, strict=True)):
        rows.append(f"| {i} | {describe(v)} | {c[0]} | {c[3]}/{c[4]} | {c[1]:.1f} | "
                    f"{w[0]} | {w[1]:.1f} |")
    counts = {k: sum(1 for c in cold if c[0] == k) for k in sorted({c[0] for c in cold})}
    seconds = [c[1] for c in cold]
    summary = [
        f"- {len(chosen)} variants of `{args.config}` ({args.layers} layers, up to "
        f"{args.max_ranks} ranks; {len(pool)} in the space), seed {args.seed}, "
        f"`--time-limit {args.time_limit:g}`",
        "- verdicts: "
        + ", ".join(f"{n} {k}" for k, n in counts.items()),
        f"- first pass (every plan proven): {sum(seconds):.0f} s in all, median "
        f"{statistics.median(seconds):.1f} s per plan, **{per_minute(seconds):.1f} plans per "
        "minute after the first**",
        f"- second pass (the same plans met again): "
        f"{per_minute([w[1] for w in warm]):.1f} per minute, "
        f"{sum(1 for w in warm if 'proof cache' in (w[2] or ''))} of {len(warm)} proofs read "
        "from the cache",
        f"- peak RSS of the process: {rss:.2f} GiB",
    ]
    table = ["| # | variant | verdict | stages total/distinct | s | met again | s |",
             "|---|---|---|---|---|---|---|"] + rows
    text = "\n".join(summary + [""] + table)
    print(text)
    if args.write:
        target = ROOT / "bench" / "results" / "search.md"
        header = ("# An auto-parallel search through the API\n\n"
                  "`python bench/search_bench.py --write` (see its docstring). One process, "
                  "plans given as text to `api.check`.\n\n")
        target.write_text(header + text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
