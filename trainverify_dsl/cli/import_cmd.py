"""``tvp import FORMAT FILE [-o PLAN.tvp] --config NAME --seq N [options]``: write the plan
of a foreign parallel plan (docs/importers.md).

Formats: ``hf`` (Hugging Face ``base_model_tp_plan`` / ``base_model_pp_plan``),
``torchtitan`` (a ``parallelize_module`` plan), ``galvatron`` (a hybrid-parallel strategy
JSON), ``nnscaler`` (an AutoDist plan JSON with ``--ops``). The foreign file is read as data,
never run. What it does not state comes from the options; one a format needs and the command
line lacks is a usage error, never a default in disguise.

The plan is printed on stdout, or written to ``-o`` (an existing file only with ``--force``),
in canonical form and lint-clean (``tvp lint``; ``tvp lint --spec`` then runs the layout pass).
A foreign plan that cannot be written faithfully is refused: ``FILE:LINE:COL: error: ...
[TVP6xx]`` on stderr for every reason found, nothing written.

Exit codes: 0 written; 1 refused (TVP6xx diagnostics); 2 usage error, or an internal error
(the generated plan would not lint: a bug in the importer, reported with its diagnostics).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from trainverify_dsl.cli.lint_cmd import positive_int

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2

#: CLI spelling of each ImportOptions field a format may require.
OPTION_FLAGS = {"batch": "--batch", "mesh": "--mesh", "ops": "--ops"}


def configure(parser: argparse.ArgumentParser) -> None:
    from trainverify_dsl.importers import FORMATS

    parser.add_argument("format", choices=sorted(FORMATS), metavar="FORMAT",
                        help="; ".join(f"{name}: {f.summary}" for name, f in FORMATS.items()))
    parser.add_argument("file", metavar="FILE", help="the foreign plan (.json, or .py)")
    parser.add_argument("-o", "--output", metavar="PLAN.tvp",
                        help="write the plan here (default: stdout)")
    parser.add_argument("--force", action="store_true", help="replace an existing -o file")
    parser.add_argument("--config", required=True,
                        help="the reference model's config (stdlib/models/configs.json)")
    parser.add_argument("--spec", metavar="FILE:CLASS",
                        help="the spec model; must be the config's (default: the config's)")
    parser.add_argument("--seq", type=positive_int, required=True, help="sequence length")
    parser.add_argument("--batch", type=positive_int, help="global batch size")
    parser.add_argument("--mesh", type=_mesh, metavar="AXIS=N,...",
                        help="mesh axes outermost first, from pp, dp, tp (e.g. dp=2,tp=2)")
    parser.add_argument("--microbatches", type=positive_int, help="microbatches (default 1)")
    parser.add_argument("--schedule", choices=("gpipe", "1f1b"),
                        help="pipeline schedule (with --microbatches)")
    parser.add_argument("--optimizer", metavar='"KIND K=V..."',
                        help="the optimizer, e.g. 'sgd lr=0.01'; also the reference step's "
                             "recipe (default: none, the plan checks loss and gradients)")
    parser.add_argument("--name", help="plan name (default: the output or input file name)")
    parser.add_argument("--pp-division", type=_division, metavar="N,N,...",
                        help="layers per pipeline stage (hf, torchtitan; default: equal)")
    parser.add_argument("--loss-parallel", action=argparse.BooleanOptionalAction,
                        help="torchtitan: whether the loss runs under loss_parallel()")
    parser.add_argument("--world-size", type=positive_int, help="galvatron: number of devices")
    parser.add_argument("--sequence-parallel", action="store_true",
                        help="galvatron: Megatron sequence parallelism was on")
    parser.add_argument("--ops", metavar="OPS.json",
                        help="nnscaler: the operator table (cid -> signature, module)")


def run(args: argparse.Namespace) -> int:
    from trainverify_dsl.importers import FORMATS, import_file

    options = _options(args)
    if options is None:
        return EXIT_USAGE
    missing = [OPTION_FLAGS[f] for f in FORMATS[args.format].required
               if getattr(options, f) is None]
    if missing:
        print(f"tvp import {args.format}: {', '.join(missing)} required (the format does "
              "not state it)", file=sys.stderr)
        return EXIT_USAGE
    if args.output and Path(args.output).exists() and not args.force:
        print(f"tvp import: {args.output} exists; --force replaces it", file=sys.stderr)
        return EXIT_USAGE
    display = args.output or "<stdout>"
    try:
        result = import_file(args.format, args.file, options, display)
    except Exception as error:  # an importer bug must not print a traceback
        print(f"tvp import: internal error while importing {args.file}: "
              f"{type(error).__name__}: {error} (please report this input)", file=sys.stderr)
        return EXIT_USAGE
    if result.refusals:
        return _refused(args.file, result.refusals)
    if result.text is None:
        return _internal(args, result.internal, result.draft_text)
    return _write(args.output, result.text)


def _options(args: argparse.Namespace):  # -> ImportOptions | None
    from trainverify_dsl.importers import ImportOptions, UnknownConfig, load_config

    try:
        config = load_config(args.config)
    except UnknownConfig as error:
        print(f"tvp import: {error}", file=sys.stderr)
        return None
    if args.spec and args.spec != config.model.spec:
        print(f"tvp import: --spec {args.spec} is not the model of config {config.name} "
              f"({config.model.spec})", file=sys.stderr)
        return None
    if args.name is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", args.name):
        print(f"tvp import: --name '{args.name}' is not a plan name ([A-Za-z_][A-Za-z0-9_]*)",
              file=sys.stderr)
        return None
    problem = _optimizer_problem(args.optimizer)
    if problem:
        print(f"tvp import: --optimizer {problem}", file=sys.stderr)
        return None
    name = args.name or (Path(args.output).stem if args.output else None)
    return ImportOptions(
        config=config, seq=args.seq, batch=args.batch, mesh=args.mesh,
        microbatches=args.microbatches, schedule=args.schedule, optimizer=args.optimizer,
        name=name, pp_division=args.pp_division, loss_parallel=args.loss_parallel,
        world_size=args.world_size, sequence_parallel=args.sequence_parallel, ops=args.ops)


def _optimizer_problem(text: str | None) -> str | None:
    """Why ``text`` is not an optimizer statement's body (``sgd lr=0.01``), or ``None``."""
    if text is None:
        return None
    if re.search(r"\bshard\b", text):
        return "takes no 'shard over': the importer states the sharding the format implies"
    if any(c in text for c in "\n\r#") or not text.isprintable():
        return f"{text!r} is not one optimizer: no line breaks, comments or control characters"
    from trainverify_dsl.plan.resolve import resolve_source
    from trainverify_dsl.report.diagnostics import Severity

    # resolved as a plan's statement: the kind and every hyper-parameter checked, not the
    # syntax alone (`bogus`, `lr=x` made an unlintable plan, reported as an internal error)
    resolved = resolve_source(f"plan p\nmesh dp=1\noptimizer {text}\n", "--optimizer")
    found = [d for d in resolved.diagnostics
             if d.severity is Severity.ERROR and d.span.line == 3]
    if found:
        return f"'{text}' is not an optimizer: {found[0].message}"
    return None


