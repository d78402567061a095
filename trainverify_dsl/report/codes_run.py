"""Diagnostic codes of running a plan: ``tvp simulate`` (and the checker, which will share them).

They concern the work a plan asks for, not its meaning; the plan itself may be correct.
"""

from trainverify_dsl.report.diagnostics import Code, Severity

OVER_BUDGET = Code(
    "TVP501", "over-budget", Severity.ERROR,
    "the simulation would need more memory than its budget",
    "Before anything is allocated, `tvp simulate` estimates the bytes it will hold from the "
    "lowered program's types (every rank's live values of the largest stage, the kept "
    "gradients and observed values, the global values and the reference step) and refuses a "
    "plan whose estimate exceeds the budget (`--max-memory`, by default half of the machine's "
    "memory). Mesh axes no statement uses are run at size 1 first: they cannot change the "
    "result.",
    "Plans arrive from pull requests and search tools, and `tvp simulate` runs in CI: a "
    "mesh of millions of ranks, or `--no-shrink` on an 8B model, would otherwise grow until "
    "the machine kills it instead of failing with a reason.",
    'plan big\nspec "stdlib/models/llama.py:Llama" config llama3_8b batch 8 seq 128\n'
    "spec-optimizer sgd lr=0.01\nmesh dp=1024\nsplit tokens [dp, -]\nsplit labels [dp, -]\n"
    "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.01\n"
    "# tvp simulate --no-shrink big.tvp\n",
    'plan big\nspec "stdlib/models/llama.py:Llama" config llama3_8b batch 8 seq 128\n'
    "spec-optimizer sgd lr=0.01\nmesh dp=1024\nsplit tokens [dp, -]\nsplit labels [dp, -]\n"
    "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.01\n"
    "# tvp simulate big.tvp    (widths shrunk; or raise --max-memory)\n",
)

CODES: tuple[Code, ...] = (OVER_BUDGET,)
