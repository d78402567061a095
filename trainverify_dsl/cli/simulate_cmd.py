"""``tvp simulate PLAN``: run the lowered plan on every rank and compare with the spec.

The mesh is kept; a large model is shrunk to small widths first (``simulate/shrink.py``). Both
sides run in float64 on the same random parameters, optimizer states and inputs; the result
is the largest relative error over the loss, every gradient copy and every updated parameter,
and the first tensor that differs, with the plan line responsible. ``--format json`` prints one
JSON object (``agrees``, ``max_rel_error``, ``first_difference``...).

The full-size binding and layout pass (``tvp lint --spec``) runs first: a plan with an error
there prints its diagnostics (TVP4xx, or the spec's TVP3xx) and is not simulated.
The plan's model file is imported (it runs as Python code): it must lie inside the plan's
folder, the project root or the stdlib unless ``--allow-model-outside-root`` is given (TVP310).

Before any verdict the reference step's IR is checked against eager torch
(``simulate.torch_step``); if they differ, no verdict is given (exit 2).

Exit codes: 0 the plan agrees with the spec and no error was reported, 1 it differs or has
errors, 2 usage or internal error, or no verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from trainverify_dsl.cli.lint_cmd import add_model_root_option

EXIT_AGREES = 0
EXIT_DIFFERS = 1
EXIT_USAGE = 2
#: mismatches listed in the output
SHOWN = 20


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN", help="a .tvp plan file")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--seed", type=int, default=0, help="random values' seed (default 0)")
    parser.add_argument("--no-shrink", action="store_true",
                        help="simulate at the plan's own sizes (only for small models)")
    add_model_root_option(parser)


def _span(span: Any) -> dict[str, Any] | None:
    if span is None:
        return None
    return {"file": span.file, "line": span.line, "col": span.col}


def _number(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _mismatch(m: Any) -> dict[str, Any]:
    return {"tensor": m.tensor, "rank": m.rank, "rel_error": _number(m.rel_error),
            "span": _span(m.span), "detail": m.detail}


def result_json(path: str, result: Any) -> dict[str, Any]:
    from trainverify_dsl.simulate import TOLERANCE

    return {
        "plan": path,
        "agrees": agrees(result),
        "max_rel_error": _number(result.max_rel_error),
        "tolerance": TOLERANCE,
        "ranks": result.ranks,
        "compared": result.compared,
        "sizes": result.sizes,
        "first_difference": _mismatch(result.first) if result.first else None,
        "mismatches": [_mismatch(m) for m in result.mismatches[:SHOWN]],
        "mismatch_count": len(result.mismatches),
        "lineage_mismatches": [_mismatch(m) for m in result.lineage_mismatches[:SHOWN]],
        "findings": [_diagnostic(d) for d in result.findings],
    }


def _diagnostic(d: Any) -> dict[str, Any]:
    return {"code": d.code.id, "name": d.code.name, "severity": str(d.severity),
            "message": d.message, "span": _span(d.span), "help": d.help}


def _where(span: Any) -> str:
    return f"{span.file}:{span.line}:{span.col}" if span is not None else "(no plan line)"


def _text(path: str, result: Any) -> str:
    from trainverify_dsl.simulate import TOLERANCE

    lines = []
    sizes = ", ".join(f"{k}={v}" for k, v in result.sizes.items())
    if sizes:
        lines.append(f"shrunk: {sizes}")
    for d in result.findings:
        lines.append(f"{_where(d.span)}: {d.severity}: {d.message} [{d.code.id}]")
    verdict = "agrees with the spec" if result.agrees else "DIFFERS from the spec"
    if has_errors(result):
        verdict = ("has errors and " + verdict.replace("agrees", "otherwise agrees")
                   if result.agrees else "has errors and " + verdict)
    lines.append(f"{path}: {verdict}: max relative error {result.max_rel_error:.3g} "
                 f"(tolerance {TOLERANCE:g}) over {result.compared} tensors on "
                 f"{result.ranks} ranks")
    if result.lineage_mismatches and result.first is result.lineage_mismatches[0]:
        m = result.first
        lines.append(f"  first difference: {_where(m.span)}: {m.tensor} on rank {m.rank}: "
                     f"relative error {m.rel_error:.3g} ({m.detail})")
    elif result.lineage_mismatches:
        lines.append(f"  note: {len(result.lineage_mismatches)} intermediate value(s) differ "
                     "from their derived lineage although the outputs agree")
    for m in result.mismatches[:SHOWN]:
        rank = f"rank {m.rank}" if m.rank >= 0 else "logical value"
        detail = f" ({m.detail})" if m.detail else ""
        lines.append(f"  {_where(m.span)}: {m.tensor} on {rank}: relative error "
                     f"{m.rel_error:.3g}{detail}")
    if len(result.mismatches) > SHOWN:
        lines.append(f"  ... and {len(result.mismatches) - SHOWN} more")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    import warnings

    from trainverify_dsl.cli.lint_cmd import render_diagnostics
    from trainverify_dsl.lower.diagnose import at_spec_line
    from trainverify_dsl.simulate import simulate_file
    from trainverify_dsl.simulate.setup import SimulationSetupError
    from trainverify_dsl.simulate.torch_step import ReferenceDisagrees
    from trainverify_dsl.spec.errors import SpecError

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own deprecations
    try:
        result = simulate_file(args.plan, seed=args.seed,
                               shrink=False if args.no_shrink else None,
                               allow_model_outside_root=args.allow_model_outside_root)
    except SimulationSetupError as error:
        if not error.diagnostics:
            print(f"tvp simulate: {error}", file=sys.stderr)
            return EXIT_USAGE
        sys.stdout.write(render_diagnostics(list(error.diagnostics), [args.plan], args.format))
        return EXIT_DIFFERS
    except SpecError as error:
        located = at_spec_line(list(error.diagnostics), args.plan)
        sys.stdout.write(render_diagnostics(located, [args.plan], args.format))
        return EXIT_DIFFERS
    except ReferenceDisagrees as error:  # the trusted base is wrong: no verdict at all
        print(f"tvp simulate: no verdict: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:  # noqa: BLE001 - an internal error is one line, not a traceback
        print(f"tvp simulate: internal error: {type(error).__name__}: {error}",
              file=sys.stderr)
        return EXIT_USAGE
    if args.format == "json":
        print(json.dumps(result_json(args.plan, result), indent=2))
    else:
        sys.stdout.write(_text(args.plan, result))
    return EXIT_AGREES if agrees(result) else EXIT_DIFFERS


def has_errors(result: Any) -> bool:
    from trainverify_dsl.report.diagnostics import Severity

    return any(d.severity is Severity.ERROR for d in result.findings)


def agrees(result: Any) -> bool:
    """"Agrees" only when every check held and no error was reported."""
    return bool(result.agrees) and not has_errors(result)
