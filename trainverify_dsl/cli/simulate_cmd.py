"""``tvp simulate PLAN``: run the lowered plan on every rank and compare with the spec.

The mesh is kept; a large model is shrunk to small widths first (``shrink.py``). Both
sides run in float64 on the same random parameters, optimizer states and inputs; the result
is the largest relative error over the loss, every gradient copy and every updated parameter,
and the first tensor that differs, with the plan line responsible.

The full-size binding and layout pass (``tvp lint --spec``) runs first: a plan with an error
there prints its diagnostics (TVP4xx, or the spec's TVP3xx) and is not simulated. Mesh axes
no statement uses run at size 1 (their ranks compute the same). Before anything is allocated,
the memory the simulation needs is estimated; above ``--max-memory`` (default: half of the
machine's memory) the plan is refused with TVP501 at its ``mesh`` line.
The plan's model file is imported (it runs as Python code): it must lie inside the plan's
folder, the project root or the stdlib unless ``--allow-model-outside-root`` is given (TVP310).

Before any verdict the reference step's IR is checked against eager torch
(``simulate.torch_step``); if they differ, no verdict is given (exit 2).

``--format json`` prints exactly one JSON document on stdout whatever happens, always with
the same keys (values that need a simulation are ``null``, or empty, when none ran)::

    {
      "plan": "plans/a.tvp",
      "verdict": "agrees" | "differs" | "errors" | "no-verdict" | "internal-error"
                 | "usage-error",
      "agrees": true,              # true only with verdict "agrees"
      "error": null,               # or why there is no verdict / no simulation
      "max_rel_error": 1.2e-16,    # null without a simulation (or when not finite)
      "tolerance": 1e-09,          # null without a simulation
      "ranks": 4, "compared": 25,  # null without a simulation
      "sizes": {"d_model": 8},     # the shrunk sizes; null without a simulation
      "idle_axes": {"tp": 8},      # axes no statement uses, run at size 1; null without one
      "estimated_bytes": 123456,   # the memory estimate checked (TVP501); null without one
      "first_difference": null,    # or a mismatch (below)
      "reading": null,             # how the first difference differs, when it has values
      "draw": null,                # or how the inputs compared were drawn, when a second
                                   # draw (blocks counting differently) found the difference
      "roundoff": null,            # or the largest difference (at or above the tolerance)
                                   # the reference's own float64 round-off explains
      "mismatches": [],            # at most 20 mismatches
      "mismatch_count": 0,
      "lineage_mismatches": [],
      "findings": [{"code": "TVP411", "name": ..., "severity": "error", "message": ...,
                    "span": {"file": ..., "line": ..., "col": ...} | null, "help": ... | null,
                    "notes": [...]}]
    }

A mismatch is ``{"tensor", "rank", "rel_error", "span", "detail"}``. Verdicts:

    agrees          every check held and no error was reported                       exit 0
    differs         a compared tensor differs (findings may hold errors as well)     exit 1
    errors          the plan has error diagnostics (``findings``): refused by the    exit 1
                    layout pass, a missing or unreadable plan, a broken spec model,
                    or errors reported beside a simulation that otherwise agrees
    usage-error     the plan cannot be simulated as given (no ``spec`` line, ...)    exit 2
    no-verdict      the reference step disagrees with eager torch                    exit 2
    internal-error  an unexpected exception (``error`` names it)                     exit 2

Argument errors are argparse's (exit 2, usage on stderr, nothing on stdout). Without
``--format json`` the text output is as before; every exit-2 case also prints one line on
stderr, in both formats.

Exit codes: 0 the plan agrees with the spec and no error was reported, 1 it differs or has
errors, 2 usage or internal error, or no verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from typing import Any

from trainverify_dsl.cli.lint_cmd import add_color_option, add_model_root_option, seed

EXIT_AGREES = 0
EXIT_DIFFERS = 1
EXIT_USAGE = 2
#: mismatches listed in the output
SHOWN = 20

# --- verdicts (the JSON document's ``verdict``) ---
AGREES = "agrees"
DIFFERS = "differs"
ERRORS = "errors"
USAGE_ERROR = "usage-error"
NO_VERDICT = "no-verdict"
INTERNAL_ERROR = "internal-error"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one ``tvp simulate`` run ended with, whatever happened."""

    verdict: str
    status: int
    #: the ``SimulationResult`` when a simulation ran
    result: Any = None
    #: the diagnostics that stopped the simulation (verdict ``errors`` without a result)
    refusal: tuple[Any, ...] = ()
    #: why there is no verdict or no simulation (the stderr line's text)
    error: str | None = None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN", help="a .tvp plan file")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--seed", type=seed, default=0, help="random values' seed (default 0)")
    parser.add_argument("--no-shrink", action="store_true",
                        help="simulate at the plan's own sizes (only for small models)")
    add_color_option(parser)
    add_max_memory_option(parser)
    add_model_root_option(parser)


