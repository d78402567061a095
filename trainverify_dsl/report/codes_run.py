"""Diagnostic codes of running a plan: ``tvp simulate`` and ``tvp check``.

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
    "result. Before torch is even imported, a plan asking for more than 65,536 busy ranks or "
    "65,536 microbatches is refused from the plan alone, and `--no-shrink` on a model whose "
    "parameters and gradients alone (16 bytes a parameter) exceed the budget is refused "
    "before the full-size layout pass.",
    "Plans arrive from pull requests and search tools, and `tvp simulate` runs in CI: a "
    "mesh of millions of ranks, or `--no-shrink` on an 8B model, would otherwise grow until "
    "the machine kills it instead of failing with a reason.",
    'plan big\nspec "stdlib/models/llama.py:Llama" config llama3_8b batch 1024 seq 128\n'
    "spec-optimizer sgd lr=0.01\nmesh dp=1024\nsplit tokens [dp, -]\nsplit labels [dp, -]\n"
    "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.01\n"
    "# tvp simulate --no-shrink big.tvp\n",
    'plan big\nspec "stdlib/models/llama.py:Llama" config llama3_8b batch 1024 seq 128\n'
    "spec-optimizer sgd lr=0.01\nmesh dp=1024\nsplit tokens [dp, -]\nsplit labels [dp, -]\n"
    "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.01\n"
    "# tvp simulate big.tvp    (widths shrunk; or raise --max-memory)\n",
)

COUNTEREXAMPLE = Code(
    "TVP502", "counterexample", Severity.ERROR,
    "the plan's training step computes something else than the spec's",
    "`tvp check` evaluated the plan's parallel program and the spec's single-device training "
    "step on the same random values (float64) and a checked tensor differs: the loss, a "
    "gradient copy in its final layout, a layout claim, or an updated parameter or optimizer "
    "state. The diagnostic sits at the plan line of the first failing claim or statement, "
    "and names the tensor, the rank and the relative error.",
    "Wrong plans rarely crash: they silently train a different model. A confirmed "
    "difference is the plan line to fix.",
    "plan mlp_dp\nspec \"stdlib/models/mlp.py:MLP\" config mlp_tiny batch 8 seq 1\n"
    "spec-optimizer sgd lr=0.1\nmesh dp=2\nsplit x [dp, -]\nsplit target [dp, -]\n"
    "all-reduce grad(params) over dp op=sum   # the sum of two local means\n"
    "optimizer sgd lr=0.1\n",
    "plan mlp_dp\nspec \"stdlib/models/mlp.py:MLP\" config mlp_tiny batch 8 seq 1\n"
    "spec-optimizer sgd lr=0.1\nmesh dp=2\nsplit x [dp, -]\nsplit target [dp, -]\n"
    "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.1\n",
)

INCONCLUSIVE = Code(
    "TVP503", "inconclusive", Severity.WARNING,
    "the checker could neither prove the plan nor find a difference",
    "Numeric evaluation found no difference, but the proof did not go through: an op has no "
    "exact encoding for these values (a sort or top-k of computed scores), the solver timed "
    "out or answered unknown, or the two sides differ only under uninterpreted functions "
    "(for example `exp(a + b)` against `exp(a) * exp(b)`). The message says which.",
    "`verified` is said only when every obligation is proven; unknown is not success.",
    "# tvp check plans/deepseek_tiny_ep.tvp   (top-k routing of computed scores)\n",
    "# raise --timeout, or write the plan's computation as the spec writes it\n",
)

NO_SPEC = Code(
    "TVP504", "no-spec", Severity.ERROR,
    "the plan names no model to run or check it against",
    "`tvp simulate`, `tvp check` and `tvp run-distributed` compare the plan with its spec's "
    "single-device training step, so the plan needs a `spec` line (the model, its config and "
    "the batch). `tvp lint` accepts a plan without one (a fragment, or a plan checked only "
    "for consistency).",
    "Without a spec there is nothing the plan could be proven equal to.",
    "plan mlp_dp\nmesh dp=2\nsplit x [dp, -]\nsplit target [dp, -]\n"
    "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.1\n",
    "plan mlp_dp\nspec \"stdlib/models/mlp.py:MLP\" config mlp_tiny batch 8 seq 1\n"
    "spec-optimizer sgd lr=0.1\nmesh dp=2\nsplit x [dp, -]\nsplit target [dp, -]\n"
    "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.1\n",
)

CODES: tuple[Code, ...] = (OVER_BUDGET, COUNTEREXAMPLE, INCONCLUSIVE, NO_SPEC)
