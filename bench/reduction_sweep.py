"""Shape reduction, measured: generated MLP plans (random dp, tp, microbatches, widths and
one of the faults of ``tests/test_shape_reduction.py``) checked by ``tvp check`` at reduced
widths, against the same plan simulated at its full widths. Prints the tally of
``(fault, full-size verdict, reduced verdict)`` and every plan where the two differ.

    python bench/reduction_sweep.py [COUNT] [SEED]
"""

from __future__ import annotations

import collections
import logging
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def main() -> int:
    logging.disable(logging.CRITICAL)
    warnings.filterwarnings("ignore")
    from test_shape_reduction import EXPECTED, FAULTS, full_size, plan_text

    from trainverify_dsl import api

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 7)
    tally: collections.Counter[tuple[str, str, str]] = collections.Counter()
    differ = []
    start = time.time()
    for _ in range(count):
        dp, tp, mb = rng.choice([1, 2]), rng.choice([2, 3, 4]), rng.choice([1, 2, 3])
        d_in, k, rows = rng.randint(2, 6), rng.randint(1, 5), rng.randint(1, 3)
        fault = rng.choice(sorted(FAULTS))
        d_hidden = tp * k + (rng.choice([0, 1]) if fault == "none" else 0)
        text = plan_text(dp, tp, mb, d_in, d_hidden, dp * mb * rows * 2, fault)
        path = Path(tempfile.mkdtemp()) / "generated.tvp"
        path.write_text(text)
        want = EXPECTED[full_size(path)]
        got = api.check_file(path, cache=False).verdict
        tally[(fault, want, got)] += 1
        if got != want:
            differ.append((dp, tp, mb, d_in, d_hidden, fault, want, got))
    print(f"{count} plans in {time.time() - start:.0f} s")
    print("| fault | full-size simulation | reduced `tvp check` | plans |")
    print("|---|---|---|---|")
    for (fault, want, got), n in sorted(tally.items()):
        print(f"| {fault} | {want} | {got} | {n} |")
    print(f"plans where they differ: {differ or 'none'}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
