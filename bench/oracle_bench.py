"""Benchmark and record: the distributed oracle on every small plan and every bug plan.

For each plan with at most 8 ranks: the plan run as a real multi-process ``torch.distributed``
(gloo) training step, compared with the single-device torch step (``trainverify_dsl.oracle``);
reported per plan: the verdict (agrees / differs / cannot be lowered), the ranks, the tensors
compared, the max relative error, the first difference, the seconds (prepare + lower + the
forked ranks' step; the first plan also pays the imports) and, with ``--simulate``, the verdict
of ``tvp simulate`` on the same plan (they must agree on agree/differ). Prints a table and
writes ``bench/results/oracle.md``.

    python bench/oracle_bench.py [--simulate] [--no-write] [PLAN ...]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CORRECT = ("mlp_tiny_dp", "llama_tiny_tp", "llama_tiny_sp", "llama_tiny_cp", "deepseek_tiny_ep",
           "deepseek_tiny_pp", "deepseek_tiny_tp", "mlp_dp_tp", "mlp_tiny_zero")


def default_plans() -> list[str]:
    bugs = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "plans" / "bugs").glob("*.tvp"))
    return [f"plans/{name}.tvp" for name in CORRECT] + bugs


def simulate_verdict(path: str) -> str:
    from trainverify_dsl.api import SimulationSetupError, simulate_file
    from trainverify_dsl.lower.findings import LoweringError
    from trainverify_dsl.report.diagnostics import Severity

    try:
        result = simulate_file(ROOT / path)
    except LoweringError:
        return "cannot be lowered"
    except SimulationSetupError as error:
        codes = sorted({d.code.id for d in error.diagnostics if d.severity is Severity.ERROR})
        return "refused (" + ", ".join(codes) + ")" if codes else "refused"
    return "agrees" if result.agrees else "differs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plans", nargs="*", help="plan files (default: the small and bug plans)")
    parser.add_argument("--simulate", action="store_true", help="also run `tvp simulate`")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    os.chdir(ROOT)
    from trainverify_dsl.oracle import run_many

    rows = []
    total = time.perf_counter()
    for path in args.plans or default_plans():
        result = run_many([path])[path]
        if result.lowering_error:
            verdict, error, first = "cannot be lowered", "-", result.error.split("\n")[0]
        elif result.error is not None:
            verdict, error, first = "not run", "-", result.error.split("\n")[0]
        else:
            verdict = "agrees" if result.agrees else "differs"
            error = f"{result.max_rel_error:.2g}"
            f = result.first
            first = "-" if f is None else f"{f.tensor}" + (f" (rank {f.rank})" if f.rank >= 0
                                                          else "")
        row = [f"`{path}`", verdict, str(result.ranks or "-"), str(result.compared or "-"),
               error, f"{result.seconds:.1f}", first[:90]]
        if args.simulate:
            row.insert(2, simulate_verdict(path))
        rows.append(row)
        print(" | ".join(row), flush=True)
    header = ["plan", "oracle", "ranks", "tensors", "max rel. error", "seconds",
              "first difference"]
    if args.simulate:
        header.insert(2, "tvp simulate")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join([
        "# Distributed oracle (`python bench/oracle_bench.py" +
        (" --simulate" if args.simulate else "") + "`)",
        "",
        f"{datetime.date.today()}, nproc {os.cpu_count()}, Python {platform.python_version()}; "
        f"total {time.perf_counter() - total:.0f} s (each plan its own `run_many`, so every "
        "plan's seconds include its lowering; the first also the imports). A shared machine: "
        "indicative numbers.",
        "",
        "Every plan runs as a real gloo training step, one forked process per rank, and is "
        "compared with the single-device torch step (torch.autograd + torch.optim, float64). "
        "Agreement means a max relative error below 1e-9.",
        "",
        *lines, ""])
    print(text)
    if not args.no_write:
        out = ROOT / "bench" / "results" / "oracle.md"
        out.write_text(text)
        print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
