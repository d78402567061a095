"""``tvp check PLAN...``: prove that each plan computes the spec's training step.

For each plan: the full-size layout pass, the shrunk programs (as ``tvp simulate``), a
numeric pre-check of both programs on random values (a difference there is a confirmed
counterexample, reported at its plan line), then the proof: both programs on symbols, every
check of ``ir/compare.py`` compared in exact normal form, what normalisation leaves to z3
(``check/``). Verdicts and exit codes (the worst plan decides the exit code):

    verified        every obligation proven                                      exit 0
    counterexample  both programs evaluated numerically differ                   exit 1
    error           the plan has errors (diagnostics)                            exit 1
                    usage or internal error (no diagnostics)                     exit 2
    inconclusive    neither proven nor refuted (the reason says why)             exit 3

Every verdict lists the assumptions it rests on (real arithmetic, uninterpreted functions,
the shrunk sizes, the drawn integer inputs). ``--format json`` prints one document::

    {"verdict": ..., "exit_code": ..., "stages_total": ..., "stages_unique": ...,
     "stages_proven": ..., "seconds": ..., "assumptions": [...], "diagnostics": [...],
     "counterexample": {...} | null, "plans": [<one such document per plan, with "plan",
     "reason", "elements", "by_normal_form", "by_expansion", "by_solver", "sizes",
     "idle_axes", "reduced_axes", "open">]}

``--format sarif|github`` print the diagnostics, a counterexample (TVP502) and an
inconclusive verdict (TVP503) at their plan lines. Progress shows on a terminal only.

``-`` as a plan reads it from stdin (a generator piping its plans: ``gen | tvp check -``):
its ``spec`` and ``use`` paths resolve from the current folder, and its verdict and lines
are called ``<stdin>``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from trainverify_dsl.cli.lint_cmd import (
    add_color_option,
    add_model_root_option,
    positive_int,
    seed,
)
from trainverify_dsl.cli.simulate_cmd import _where, add_max_memory_option

#: the order of badness: the worst verdict decides the exit code
_WORST = {"verified": 0, "inconclusive": 1, "counterexample": 2, "error": 3}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plans", metavar="PLAN", nargs="+",
                        help=".tvp plan files, or - for a plan on stdin (its spec path "
                             "relative to the current folder)")
    parser.add_argument("--format", choices=("text", "json", "sarif", "github"), default="text")
    parser.add_argument("--seed", type=seed, default=0,
                        help="seed of the random values of the numeric pre-check (default 0)")
    parser.add_argument("--timeout", type=_positive_seconds, default=20.0, metavar="S",
                        help="seconds for each solver call (default 20); a timeout is "
                             "inconclusive, never verified")
    parser.add_argument("--time-limit", type=_seconds, default=600.0, metavar="S",
                        help="seconds for each plan (default 600; 0: no limit); the proof "
                             "stops there and the verdict is inconclusive")
    parser.add_argument("--jobs", "-j", type=positive_int, default=1, metavar="N",
                        help="check up to N plans at once, each in its own process (default "
                             "1)")
    parser.add_argument("--executor", type=_executor, default="local", metavar="E",
                        help="where the plans are checked: local (default; --jobs processes "
                             "here), ray (a local Ray instance started for the run) or "
                             "ray://HOST:PORT (a Ray cluster whose workers see the plans at "
                             "the same paths); Ray is an extra: pip install "
                             "'trainverify_dsl[ray]'")
    parser.add_argument("--no-cache", dest="cache", action="store_false",
                        help="neither read nor write the proof cache")
    parser.add_argument("--cache-dir", metavar="DIR", default=None,
                        help="the proof cache's folder (default $TVP_CACHE_DIR, else "
                             "~/.cache/trainverify_dsl/proofs)")
    add_color_option(parser)
    add_max_memory_option(parser)
    add_model_root_option(parser)


def _executor(text: str) -> str:
    if text in ("local", "ray") or (text.startswith("ray://") and len(text) > len("ray://")):
        return text
    raise argparse.ArgumentTypeError(f"not an executor: {text!r} (local, ray or ray://ADDR)")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


def check_one(path: str, args: argparse.Namespace, progress: Any) -> Any:
    """The verdict of one plan; an unexpected exception is an ``error`` verdict."""
    from trainverify_dsl.check.verdict import ERROR, Verdict, refused
    from trainverify_dsl.shrink import file_work_refusal

    try:
        refusal = file_work_refusal(path)  # from the plan alone, before torch is imported
        if refusal is not None:
            return refused(path, [refusal])
        from trainverify_dsl.api import check_file
        from trainverify_dsl.cli.progress import model_output_to_stderr

        with model_output_to_stderr():  # also in a pool's or Ray's worker process
            return check_file(path, seed=args.seed, timeout=args.timeout,
                              allow_model_outside_root=args.allow_model_outside_root,
                              max_memory=args.max_memory, progress=progress,
                              time_limit=args.time_limit or None, cache=args.cache,
                              cache_dir=args.cache_dir)
    except Exception as error:  # noqa: BLE001 - an internal error is a verdict, not a traceback
        return Verdict(ERROR, path, reason=f"internal error: {type(error).__name__}: {error}")


#: the plan argument that reads the plan from stdin, and what its verdict calls it
STDIN, STDIN_NAME = "-", "<stdin>"


def run(args: argparse.Namespace) -> int:
    """Every plan checked; ``-`` is the plan text on stdin, written to a hidden file in
    the current folder for the run (so its ``spec`` path resolves from there, and every
    executor reads it as a path) and named ``<stdin>`` in the verdict."""
    import os
    import tempfile

    if args.plans.count(STDIN) > 1:
        print("tvp check: - (stdin) may be given once", file=sys.stderr)
        return 2
    if STDIN not in args.plans:
        return _run(args)
    handle, name = tempfile.mkstemp(suffix=".tvp", prefix=".tvp-stdin-", dir=os.getcwd())
    try:
        with os.fdopen(handle, "wb") as f:  # the bytes as given: encoding errors are TVP109
            f.write(sys.stdin.buffer.read())
        args.plans = [name if p == STDIN else p for p in args.plans]
        return _run(args, {name: STDIN_NAME})
    finally:
        Path(name).unlink(missing_ok=True)


def _run(args: argparse.Namespace, renamed: dict[str, str] | None = None) -> int:
    import warnings

    from trainverify_dsl.cli.progress import phases

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own deprecations
    if args.executor != "local":
        try:
            import ray  # noqa: F401
        except ImportError:
            print("tvp check: --executor ray needs Ray, an optional extra: pip install "
                  "'trainverify_dsl[ray]'", file=sys.stderr)
            return 2
    with phases(args.format == "text") as show:
        if args.executor != "local":
            verdicts = check_ray(args, show)
        elif args.jobs > 1 and len(args.plans) > 1:
            verdicts = check_parallel(args, show)
        else:
            verdicts = [check_one(path, args, lambda phase, p=path: show(f"{p}: {phase}"))
                        for path in args.plans]
    if renamed:
        from trainverify_dsl.api import rename_plan

        for old_name, new_name in renamed.items():
            verdicts = [rename_plan(v, old_name, new_name) for v in verdicts]
        args.plans = [renamed.get(p, p) for p in args.plans]
    worst = max(verdicts, key=lambda v: (_WORST[v.verdict], v.exit_code))
    for v in verdicts:
        if v.exit_code == 2:
            print(f"tvp check: {v.plan}: {v.reason}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(document(verdicts), indent=2))
    elif args.format == "text":
        from trainverify_dsl.cli.lint_cmd import use_color

        color = use_color(args.color, sys.stdout)
        sys.stdout.write("".join(text(v, color) for v in verdicts))
        if len(verdicts) > 1:
            summary(verdicts, color)
    else:
        from trainverify_dsl.cli.lint_cmd import render_diagnostics
        from trainverify_dsl.report.render import InternalError

        found = [d for v in verdicts for d in diagnostics(v)]
        # a plan the check could not handle (exit 2) is a failure, never a clean file
        failures = [InternalError(v.plan, v.reason) for v in verdicts if v.exit_code == 2]
        sys.stdout.write(render_diagnostics(found, list(args.plans), args.format,
                                            failures=failures))
    return worst.exit_code


def _job(path: str, options: dict[str, Any]) -> Any:
    """One plan in a worker process: the job is plain data (a path and the options)."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    return check_one(path, argparse.Namespace(**options), lambda phase: None)