def _refused(file: str, diagnostics) -> int:
    from trainverify_dsl.report.render import FileSources, plural
    from trainverify_dsl.report.render.text import render_diagnostic

    sources = FileSources()
    for diagnostic in diagnostics:
        sys.stderr.write(render_diagnostic(diagnostic, sources, color=False))
    print(f"tvp import: {file} refused ({plural(len(diagnostics), 'reason')}); nothing "
          "written", file=sys.stderr)
    return EXIT_REFUSED


def _internal(args: argparse.Namespace, problems, draft_text: str) -> int:
    from trainverify_dsl.report.render.text import render_diagnostic

    sources = {args.output or "<stdout>": draft_text}.get
    print(f"tvp import: internal error: the plan made from {args.file} does not lint; "
          "nothing written (please report this input)", file=sys.stderr)
    for diagnostic in problems:
        sys.stderr.write(render_diagnostic(diagnostic, sources, color=False))
    return EXIT_USAGE


def _write(output: str | None, text: str) -> int:
    if output is None:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as error:
        print(f"tvp import: cannot write {output}: {error.strerror}", file=sys.stderr)
        return EXIT_USAGE
    print(f"tvp import: wrote {output}", file=sys.stderr)
    return EXIT_OK


# ---------------------------------------------------------------- argument types


def _mesh(text: str) -> tuple[tuple[str, int], ...]:
    from trainverify_dsl.importers.common import AXES

    axes: list[tuple[str, int]] = []
    for part in (p.strip() for p in text.split(",")):
        name, equals, size = part.partition("=")
        if not equals or name.strip() not in AXES:
            raise argparse.ArgumentTypeError(
                f"'{part}': expected AXIS=N with AXIS one of {', '.join(AXES)}")
        if name.strip() in dict(axes):
            raise argparse.ArgumentTypeError(f"axis {name.strip()} given twice")
        axes.append((name.strip(), positive_int(size.strip())))
    return tuple(axes)


def _division(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a list of integers") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("layer counts cannot be negative")
    return values
