"""`tvp` command-line entry point.

Each subcommand lives in its own module under ``trainverify_dsl.cli`` exposing
``configure(parser)`` (add its arguments) and ``run(args) -> int`` (the exit code). Modules
are imported only when their subcommand runs, so ``tvp lint`` never imports torch or z3.

Exit codes: 0 success/verified/clean, 1 findings/counterexample, 2 usage or internal error,
3 inconclusive.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

#: subcommand -> (module under trainverify_dsl.cli, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "lint": ("lint_cmd", "check plans without torch or a solver (syntax, names, layouts)"),
    "fmt": ("fmt_cmd", "format plans canonically (keeps comments)"),
    "explain": ("explain_cmd", "explain a diagnostic code: what, why, example, fix"),
    "lsp": ("lsp_cmd", "language server for editors on stdio (diagnostics, format, hover, "
            "definition)"),
    "spec": ("spec_cmd", "trace a model into the spec IR and summarise it"),
    "simulate": ("simulate_cmd", "run the lowered plan on every rank and compare with the spec"),
    "check": ("check_cmd", "prove that the plan computes the spec's training step"),
    "run-distributed": ("run_distributed_cmd", "run a small plan as real gloo processes and "
                        "compare with single-device torch"),
    "import": ("import_cmd", "write the plan of a foreign parallel plan (Hugging Face, "
               "torchtitan, Galvatron, nnScaler)"),
}

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse exits with 2 on usage errors, which matches our contract; keep it."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``tvp`` parser. Every subcommand is listed with its help line, but only
    ``command``'s module is imported and its arguments added: a command's start-up imports
    that command alone (``tvp lint`` is timed in ``bench/lint_bench.py``)."""
    parser = _Parser(prog="tvp", description="Prove distributed training plans correct.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            _load(module_name).configure(sub_parser)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first argument that is not an option (the only
    option before it, ``--version``, takes no value)."""
    return next((argument for argument in argv if not argument.startswith("-")), None)


def _load(module_name: str):
    return importlib.import_module(f"trainverify_dsl.cli.{module_name}")


def _quiet_torch() -> None:
    """torch logs a traceback at ERROR level (on stderr) whenever an op fails on fake
    tensors, before raising the error; the lowering and the tracer catch those errors and
    report them as located diagnostics, so the log is noise in the tool's output (a piped
    `tvp lint --spec` printed pages of it for a plan with one diagnostic)."""
    import logging

    # a filter, not a level: importing torch later sets its loggers' levels again
    logging.getLogger("torch._subclasses.fake_tensor").addFilter(
        lambda record: record.levelno >= logging.CRITICAL)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command_in(arguments))
    args = parser.parse_args(arguments)
    if args.version:
        from trainverify_dsl import __version__

        print(f"tvp {__version__}")
        return 0
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    module_name, _ = SUBCOMMANDS[args.command]
    _quiet_torch()
    try:
        status = int(_load(module_name).run(args))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the exit
        return status
    except KeyboardInterrupt:
        return EXIT_USAGE
    except BrokenPipeError:
        # the reader went away (``tvp check --format json | head -1``): nothing more to say,
        # and no traceback when Python flushes stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_USAGE
    except Exception as error:  # noqa: BLE001 - a bug of ours: exit 2, never a traceback
        # (each command reports the errors it expects itself; what reaches here is not one
        # of them, and exit 1 would read as "the plan is wrong")
        import traceback

        frame = traceback.extract_tb(error.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        message = f"internal error: {type(error).__name__}: {error} (at {where}; please " \
            "report it)"
        print(f"tvp {args.command}: {message}", file=sys.stderr)
        if getattr(args, "format", None) == "json":  # stdout stays one JSON document
            import json

            print(json.dumps({"command": args.command, "verdict": "error", "error": message},
                             indent=2))
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