def add_max_memory_option(parser: argparse.ArgumentParser) -> None:
    """``--max-memory SIZE`` (TVP501), shared by ``tvp simulate`` and ``tvp check``."""
    parser.add_argument("--max-memory", metavar="SIZE", type=_size, default=None,
                        help="refuse (TVP501) a plan whose simulation is estimated above SIZE "
                             "(4G, 512M; default: half of this machine's memory)")


def _size(text: str) -> int:
    from trainverify_dsl.simulate.budget import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


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
    """The JSON document of a simulation that ran (see the module docstring)."""
    return outcome_json(path, finished(result))


def outcome_json(path: str, outcome: Outcome) -> dict[str, Any]:
    """The one JSON document of a run, with the same keys whatever its verdict."""
    document: dict[str, Any] = {
        "plan": path,
        "verdict": outcome.verdict,
        "agrees": outcome.verdict == AGREES,
        "error": outcome.error,
        "max_rel_error": None, "tolerance": None, "ranks": None, "compared": None,
        "sizes": None, "idle_axes": None, "estimated_bytes": None,
        "first_difference": None, "reading": None, "draw": None, "roundoff": None,
        "mismatches": [],
        "mismatch_count": 0,
        "lineage_mismatches": [],
        "findings": [_diagnostic(d) for d in outcome.refusal],
    }
    if outcome.result is not None:
        document.update(_simulation_json(outcome.result))
    return document


def _simulation_json(result: Any) -> dict[str, Any]:
    from trainverify_dsl.simulate import TOLERANCE

    return {
        "max_rel_error": _number(result.max_rel_error),
        "tolerance": TOLERANCE,
        "ranks": result.ranks,
        "compared": result.compared,
        "sizes": result.sizes,
        "idle_axes": result.idle_axes,
        "estimated_bytes": result.estimated_bytes,
        "first_difference": _mismatch(result.first) if result.first else None,
        "reading": _reading_json(result.reading),
        "draw": result.draw or None,
        "roundoff": _number(result.roundoff) if result.roundoff else None,
        "mismatches": [_mismatch(m) for m in result.mismatches[:SHOWN]],
        "mismatch_count": len(result.mismatches),
        "lineage_mismatches": [_mismatch(m) for m in result.lineage_mismatches[:SHOWN]],
        "findings": [_diagnostic(d) for d in result.findings],
    }


def _reading_json(reading: Any) -> dict[str, Any] | None:
    if reading is None:
        return None
    return {"text": reading.text, "element": list(reading.index), "spec_value": reading.spec,
            "rank_values": [{"rank": who, "value": v} for who, v in reading.ranks]}


def _diagnostic(d: Any) -> dict[str, Any]:
    return {"code": d.code.id, "name": d.code.name, "severity": str(d.severity),
            "message": d.message, "span": _span(d.span), "help": d.help,
            "notes": list(d.notes)}


def _where(span: Any) -> str:
    return f"{span.file}:{span.line}:{span.col}" if span is not None else "(no plan line)"


def _text(path: str, result: Any, color: bool = False) -> str:
    """The simulation's text report; with ``color``, the same characters with ANSI styles
    (locations bold, severities and the verdict in their colours)."""
    from trainverify_dsl.report.render.text import Painter, code_tag, headline
    from trainverify_dsl.simulate import TOLERANCE

    paint = Painter(color)
    lines = []
    sizes = ", ".join(f"{k}={v}" for k, v in result.sizes.items())
    if sizes:
        lines.append(f"shrunk: {sizes}")
    idle = ", ".join(f"{k}={v}" for k, v in result.idle_axes.items())
    if idle:
        lines.append(f"idle axes, run at size 1 (no statement uses them; their ranks compute "
                     f"the same): {idle}")
    for d in result.findings:
        lines.append(headline(_where(d.span), str(d.severity),
                              f"{d.message} {code_tag(d.code.id, paint)}", paint))
    verdict = "agrees with the spec" if result.agrees else "DIFFERS from the spec"
    if has_errors(result):
        verdict = ("has errors and " + verdict.replace("agrees", "otherwise agrees")
                   if result.agrees else "has errors and " + verdict)
    style = "good" if agrees(result) else "bad"
    lines.append(f"{path}: {paint(verdict, style)}: max relative error "
                 f"{result.max_rel_error:.3g} (tolerance {TOLERANCE:g}) over {result.compared} "
                 f"tensors on {result.ranks} ranks")
    if result.roundoff:
        lines.append(f"  note: differences up to {result.roundoff:.3g} are the reference's "
                     "own float64 round-off (its extended-precision evaluation is as far from "
                     "its float64 one; docs/lowering.md)")
    if result.lineage_mismatches and result.first is result.lineage_mismatches[0]:
        m = result.first
        lines.append(f"  first difference: {_located(m.span, paint)} {m.tensor} on rank "
                     f"{m.rank}: relative error {m.rel_error:.3g} ({m.detail})")
    elif result.lineage_mismatches:
        lines.append(f"  note: {len(result.lineage_mismatches)} intermediate value(s) differ "
                     "from their derived lineage although the outputs agree")
    for m in result.mismatches[:SHOWN]:
        rank = f"rank {m.rank}" if m.rank >= 0 else "logical value"
        detail = f" ({m.detail})" if m.detail else ""
        lines.append(f"  {_located(m.span, paint)} {m.tensor} on {rank}: relative error "
                     f"{m.rel_error:.3g}{detail}")
    if len(result.mismatches) > SHOWN:
        lines.append(f"  ... and {len(result.mismatches) - SHOWN} more")
    if result.reading is not None:
        lines.append(f"  reading of the first difference: {result.reading.text}")
        lines.append(f"    {result.reading.values_line()}")
    if result.draw:
        lines.append(f"  the inputs compared: {result.draw} (the first draw agreed)")
    return "\n".join(lines) + "\n"