def check_parallel(args: argparse.Namespace, show: Any) -> list[Any]:
    """Every plan in a pool of ``args.jobs`` processes (spawned: each imports torch on its
    own); verdicts in the order the plans were given. A worker that dies is an ``error``
    verdict for its plan."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from trainverify_dsl.check.verdict import ERROR, Verdict

    options = {k: v for k, v in vars(args).items() if k != "handler"}
    plans = list(args.plans)
    verdicts: list[Any] = [None] * len(plans)
    workers = min(args.jobs, len(plans))
    show(f"checking {len(plans)} plans in {workers} processes")
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_job, path, options): k for k, path in enumerate(plans)}
        for done, future in enumerate(as_completed(futures), 1):
            k = futures[future]
            try:
                verdicts[k] = future.result()
            except Exception as error:  # noqa: BLE001 - a lost worker is a verdict
                verdicts[k] = Verdict(ERROR, plans[k], reason=f"internal error: the worker "
                                      f"checking it failed: {type(error).__name__}: {error}")
            show(f"{done}/{len(plans)} plans checked ({plans[k]}: {verdicts[k].verdict})")
    return verdicts


def _last_line(error: BaseException) -> str:
    """The last line of an exception's text (Ray's errors carry a remote traceback)."""
    return (str(error).strip().splitlines() or [""])[-1]


def _ray_job(path: str, options: dict[str, Any], folder: str) -> Any:
    """One plan on a Ray worker: in the driver's folder (relative plan paths, spec paths)."""
    import os

    os.chdir(folder)
    return _job(path, options)


