"""``tvp check`` on the shipped plans: verdict, wall time, peak RSS and what decided each
element (normal form, multiplying out, z3), one fresh process per plan and run.

    python bench/check_bench.py                  # the small plans, 1 run each
    python bench/check_bench.py --runs 3 plans/mlp_tiny_dp.tvp
    python bench/check_bench.py --write          # also write bench/results/check.md
    python bench/check_bench.py --time-limit 240 --write --output bench/results/x.md P...

Timing on a shared machine is noisy: with ``--runs N`` the median is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["mlp_tiny_dp", "mlp_dp_tp", "mlp_tiny_zero", "llama_tiny_tp", "llama_tiny_sp",
         "llama_tiny_cp", "gpt2_3d", "deepseek_tiny_tp", "deepseek_tiny_pp", "deepseek_tiny_ep"]
BUGS = ["loss_not_scaled", "loss_scaled_twice", "sum_instead_of_avg",
        "zero_reduce_scatter_order"]

CHILD = r"""
import json, resource, sys, time, warnings
warnings.filterwarnings("ignore")
from trainverify_dsl.api import check_file
start = time.perf_counter()
v = check_file(sys.argv[1], timeout=float(sys.argv[2]), time_limit=float(sys.argv[3]),
               cache=False, fewer_microbatches="every" not in sys.argv[4:],
               fewer_ranks="every-rank" not in sys.argv[4:])
print(json.dumps({"verdict": v.verdict, "seconds": time.perf_counter() - start,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "elements": v.elements, "normal_form": v.by_normal_form,
                  "expanded": v.by_expansion, "z3": v.by_solver,
                  "stages": [v.stages_total, v.stages_unique, v.stages_proven],
                  "reason": v.reason[:160]}))
"""


def measure(path: str, runs: int, timeout: float, limit: float, time_limit: float,
            every_microbatch: bool = False, every_rank: bool = False) -> dict:
    """``every_microbatch``: prove with every microbatch of the plan (``check_file``'s
    ``fewer_microbatches=False``); ``every_rank``: with every data-parallel rank
    (``fewer_ranks=False``)."""
    results = []
    for _ in range(runs):
        try:
            out = subprocess.run([sys.executable, "-c", CHILD, path, str(timeout),
                                  str(time_limit)] + (["every"] if every_microbatch else [])
                                 + (["every-rank"] if every_rank else []),
                                 cwd=ROOT,
                                 capture_output=True, text=True, check=False, timeout=limit)
        except subprocess.TimeoutExpired:
            return {"verdict": f"not finished in {limit:.0f} s", "seconds": limit,
                    "rss_mib": float("nan"), "reason": "killed by the benchmark"}
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            return {"verdict": "crashed", "seconds": float("nan"), "rss_mib": float("nan"),
                    "reason": out.stderr.strip().splitlines()[-1:] or [""]}
        results.append(json.loads(lines[-1]))
    best = dict(results[0])
    best["seconds"] = statistics.median(r["seconds"] for r in results)
    best["rss_mib"] = max(r["rss_mib"] for r in results)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("plans", nargs="*")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--limit", type=float, default=900.0,
                        help="seconds a plan may take before it is killed (default 900)")
    parser.add_argument("--time-limit", type=float, default=600.0,
                        help="tvp check's own limit per plan (default 600, its default)")
    parser.add_argument("--every-rank", action="store_true",
                        help="prove with every data-parallel rank (no fewer-ranks reduction)")
    parser.add_argument("--output", default="bench/results/check.md",
                        help="the file --write writes (default bench/results/check.md)")
    args = parser.parse_args()
    plans = args.plans or [f"plans/{p}.tvp" for p in SMALL] + \
        [f"plans/bugs/{p}.tvp" for p in BUGS]
    rows = []
    header = ("| plan | verdict | s (median) | peak RSS MiB | elements | normal form | "
              "expanded | z3 | stages total/unique/proven | reason |")
    print(header)
    print("|" + "---|" * 10)
    for plan in plans:
        r = measure(plan, args.runs, args.timeout, args.limit, args.time_limit,
                    every_rank=args.every_rank)
        row = (f"| {plan} | {r['verdict']} | {r['seconds']:.1f} | {r['rss_mib']:.0f} | "
               f"{r.get('elements', '')} | {r.get('normal_form', '')} | "
               f"{r.get('expanded', '')} | {r.get('z3', '')} | "
               f"{'/'.join(map(str, r.get('stages', [])))} | "
               f"{str(r.get('reason', '')).replace('|', '/')} |")
        rows.append(row)
        print(row, flush=True)
    if args.write:
        out = ROOT / args.output
        given = " ".join(args.plans) + " " if args.plans else ""
        out.write_text("# `tvp check` on the shipped plans\n\n"
                       f"`python bench/check_bench.py --runs {args.runs} --time-limit "
                       f"{args.time_limit:g} --write {given}` "
                       "(2-core shared machine; one fresh process per run).\n\n"
                       + header + "\n|" + "---|" * 10 + "\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
