"""``tvp run-distributed PLAN``: run a small plan as a real gloo training step and compare it
with the single-device torch step (``trainverify_dsl.oracle``, docs/oracle.md).

One process per rank (at most 8). Prints the verdict, the largest relative error and every
tensor that differs (first in program order).

Exit codes: 0 the plan agrees with single-device torch, 1 it differs (or cannot be lowered,
or its spec has errors, or its layout pass reports errors), 2 usage error or a plan the
oracle cannot run.

``--format json`` prints exactly one JSON document on stdout whatever happens, with the same
keys every time (values that need a run are ``null``, or empty, when none ran)::

    {
      "plan": "plans/a.tvp",
      "verdict": "agrees" | "rejected" | "differs" | "errors" | "not-run",
      "agrees": true,              # true only with verdict "agrees"
      "error": null,               # or why the plan did not run
      "max_rel_error": 1.2e-16,    # null without a run (or when not finite)
      "tolerance": 1e-09,          # null without a run
      "ranks": 4, "compared": 25,  # null without a run
      "seconds": 3.1,              # null without a run
      "draw": null,                # or how the inputs compared were drawn (a second draw)
      "layout_errors": [],         # the full-size layout pass's errors ("rejected")
      "differences": [{"tensor": "grad(fc1.weight)", "rank": 0, "rel_error": 0.5}],
      "difference_count": 1,       # the list holds at most 20
      "findings": []               # the spec's diagnostics (verdict "errors")
    }

Verdicts: ``agrees`` (exit 0); ``rejected``: the values agree but the layout pass reports
errors, ``differs``, ``errors``: the plan has errors (syntax, names, the layout pass's when
they stop it), cannot be lowered or its spec has errors (exit 1);
``not-run``: a plan the oracle cannot run (more than 8 ranks, no spec line, ...) (exit 2).
Argument errors are argparse's (exit 2, usage on stderr, nothing on stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any

from trainverify_dsl.cli.lint_cmd import add_model_root_option, seed
from trainverify_dsl.report.diagnostics import Severity

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
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text (default) or one JSON document on stdout")
    add_model_root_option(parser)


def _document(plan: str, verdict: str, error: str | None = None, result: Any = None,
              findings: list[Any] | None = None) -> dict[str, Any]:
    """The one JSON document of a run (see the module docstring)."""
    from trainverify_dsl.cli.simulate_cmd import _diagnostic, _number
    from trainverify_dsl.oracle.run import TOLERANCE

    document: dict[str, Any] = {
        "plan": plan, "verdict": verdict, "agrees": verdict == "agrees", "error": error,
        "max_rel_error": None, "tolerance": None, "ranks": None, "compared": None,
        "seconds": None, "draw": None, "layout_errors": [], "differences": [],
        "difference_count": 0, "findings": [_diagnostic(d) for d in findings or ()]}
    if result is not None:
        document.update({
            "max_rel_error": _number(result.max_rel_error), "tolerance": TOLERANCE,
            "ranks": result.ranks, "compared": result.compared,
            "seconds": round(result.seconds, 3), "draw": result.draw or None,
            "layout_errors": list(result.layout_errors),
            "differences": [{"tensor": d.tensor, "rank": d.rank,
                             "rel_error": _number(d.rel_error)}
                            for d in result.differences[:SHOWN]],
            "difference_count": len(result.differences)})
    return document


def _verdict(result: Any) -> str:
    return "agrees" if result.agrees else "rejected" if result.values_agree else "differs"


def run(args: argparse.Namespace) -> int:
    from trainverify_dsl.api import SimulationSetupError, at_spec_line
    from trainverify_dsl.lower.findings import LoweringError
    from trainverify_dsl.oracle import OracleError, run_distributed
    from trainverify_dsl.spec.errors import SpecError

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own deprecations
    as_json = args.format == "json"

    def emit(document: dict[str, Any]) -> None:
        print(json.dumps(document, indent=2))

    try:
        result = run_distributed(args.plan, seed=args.seed, timeout=args.timeout,
                                 allow_model_outside_root=args.allow_model_outside_root)
    except LoweringError as error:  # located at the plan's statements, as tvp lint --spec
        from trainverify_dsl.cli.lint_cmd import render_diagnostics
        from trainverify_dsl.lower.diagnose import to_diagnostic
        from trainverify_dsl.report.span import Span

        fallback = Span(str(args.plan), 1, 1, 1, 1)
        found = [to_diagnostic(f, fallback) for f in error.findings]
        if as_json:
            emit(_document(args.plan, "errors", f"cannot be lowered: {error}", findings=found))
        else:
            files = sorted({d.span.file for d in found if d.span is not None}) or [args.plan]
            sys.stdout.write(render_diagnostics(found, files, "text"))
            print(f"{args.plan}: cannot be lowered: {error}")
        return EXIT_DIFFERS
    except SpecError as error:  # the spec line or the model: located, like tvp simulate's
        from trainverify_dsl.cli.lint_cmd import render_diagnostics

        found = at_spec_line(list(error.diagnostics), args.plan)
        if as_json:
            emit(_document(args.plan, "errors", "the spec has errors", findings=found))
            return EXIT_DIFFERS
        sys.stdout.write(render_diagnostics(found, [args.plan], "text"))
        print(f"{args.plan}: not run: the spec has errors")
        return EXIT_DIFFERS
    except (OracleError, SimulationSetupError) as error:
        found = list(getattr(error, "diagnostics", ()) or ())
        if any(d.severity is Severity.ERROR for d in found):  # the plan has errors: exit 1
            from trainverify_dsl.cli.lint_cmd import render_diagnostics

            if as_json:
                emit(_document(args.plan, "errors", "the plan has errors", findings=found))
                return EXIT_DIFFERS
            files = sorted({d.span.file for d in found if d.span is not None}) or [args.plan]
            sys.stdout.write(render_diagnostics(found, files, "text"))
            print(f"{args.plan}: not run: the plan has errors")
            return EXIT_DIFFERS
        if as_json:
            emit(_document(args.plan, "not-run", str(error),
                           findings=list(getattr(error, "diagnostics", ()) or ())))
        print(f"tvp run-distributed: {error}", file=sys.stderr)
        return EXIT_USAGE
    if as_json:  # (a run that failed raised OracleError above)
        emit(_document(args.plan, _verdict(result), result=result))
        return EXIT_AGREES if result.agrees else EXIT_DIFFERS
    print(result.summary())
    for d in result.differences[:SHOWN]:
        where = "" if d.rank < 0 else f" on rank {d.rank}"
        print(f"  {d.tensor}{where}: relative error {d.rel_error:.3g}")
    if len(result.differences) > SHOWN:
        print(f"  ... and {len(result.differences) - SHOWN} more")
    return EXIT_AGREES if result.agrees else EXIT_DIFFERS