def check_ray(args: argparse.Namespace, show: Any) -> list[Any]:
    """Every plan as a Ray task running the same job as a local worker (``_job``: a path
    and the options, plain data); verdicts in the order given. ``--executor ray`` starts a
    local Ray instance for the run (as many CPUs as ``--jobs``) and stops it after;
    ``ray://ADDR`` connects to a cluster, whose workers must see the plans and their spec
    models at the same paths. A task that fails is an ``error`` verdict for its plan."""
    import logging
    import os

    import ray

    from trainverify_dsl.check.verdict import ERROR, Verdict

    options = {k: v for k, v in vars(args).items() if k != "handler"}
    if options.get("cache_dir") is None and os.environ.get("TVP_CACHE_DIR"):
        options["cache_dir"] = os.environ["TVP_CACHE_DIR"]
    plans = list(args.plans)
    started = not ray.is_initialized()
    if started:
        address = None if args.executor == "ray" else args.executor
        # Ray's own log lines would add to the output (nothing extra when piped or in JSON)
        kwargs: dict[str, Any] = {"address": address, "log_to_driver": False,
                                  "logging_level": logging.ERROR}
        if address is None:
            kwargs.update(num_cpus=args.jobs, include_dashboard=False)
        try:
            ray.init(**kwargs)
        except Exception as error:  # noqa: BLE001 - no cluster, no client extra: every plan says so
            reason = (f"not checked: Ray could not start or connect ({args.executor}): "
                      f"{type(error).__name__}: {_last_line(error)}")
            return [Verdict(ERROR, path, reason=reason) for path in plans]
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(_ray_job)
        refs = [task.remote(path, options, os.getcwd()) for path in plans]
        show(f"checking {len(plans)} plans on Ray")
        verdicts: list[Any] = []
        for k, ref in enumerate(refs):
            try:
                verdicts.append(ray.get(ref))
            except Exception as error:  # noqa: BLE001 - a lost task is a verdict
                verdicts.append(Verdict(ERROR, plans[k], reason=f"internal error: the Ray "
                                        f"task checking it failed: {type(error).__name__}: "
                                        f"{_last_line(error)}"))
            show(f"{k + 1}/{len(plans)} plans checked ({plans[k]}: {verdicts[-1].verdict})")
    finally:
        if started:
            ray.shutdown()
    return verdicts


# -- documents -----------------------------------------------------------------------------------


def _span(span: Any) -> dict[str, Any]:
    if span is None:
        return {"file": None, "line": None, "col": None}
    return {"file": span.file, "line": span.line, "col": span.col}


def _diagnostic(d: Any) -> dict[str, Any]:
    return {"code": d.code.id, "severity": str(d.severity), "message": d.message,
            **_span(d.span)}


def _counterexample(c: Any) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"check": c.check, "tensor": c.tensor, "rank": c.rank,
            "rel_error": c.rel_error if math.isfinite(c.rel_error) else None,
            "detail": c.detail, "seed": c.seed, "inputs": c.inputs, **_span(c.span),
            "reading": c.reading or None, "element": list(c.index) if c.reading else None,
            "spec_value": c.spec_value,
            "rank_values": [{"rank": who, "value": v} for who, v in c.rank_values]}


def plan_document(v: Any) -> dict[str, Any]:
    return {"plan": v.plan, "verdict": v.verdict, "exit_code": v.exit_code,
            "reason": v.reason, "stages_total": v.stages_total,
            "stages_unique": v.stages_unique, "stages_proven": v.stages_proven,
            "seconds": round(v.seconds, 3), "cached": v.cached, "elements": v.elements,
            "by_normal_form": v.by_normal_form, "by_expansion": v.by_expansion,
            "by_solver": v.by_solver, "notes": v.notes,
            "assumptions": v.assumptions, "sizes": v.sizes, "idle_axes": v.idle_axes,
            "reduced_axes": v.reduced_axes,
            "diagnostics": [_diagnostic(d) for d in v.diagnostics],
            "counterexample": _counterexample(v.counterexample),
            "open": [{"where": w, "reason": r} for w, r in v.open]}


