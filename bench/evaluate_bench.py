"""The numeric run of a plan's parallel program alone: build the programs once (as
``tvp check`` does: shrunk, one stage per block), then time ``ir.execute.evaluate_parallel``
on the pre-check's values, median of several runs in one process.

    python bench/evaluate_bench.py plans/llama3_8b_3d.tvp --runs 3

Prints the plan's ranks, stages and microbatches, each run's seconds and the median; the
numbers it was written for are in ``bench/results/check.md`` (session 15).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainverify_dsl import api  # noqa: E402
from trainverify_dsl.ir.execute import evaluate_parallel  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("plan")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    built = api.build_programs(args.plan, shrink=True, blocks=True)
    program = built.program
    values = api.step_values(program, built.spec, built.setup.build_real(), 0)
    ranks = 1
    for _, size in program.mesh:
        ranks *= size
    print(f"{args.plan}: {ranks} ranks, {len(program.stages)} stages, "
          f"{program.microbatches} microbatches", flush=True)
    seconds = []
    for _ in range(args.runs):
        start = time.perf_counter()
        evaluate_parallel(program, values)
        seconds.append(time.perf_counter() - start)
        print(f"  {seconds[-1]:.1f} s", flush=True)
    print(f"median {statistics.median(seconds):.1f} s")


if __name__ == "__main__":
    main()
