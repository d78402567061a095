"""`tvp simulate` on a plan it does not shrink: the full-size layout pass's lowering reused for the
simulation, against lowering the same plan a second time. Median of 3 in-process runs per plan.

    python bench/lowering_reuse_bench.py
"""

import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.simplefilter("ignore")

import trainverify_dsl.api as api  # noqa: E402

orig = api._layout_pass


def no_reuse(path, allow):
    d, _ = orig(path, allow)
    return d, None


for plan in ("plans/llama_tiny_tp.tvp", "plans/deepseek_tiny_pp.tvp"):
    api.simulate_file(plan)  # warm imports
    res = {}
    for name, fn in (("reuse", orig), ("lower twice", no_reuse)):
        api._layout_pass = fn
        ts = []
        for _ in range(3):
            start = time.perf_counter()
            r = api.simulate_file(plan)
            ts.append(time.perf_counter() - start)
            assert r.agrees
        res[name] = statistics.median(ts)
    api._layout_pass = orig
    print(plan, {k: round(v, 2) for k, v in res.items()},
          "ratio", round(res["lower twice"] / res["reuse"], 2))
