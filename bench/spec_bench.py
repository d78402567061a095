"""Benchmark: trace the real Llama-3 405B and DeepSeek-V3 671B configs into the spec IR.

Each run is a fresh subprocess (cold imports, no shared caches) that loads the model on fake
tensors and traces the training step with block reuse. Reported per model: the median over
``--runs`` runs (at least 3) of the load+trace time measured inside the process, of the whole
process wall time (including importing torch), and the peak RSS (``resource.getrusage``).
Prints a table and writes ``bench/results/spec.md``.

    python bench/spec_bench.py [--runs 3] [--batch 1] [--seq 16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("llama3_405b", "deepseek_v3_671b")
TARGET_SECONDS, TARGET_GIB = 30.0, 4.0

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
start = time.perf_counter()
from trainverify_dsl.spec.load import load_model
from trainverify_dsl.spec.trace import trace_training_step
model = load_model({model!r})
spec = trace_training_step(model, model.input_specs({batch}, {seq}))
elapsed = time.perf_counter() - start
print(json.dumps({{
    "seconds": elapsed, "trace_seconds": spec.trace_seconds, "params": spec.param_count,
    "unique_nodes": spec.program.unique_node_count,
    "expanded_nodes": spec.program.expanded_node_count,
    "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}}))
"""


def run_once(model: str, batch: int, seq: int) -> dict:
    code = CHILD.format(root=str(ROOT), model=model, batch=batch, seq=seq)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = time.perf_counter() - start
    return result


def bench(model: str, runs: int, batch: int, seq: int) -> dict:
    results = [run_once(model, batch, seq) for _ in range(runs)]
    median = {key: statistics.median(r[key] for r in results)
              for key in ("seconds", "trace_seconds", "wall_seconds", "rss_kib")}
    return {**results[0], **median, "runs": runs}


def table(rows: dict[str, dict]) -> str:
    lines = ["| model | parameters | nodes traced / expanded | load+trace s | trace s "
             "| process wall s | peak RSS GiB | target |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for model, r in rows.items():
        gib = r["rss_kib"] / 2**20
        ok = r["wall_seconds"] < TARGET_SECONDS and gib < TARGET_GIB
        lines.append(f"| {model} | {r['params']:,} | {r['unique_nodes']:,} / "
                     f"{r['expanded_nodes']:,} | {r['seconds']:.1f} | {r['trace_seconds']:.1f} "
                     f"| {r['wall_seconds']:.1f} | {gib:.2f} | {'met' if ok else 'MISSED'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=16)
    args = parser.parse_args()
    runs = max(3, args.runs)
    rows = {model: bench(model, runs, args.batch, args.seq) for model in MODELS}
    text = table(rows)
    print(text)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cpu = platform.processor() or platform.machine()
    header = (f"# Spec tracing benchmark\n\n`python bench/spec_bench.py` on {when}: {cpu}, "
              f"{os.cpu_count()} cores, Python {platform.python_version()}. Median of {runs} "
              f"fresh processes each; batch {args.batch}, seq {args.seq}; block reuse on; fake "
              f"tensors. Target: under {TARGET_SECONDS:.0f} s and {TARGET_GIB:.0f} GiB per "
              f"model (process wall time, peak RSS).\n\n")
    (ROOT / "bench" / "results" / "spec.md").write_text(header + text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
