"""Where `tvp check`'s time goes on one plan: the seconds of each phase it reports.

    python bench/check_phases.py plans/gpt2_3d.tvp

Runs ``api.check_file`` (no cache) with a progress callback that prints how long each phase
took, then the verdict, its stages (total / distinct), the peak RSS and the total.
"""

from __future__ import annotations

import resource
import sys
import time

from trainverify_dsl import api


def main() -> None:
    start = time.perf_counter()
    last = [start, "start"]

    def progress(phase: str) -> None:
        now = time.perf_counter()
        print(f"{now - last[0]:8.1f} s  {last[1]}", flush=True)
        last[0], last[1] = now, phase

    verdict = api.check_file(sys.argv[1], progress=progress, cache=False,
                             allow_model_outside_root=True)
    progress("end")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{verdict.verdict}: {verdict.reason}")
    print(f"stages {verdict.stages_total} / {verdict.stages_unique} distinct, "
          f"peak RSS {rss:.2f} GiB, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
