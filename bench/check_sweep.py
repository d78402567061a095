"""How ``tvp check``'s cost grows: a Llama tiny plan (Megatron tensor parallel x data
parallel, optionally pipelined) with one dimension doubled at a time — dp, tp, pp,
microbatches, layers — each variant checked in a fresh process (``check_bench.measure``:
wall time, peak RSS, verdict, stages total/unique/proven).

    python bench/check_sweep.py                       # print the table
    python bench/check_sweep.py --write               # also bench/results/check_sweep.md

The generated plans are written to a temporary folder; the batch grows with dp and the
microbatches (two sequences per rank and microbatch), as a weak-scaling run would.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_bench import ROOT, measure  # noqa: E402

#: (name, dp, tp, pp, microbatches, layers); the base is dp=2, tp=2, pp=1, mb=1, 2 layers.
#: tp stops at 2: llama_tiny's 2 kv heads do not split 4 ways.
VARIANTS = [
    ("base", 2, 2, 1, 1, 2),
    ("dp=4", 4, 2, 1, 1, 2), ("dp=8", 8, 2, 1, 1, 2), ("dp=16", 16, 2, 1, 1, 2),
    ("tp=1", 2, 1, 1, 1, 2),
    ("mb=2", 2, 2, 1, 2, 2), ("mb=4", 2, 2, 1, 4, 2), ("mb=8", 2, 2, 1, 8, 2),
    ("mb=16", 2, 2, 1, 16, 2),
    ("layers=4", 2, 2, 1, 1, 4), ("layers=8", 2, 2, 1, 1, 8), ("layers=16", 2, 2, 1, 1, 16),
    ("pp=2 (4 layers)", 2, 2, 2, 2, 4), ("pp=4 (4 layers)", 2, 2, 4, 4, 4),
]


def plan_text(dp: int, tp: int, pp: int, mb: int, layers: int) -> str:
    batch = 2 * dp * mb
    mesh = ", ".join(f"{axis}={size}" for axis, size in (("pp", pp), ("dp", dp), ("tp", tp))
                     if axis != "pp" or pp > 1)
    lines = [
        "plan sweep",
        f'spec "stdlib/models/llama.py:Llama" config llama_tiny batch {batch} seq 8 '
        f"n_layers {layers}",
        "spec-optimizer sgd lr=0.01",
        f"mesh {mesh}",
        f"microbatches {mb}",
        "loss-scale 1/microbatches",
        'use "stdlib/megatron.tvp"',
        "",
        "split tokens [dp, -]",
        "split labels [dp, -]",
    ]
    if pp > 1:
        per = layers // pp
        for s in range(pp):
            members = [f"layers[{s * per}:{(s + 1) * per}]"]
            if s == 0:
                members.insert(0, "embed")
            if s == pp - 1:
                members += ["norm", "output", "loss"]
            lines.append(f"pipeline-stage {s}: {', '.join(members)}")
    lines += [
        "",
        "for l in layers:",
        "    apply attention_parallel(l.attention, tp)",
        "    apply column_parallel(l.feed_forward.w1, tp)",
        "    apply column_parallel(l.feed_forward.w3, tp)",
        "    split l.feed_forward.w2.weight [-, tp]",
        "    all-reduce l.feed_forward.w2.out over tp",
        "",
        "all-reduce grad(params) over dp op=avg",
        "optimizer sgd lr=0.01",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    parser.add_argument("--every-microbatch", action="store_true",
                        help="prove with every microbatch (no fewer-microbatches reduction)")
    parser.add_argument("--every-rank", action="store_true",
                        help="prove with every data-parallel rank (no fewer-ranks reduction)")
    args = parser.parse_args()
    header = ("| variant | dp | tp | pp | mb | layers | ranks | verdict | s (median) | "
              "peak RSS MiB | stages total/unique/proven | elements |")
    rows = [header, "|" + "---|" * 12]
    print("\n".join(rows), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for name, dp, tp, pp, mb, layers in VARIANTS:
            if args.only and name not in args.only:
                continue
            path = Path(folder) / f"sweep_{name.split()[0].replace('=', '')}.tvp"
            path.write_text(plan_text(dp, tp, pp, mb, layers), encoding="utf-8")
            r = measure(str(path), args.runs, args.timeout, args.time_limit + 300,
                        args.time_limit, args.every_microbatch, args.every_rank)
            row = (f"| {name} | {dp} | {tp} | {pp} | {mb} | {layers} | {dp * tp * pp} | "
                   f"{r['verdict']} | {r['seconds']:.1f} | {r['rss_mib']:.0f} | "
                   f"{'/'.join(map(str, r.get('stages', [])))} | {r.get('elements', '')} |")
            rows.append(row)
            print(row, flush=True)
    if args.write:
        out = ROOT / "bench" / "results" / "check_sweep.md"
        out.write_text("# `tvp check` cost as one dimension doubles\n\n"
                       f"`python bench/check_sweep.py --runs {args.runs} --write` (2-core "
                       "shared machine; one fresh process per run; Llama tiny, Megatron "
                       "TP x DP, SGD).\n\n" + "\n".join(rows) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