def document(verdicts: list[Any]) -> dict[str, Any]:
    """One JSON document for the run, the same keys whatever happened."""
    plans = [plan_document(v) for v in verdicts]
    worst = max(verdicts, key=lambda v: (_WORST[v.verdict], v.exit_code))
    first_cex = next((p["counterexample"] for p in plans if p["counterexample"]), None)
    assumptions = list(dict.fromkeys(a for v in verdicts for a in v.assumptions))
    return {"verdict": worst.verdict, "exit_code": worst.exit_code,
            "stages_total": sum(v.stages_total for v in verdicts),
            "stages_unique": sum(v.stages_unique for v in verdicts),
            "stages_proven": sum(v.stages_proven for v in verdicts),
            "seconds": round(sum(v.seconds for v in verdicts), 3),
            "assumptions": assumptions,
            "diagnostics": [d for p in plans for d in p["diagnostics"]],
            "counterexample": first_cex, "plans": plans}


def diagnostics(v: Any) -> list[Any]:
    """The verdict as diagnostics: the plan's own, then TVP502/TVP503 at their lines."""
    from trainverify_dsl.report.codes_run import COUNTEREXAMPLE, INCONCLUSIVE
    from trainverify_dsl.report.diagnostics import Diagnostic
    from trainverify_dsl.report.span import Span

    found = list(v.diagnostics)
    whole = Span(v.plan, 1, 1, 1, 1)
    c = v.counterexample
    if c is not None:
        notes = (f"found by the check `{c.check}`",)
        if c.reading:
            notes += (c.reading, _values_line(c))
        found.append(Diagnostic(COUNTEREXAMPLE, _reading(c), c.span or whole, notes))
    elif v.verdict == "inconclusive":
        found.append(Diagnostic(INCONCLUSIVE, v.reason, whole,
                                tuple(f"{w}: {r}" for w, r in v.open[:5])))
    return found


def _values_line(c: Any) -> str:
    from trainverify_dsl.ir.reading import Reading

    return Reading(c.reading, c.index, c.spec_value, c.rank_values).values_line()


def _reading(c: Any) -> str:
    rank = f"on rank {c.rank}" if c.rank >= 0 else "(the logical value)"
    error = f"relative error {c.rel_error:.3g}" if math.isfinite(c.rel_error) else c.detail
    detail = f" ({c.detail})" if c.detail and math.isfinite(c.rel_error) else ""
    return f"{c.tensor} {rank} differs from the spec: {error}{detail}"


def text(v: Any, color: bool = False) -> str:
    """The verdict of one plan as text; with ``color``, the same characters with ANSI styles
    (locations bold, severities and the verdict word in their colours)."""
    from trainverify_dsl.report.render.text import Painter, code_tag, headline

    paint = Painter(color)
    lines = [headline(_where(d.span), str(d.severity), f"{d.message} {code_tag(d.code.id, paint)}",
                      paint) for d in v.diagnostics]
    head = {"verified": "VERIFIED", "counterexample": "COUNTEREXAMPLE",
            "inconclusive": "INCONCLUSIVE", "error": "ERROR"}[v.verdict]
    lines.append(f"{v.plan}: {paint(head, VERDICT_STYLES[v.verdict])} ({v.seconds:.1f} s): "
                 f"{v.reason}")
    c = v.counterexample
    if c is not None:
        lines.append(f"  {paint(_where(c.span) + ':', 'location')} {_reading(c)}")
        if c.reading:
            lines.append(f"    reading: {c.reading}")
            lines.append(f"    {_values_line(c)}")
    for where, reason in v.open[:5]:
        lines.append(f"  {paint('not proven:', 'doubt')} {where}: {reason}")
    if len(v.open) > 5:
        lines.append(f"  ... and {len(v.open) - 5} more")
    lines += [f"  note: {note}" for note in v.notes]
    if v.assumptions and v.verdict in ("verified", "inconclusive"):
        lines.append("  assumptions:")
        lines += [f"    - {a}" for a in v.assumptions]
    return "\n".join(lines) + "\n"


#: the style of each verdict on a terminal (report/render/text.py's styles)
VERDICT_STYLES = {"verified": "good", "counterexample": "bad", "inconclusive": "doubt",
                  "error": "bad"}
#: the same in rich's words, for the summary table
_RICH_STYLES = {"good": "bold green", "bad": "bold red", "doubt": "bold yellow"}


def summary(verdicts: list[Any], color: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="tvp check")
    for column in ("plan", "verdict", "seconds", "elements", "normal form", "expanded", "z3"):
        table.add_column(column, justify="left" if column in ("plan", "verdict") else "right")
    for v in verdicts:
        verdict = Text(v.verdict, style=_RICH_STYLES[VERDICT_STYLES[v.verdict]])
        table.add_row(Text(v.plan), verdict, f"{v.seconds:.1f}", f"{v.elements:,}",
                      f"{v.by_normal_form:,}", f"{v.by_expansion:,}", f"{v.by_solver:,}")
    Console(file=sys.stdout, width=120, color_system="standard" if color else None,
            force_terminal=color).print(table)
