"""Shared helpers of the plan tests: text -> AST (through the parser), resolve, lint."""

from __future__ import annotations

from pathlib import Path

from trainverify_dsl.parse import ast, parse_source
from trainverify_dsl.plan import ResolveResult, resolve_file, resolve_plan_file
from trainverify_dsl.report.diagnostics import Diagnostic

HEAD = 'plan demo\nspec "models/toy.py:Toy" config toy batch 8 seq 16\n'


def parse_text(text: str, file: str = "main.tvp") -> tuple[ast.PlanFile, tuple[Diagnostic, ...]]:
    result = parse_source(text if text.endswith("\n") else text + "\n", file)
    return result.plan_file, tuple(result.diagnostics)


def text_loader(path: Path, display: str):
    return parse_text(path.read_text(encoding="utf-8"), display)


def resolve_text(text: str, *, head: str = HEAD) -> ResolveResult:
    """Resolve an in-memory main file (``use`` paths then resolve against the project)."""
    plan_file, syntax = parse_text(head + text)
    assert not syntax, [d.message for d in syntax]
    return resolve_plan_file(plan_file, loader=text_loader)


def lint_files(directory: Path, files: dict[str, str], main: str = "main.tvp"):
    """Write ``files`` into ``directory`` and lint ``main``: the sorted diagnostics."""
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return resolve_file(directory / main, loader=text_loader).diagnostics


def codes_of(result: ResolveResult | tuple[Diagnostic, ...]) -> list[str]:
    diagnostics = result.diagnostics if isinstance(result, ResolveResult) else result
    return [d.code.id for d in diagnostics]


def row_parallel_weight_over_dp(directory: Path) -> Path:
    """``mlp_dp_tp`` with a copy of ``stdlib/megatron.tvp`` whose row-parallel weight is also
    split over dp (the models copied beside it): a plan whose algorithm cannot run on its
    local shapes. Returns the plan's path (``directory/p.tvp``)."""
    import shutil

    root = Path(__file__).resolve().parents[1]
    template = (root / "stdlib" / "megatron.tvp").read_text()
    old = "template row_parallel_bias(m, axis=tp):\n    split m.weight [-, axis]\n"
    assert old in template
    (directory / "megatron.tvp").write_text(template.replace(
        old, "template row_parallel_bias(m, axis=tp):\n    split m.weight [dp, axis]\n"))
    shutil.copytree(root / "stdlib" / "models", directory / "stdlib" / "models")
    plan = directory / "p.tvp"
    plan.write_text((root / "plans" / "mlp_dp_tp.tvp").read_text().replace(
        'use "stdlib/megatron.tvp"', 'use "megatron.tvp"'))
    return plan
