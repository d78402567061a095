"""Benchmark: the layout pass at full size, and `tvp simulate` at shrunk sizes.

Each measurement is a fresh subprocess (cold imports). Reported per plan: the median over
``--runs`` runs of the wall time inside the process (and the lowering time alone for the
layout pass), the peak RSS (``resource.getrusage``), the number of findings; for simulations
the ranks, the tensors compared, ``max_rel_error`` and whether the plan agrees with the spec.
Prints a table and writes ``bench/results/simulate.md``.

    python bench/simulate_bench.py [--runs 3] [--heavy-runs 1] [--quick]

Full-size lowering and the shrunk simulations of the big meshes take minutes each, so they are
measured ``--heavy-runs`` times (default 1); the small plans ``--runs`` times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUT_PLANS = ("llama3_8b_dp", "llama3_8b_3d", "llama3_70b", "llama3_405b", "deepseek_v3_16b",
                "deepseek_v3_236b", "deepseek_v3_671b")
SIM_PLANS = ("mlp_tiny_dp", "llama_tiny_tp", "llama_tiny_sp", "llama_tiny_cp",
             "deepseek_tiny_ep", "deepseek_tiny_pp", "mlp_dp_tp", "gpt2_3d", "llama3_8b_3d",
             "llama3_8b_dp", "llama3_2_1b_tied")
QUICK_SIM = SIM_PLANS[:8]

LAYOUT_CHILD = """
import json, resource, sys, time, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {root!r})
start = time.perf_counter()
from trainverify_dsl.lower.lowering import lower
from trainverify_dsl.api import prepare
setup = prepare({plan!r}, shrink=False, real=False)
mid = time.perf_counter()
lowered = lower(setup.plan, setup.fake_model, setup.fake_inputs)
end = time.perf_counter()
print(json.dumps({{"seconds": end - start, "lower_seconds": end - mid,
    "findings": len(lowered.findings), "stages": len(lowered.stages),
    "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}}))
"""

SIM_CHILD = """
import json, resource, sys, time, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {root!r})
start = time.perf_counter()
from trainverify_dsl.api import simulate_file
result = simulate_file({plan!r})
print(json.dumps({{"seconds": time.perf_counter() - start, "ranks": result.ranks,
    "compared": result.compared, "max_rel_error": result.max_rel_error,
    "agrees": result.agrees, "findings": len(result.findings),
    "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}}))
"""


def measure(child: str, plan: str, runs: int) -> dict:
    samples = []
    for _ in range(runs):
        code = child.format(root=str(ROOT), plan=str(ROOT / "plans" / f"{plan}.tvp"))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=ROOT, check=True)
        samples.append(json.loads(out.stdout.strip().splitlines()[-1]))
    result = dict(samples[0])
    result["seconds"] = statistics.median(s["seconds"] for s in samples)
    result["rss_gib"] = max(s["rss_gib"] for s in samples)
    if "lower_seconds" in result:
        result["lower_seconds"] = statistics.median(s["lower_seconds"] for s in samples)
    result["runs"] = runs
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--heavy-runs", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="small plans only (no full-size layout pass or shrunk big plans)")
    args = parser.parse_args()
    lines = ["# Layout pass and simulation", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
             f"{platform.python_version()}. Medians of {args.runs} runs for the small plans, "
             f"{args.heavy_runs} for full-size lowering and the big meshes; each run a fresh "
             "process. Reproduce: `python bench/simulate_bench.py`.", ""]
    if not args.quick:
        lines += ["## Layout pass at full size (`tvp lint --spec`)", "",
                  "| plan | stages | findings | lowering s | process s | peak RSS GiB |",
                  "|---|---|---|---|---|---|"]
        for plan in LAYOUT_PLANS:
            r = measure(LAYOUT_CHILD, plan, args.heavy_runs)
            lines.append(f"| {plan} | {r['stages']} | {r['findings']} | "
                         f"{r['lower_seconds']:.1f} | {r['seconds']:.1f} | {r['rss_gib']:.2f} |")
            print(lines[-1], flush=True)
        lines.append("")
    lines += ["## Simulation (`tvp simulate`, shrunk widths, full mesh)", "",
              "| plan | ranks | tensors compared | max rel. error | agrees | findings | s | "
              "peak RSS GiB | runs |", "|---|---|---|---|---|---|---|---|---|"]
    for plan in QUICK_SIM if args.quick else SIM_PLANS:
        runs = args.runs if plan in QUICK_SIM else args.heavy_runs
        r = measure(SIM_CHILD, plan, runs)
        lines.append(f"| {plan} | {r['ranks']} | {r['compared']} | {r['max_rel_error']:.2e} | "
                     f"{'yes' if r['agrees'] else 'NO'} | {r['findings']} | {r['seconds']:.1f} "
                     f"| {r['rss_gib']:.2f} | {r['runs']} |")
        print(lines[-1], flush=True)
    out = ROOT / "bench" / "results" / "simulate.md"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
