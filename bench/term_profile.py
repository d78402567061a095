"""Where a proof's distinct terms come from: ``tvp check`` on one plan, with the growth of the
term table (``check/terms.py``) counted per op and per module and phase of the node that
made the terms.

    python bench/term_profile.py plans/llama3_8b_3d.tvp [TIME_LIMIT]

Prints the verdict, then the largest contributors. A plan that stops at the term limit
(``terms.MAX_TERMS``) shows what filled the table up to there.
"""

from __future__ import annotations

import collections
import sys
import time

from trainverify_dsl.api import check_file
from trainverify_dsl.check import terms
from trainverify_dsl.check.symbolic import SymbolicDomain


def main() -> None:
    by_op: collections.Counter[str] = collections.Counter()
    by_module: collections.Counter[str] = collections.Counter()
    run = SymbolicDomain.run

    def counted(self: SymbolicDomain, node: object, args: tuple) -> object:
        before = len(terms._TABLE)
        out = run(self, node, args)
        made = len(terms._TABLE) - before
        origin = node.origin  # type: ignore[attr-defined]
        by_op[node.op] += made  # type: ignore[attr-defined]
        by_module[f"{origin.module or '(step)'} {origin.phase} {node.op}"] += made  # type: ignore[attr-defined]
        return out

    SymbolicDomain.run = counted  # type: ignore[method-assign]
    limit = float(sys.argv[2]) if len(sys.argv) > 2 else 600.0
    start = time.perf_counter()
    verdict = check_file(sys.argv[1], cache=False, time_limit=limit)
    print(f"{verdict.verdict}: {verdict.reason[:200]} ({time.perf_counter() - start:.1f} s; "
          f"{sum(by_op.values()):,} terms made by ops)")
    print("by op:")
    for op, made in by_op.most_common(12):
        print(f"  {made:>11,}  {op}")
    print("by module, phase and op:")
    for where, made in by_module.most_common(25):
        print(f"  {made:>11,}  {where}")


if __name__ == "__main__":
    main()