def _located(span: Any, paint: Any) -> str:
    """``file:line:col:`` (bold on a terminal)."""
    return paint(f"{_where(span)}:", "location")


def run(args: argparse.Namespace) -> int:
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own deprecations
    outcome = simulate(args)
    if outcome.status == EXIT_USAGE:
        print(_stderr_line(outcome), file=sys.stderr)
    if args.format == "json":
        print(json.dumps(outcome_json(args.plan, outcome), indent=2))
        return outcome.status
    from trainverify_dsl.cli.lint_cmd import render_diagnostics, use_color

    color = use_color(args.color, sys.stdout)
    if outcome.result is not None:
        sys.stdout.write(_text(args.plan, outcome.result, color))
    elif outcome.refusal:
        sys.stdout.write(render_diagnostics(list(outcome.refusal), [args.plan], "text",
                                            color=color))
    return outcome.status


def simulate(args: argparse.Namespace) -> Outcome:
    """Run the simulation; every way it can end is an ``Outcome``, never a raise."""
    try:
        return _simulate(args)
    except Exception as error:  # noqa: BLE001 - an internal error is a verdict, not a traceback
        return Outcome(INTERNAL_ERROR, EXIT_USAGE, error=f"{type(error).__name__}: {error}")


def _simulate(args: argparse.Namespace) -> Outcome:
    from trainverify_dsl.shrink import file_work_refusal

    refusal = file_work_refusal(args.plan)  # from the plan alone, before torch is imported
    if refusal is not None:
        return refused([refusal])
    from trainverify_dsl.api import SimulationSetupError, at_spec_line, simulate_file
    from trainverify_dsl.cli.progress import phases
    from trainverify_dsl.simulate.torch_step import ReferenceDisagrees
    from trainverify_dsl.spec.errors import SpecError

    try:
        with phases(args.format == "text") as progress:
            result = simulate_file(args.plan, seed=args.seed,
                                   shrink=False if args.no_shrink else None,
                                   allow_model_outside_root=args.allow_model_outside_root,
                                   max_memory=args.max_memory, progress=progress)
    except SimulationSetupError as error:
        if not error.diagnostics:
            return Outcome(USAGE_ERROR, EXIT_USAGE, error=str(error))
        return refused(error.diagnostics)
    except SpecError as error:
        return refused(at_spec_line(list(error.diagnostics), args.plan))
    except ReferenceDisagrees as error:  # the trusted base is wrong: no verdict at all
        return Outcome(NO_VERDICT, EXIT_USAGE, error=str(error))
    return finished(result)


def refused(diagnostics: Any) -> Outcome:
    """Not simulated: the plan (or its spec) has errors, which ``diagnostics`` hold."""
    from trainverify_dsl.report.diagnostics import Severity

    errors = sum(1 for d in diagnostics if d.severity is Severity.ERROR)
    return Outcome(ERRORS, EXIT_DIFFERS, refusal=tuple(diagnostics),
                   error=f"not simulated: {errors} error(s) in the plan or its spec")


def finished(result: Any) -> Outcome:
    """A simulation that ran: agrees, differs, or agrees beside reported errors."""
    if agrees(result):
        return Outcome(AGREES, EXIT_AGREES, result)
    return Outcome(DIFFERS if not result.agrees else ERRORS, EXIT_DIFFERS, result)


def _stderr_line(outcome: Outcome) -> str:
    prefix = {NO_VERDICT: "no verdict: ", INTERNAL_ERROR: "internal error: "}
    return f"tvp simulate: {prefix.get(outcome.verdict, '')}{outcome.error}"


def has_errors(result: Any) -> bool:
    from trainverify_dsl.report.diagnostics import Severity

    return any(d.severity is Severity.ERROR for d in result.findings)


def agrees(result: Any) -> bool:
    """"Agrees" only when every check held and no error was reported."""
    return bool(result.agrees) and not has_errors(result)
