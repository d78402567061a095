"""``tvp spec MODEL``: trace a model's training step into the spec IR and summarise it.

``MODEL`` is ``file.py:Class`` or a config name from ``stdlib/models/configs.json``. A
relative path is looked up in the working directory, then the project root (``stdlib/...``
always names the shipped stdlib); the file is imported, so it runs as Python code and must lie
inside one of those or the stdlib unless ``--allow-model-outside-root`` is given (TVP310). The
summary gives the parameter count, node counts (unique traced and expanded over layers), the
op histogram and the trace time; ``--ir`` prints the canonical IR; ``--format json`` prints
one JSON object (fields include ``params`` and ``nodes``). Bad references or configs print
diagnostics and exit 2. torch is imported only inside ``run``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from trainverify_dsl.cli.lint_cmd import add_model_root_option

EXIT_OK = 0
EXIT_USAGE = 2


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="file.py:Class or a config name")
    parser.add_argument("--config", help="config name (for file.py:Class references)")
    parser.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    parser.add_argument("--seq", type=int, default=16, help="sequence length (default 16)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--ir", action="store_true", help="print the canonical IR")
    parser.add_argument("--flat", action="store_true", help="trace without block reuse")
    parser.add_argument("--optimizer", choices=("none", "sgd", "adamw"), default="none",
                        help="append an optimizer step to the program")
    add_model_root_option(parser)


def _optimizer(name: str) -> Any:
    from trainverify_dsl.spec.optim import SGD, AdamW

    return {"none": None, "sgd": SGD(lr=0.1), "adamw": AdamW(lr=1e-3)}[name]


def summarize(spec: Any, model_name: str) -> dict[str, Any]:
    program = spec.program
    return {
        "model": model_name,
        "params": spec.param_count,
        "param_tensors": len(spec.params),
        "nodes": {"unique": program.unique_node_count,
                  "expanded": program.expanded_node_count},
        "graphs": len(program.graphs),
        "calls": len(program.calls),
        "block_list": spec.block_list,
        "block_groups": [{"graph": g.graph, "layers": len(g.layers)} for g in spec.groups],
        "outputs": len(program.outputs),
        "ops": program.op_histogram(expanded=True),
        "trace_seconds": round(spec.trace_seconds, 3),
        "notes": list(spec.notes),
    }


def _text(summary: dict[str, Any]) -> str:
    nodes = summary["nodes"]
    lines = [f"model          {summary['model']}",
             f"parameters     {summary['params']:,} in {summary['param_tensors']} tensors",
             f"nodes          {nodes['unique']:,} traced, {nodes['expanded']:,} expanded",
             f"graphs/calls   {summary['graphs']} / {summary['calls']}"]
    if summary["block_list"]:
        groups = ", ".join(f"{g['graph']} x{g['layers']}" for g in summary["block_groups"])
        lines.append(f"blocks         {summary['block_list']}: {groups}")
    lines.append(f"trace time     {summary['trace_seconds']:.2f} s")
    lines += [f"note           {note}" for note in summary["notes"]]
    lines.append("ops (expanded):")
    lines += [f"  {op:<22}{count:>10,}" for op, count in summary["ops"].items()]
    return "\n".join(lines) + "\n"


def _print_diagnostics(diagnostics: Any, fmt: str) -> None:
    if fmt == "json":
        items = [{"code": d.code.id, "name": d.code.name, "severity": d.severity.value,
                  "message": d.message, "file": d.span.file, "notes": list(d.notes),
                  "help": d.help} for d in diagnostics]
        print(json.dumps({"diagnostics": items}, indent=2))
        return
    for d in diagnostics:
        print(f"{d.span}: {d.severity.value}: {d.message}  [{d.code.id}]", file=sys.stderr)
        for note in d.notes:
            print(f"  note: {note}", file=sys.stderr)
        if d.help:
            print(f"  help: {d.help}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    # MODEL is a command-line path: relative to the folder the command runs in (the
    # counterpart of a plan's folder), then the project root; ``stdlib/...`` is the shipped one.
    from trainverify_dsl.cli.progress import phases
    from trainverify_dsl.ir.program import format_program
    from trainverify_dsl.spec.errors import SpecError
    from trainverify_dsl.spec.load import ModelAccess, load_model, model_input_specs
    from trainverify_dsl.spec.trace import trace_training_step

    access = ModelAccess(base=Path.cwd(), allow_outside_root=args.allow_model_outside_root)
    try:
        # stdout carries only the summary (one JSON document with --format json): whatever
        # the model's own code prints while it is imported and traced goes to stderr. On a
        # terminal (text output) a status line names the phase running.
        with contextlib.redirect_stdout(sys.stderr), \
                phases(args.format == "text") as progress:
            progress("building the model on fake tensors")
            model = load_model(args.model, args.config, access=access)
            specs = model_input_specs(model, args.batch, args.seq, args.model)
            progress("tracing the training step (forward, backward, optimizer)")
            spec = trace_training_step(model, specs, _optimizer(args.optimizer),
                                       reuse=not args.flat)
    except SpecError as error:
        _print_diagnostics(error.diagnostics, args.format)
        return EXIT_USAGE
    summary = summarize(spec, args.model)
    if args.format == "json":
        if args.ir:
            summary["ir"] = format_program(spec.program)
        print(json.dumps(summary, indent=2))
    else:
        sys.stdout.write(_text(summary))
        if args.ir:
            sys.stdout.write(format_program(spec.program, origins=True))
    return EXIT_OK
