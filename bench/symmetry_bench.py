"""The proof with and without merging identical blocks (``check/symmetry.py``).

For Llama tiny plans of growing depth (data x tensor parallel; and pipelines with
microbatches), builds the pair once and times ``check.prove.prove`` with ``symmetric=True``
and ``False`` (median of ``--runs``, the two alternating), recording the stages (total,
distinct), the elements compared, the elements the representatives stand for, and the
terms each run built. The invariant ``elements(merged) + covered == elements(whole)`` is
checked on every row.

    python bench/symmetry_bench.py --runs 3 --write
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_sweep import plan_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "symmetry.md"
#: (name, dp, tp, pp, microbatches, layers)
VARIANTS = [
    ("layers=2", 2, 2, 1, 1, 2), ("layers=4", 2, 2, 1, 1, 4), ("layers=8", 2, 2, 1, 1, 8),
    ("layers=16", 2, 2, 1, 1, 16),
    ("pp=2, mb=2, layers=8", 2, 2, 2, 2, 8), ("pp=4, mb=4, layers=8", 2, 2, 4, 4, 8),
]


def pair_of(text: str):
    from trainverify_dsl import api

    folder = Path(tempfile.mkdtemp())
    path = folder / "plan.tvp"
    path.write_text(text.replace('"stdlib/', f'"{ROOT}/stdlib/'))
    built = api.build_programs(path, shrink=True, blocks=True, allow_model_outside_root=True)
    values = api.step_values(built.program, built.spec, built.setup.build_real(), 0)
    return api.check_pair(built, values)


def main() -> None:
    from trainverify_dsl.check.prove import prove

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    rows = []
    for name, dp, tp, pp, mb, layers in VARIANTS:
        pair = pair_of(plan_text(dp, tp, pp, mb, layers))
        times: dict[bool, list[float]] = {True: [], False: []}
        proofs = {}
        for _ in range(args.runs):
            for symmetric in (True, False):
                start = time.perf_counter()
                proofs[symmetric] = prove(pair, symmetric=symmetric)
                times[symmetric].append(time.perf_counter() - start)
        merged, whole = proofs[True], proofs[False]
        assert merged.status == whole.status == "proven", (merged.reason, whole.reason)
        assert merged.elements + merged.by_symmetry == whole.elements
        s_m, s_w = statistics.median(times[True]), statistics.median(times[False])
        rows.append(f"| {name} | {merged.stages} | {merged.stages - merged.merged} | "
                    f"{merged.elements:,} | {merged.by_symmetry:,} | {whole.elements:,} | "
                    f"{merged.term_count:,} | {whole.term_count:,} | {s_m:.2f} | {s_w:.2f} | "
                    f"{s_w / s_m:.1f}x |")
        print(rows[-1], flush=True)
    table = ["| plan (dp=2, tp=2) | stages | distinct | elements compared | covered by "
             "symmetry | elements without | terms | terms without | proof s | proof s "
             "without | speed-up |", "|---|---|---|---|---|---|---|---|---|---|---|"] + rows
    text = "\n".join(table) + "\n"
    if args.write:
        OUT.write_text(
            "# Symmetry: identical blocks proven once\n\n"
            f"`python bench/symmetry_bench.py --runs {args.runs} --write` (2-core shared "
            "machine; the pair built once per plan, `check.prove.prove` timed with and "
            "without merging, alternating, median of the runs; the whole `tvp check` adds "
            "the layout pass, tracing, lowering and the numeric pre-check).\n\n" + text)
    print(text)


if __name__ == "__main__":
    main()
