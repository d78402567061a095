"""``tvp run-distributed PLAN``: run a small plan as a real gloo training step and compare it
with the single-device torch step (``trainverify_dsl.oracle``, docs/oracle.md).

One process per rank (at most 8). Prints the verdict, the largest relative error and every
tensor that differs (first in program order).

Exit codes: 0 the plan agrees with single-device torch, 1 it differs (or cannot be lowered,
or its spec has errors), 2 usage error or a plan the oracle cannot run.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from trainverify_dsl.cli.lint_cmd import add_model_root_option, seed

EXIT_AGREES = 0
EXIT_DIFFERS = 1
EXIT_USAGE = 2
#: differences listed in the output
SHOWN = 20


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN", help="a .tvp plan file (at most 8 ranks)")
    parser.add_argument("--seed", type=seed, default=0, help="random values' seed (default 0)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds before the rank processes are killed (default 120)")
    add_model_root_option(parser)


def run(args: argparse.Namespace) -> int:
    from trainverify_dsl.api import SimulationSetupError, at_spec_line
    from trainverify_dsl.lower.findings import LoweringError
    from trainverify_dsl.oracle import OracleError, run_distributed
    from trainverify_dsl.spec.errors import SpecError

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own deprecations
    try:
        result = run_distributed(args.plan, seed=args.seed, timeout=args.timeout,
                                 allow_model_outside_root=args.allow_model_outside_root)
    except LoweringError as error:
        print(f"{args.plan}: cannot be lowered: {error}")
        return EXIT_DIFFERS
    except SpecError as error:  # the spec line or the model: located, like tvp simulate's
        from trainverify_dsl.cli.lint_cmd import render_diagnostics

        sys.stdout.write(render_diagnostics(at_spec_line(list(error.diagnostics), args.plan),
                                            [args.plan], "text"))
        print(f"{args.plan}: not run: the spec has errors")
        return EXIT_DIFFERS
    except (OracleError, SimulationSetupError) as error:
        print(f"tvp run-distributed: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(result.summary())
    for d in result.differences[:SHOWN]:
        where = "" if d.rank < 0 else f" on rank {d.rank}"
        print(f"  {d.tensor}{where}: relative error {d.rel_error:.3g}")
    if len(result.differences) > SHOWN:
        print(f"  ... and {len(result.differences) - SHOWN} more")
    return EXIT_AGREES if result.agrees else EXIT_DIFFERS
