"""The pipeline's layering, read from the source (every ``import`` and ``from ... import`` of
every module, lazy ones inside functions included): data flows one way, and a stage never
reaches into a later one or into the drivers.

    parse -> plan -> lower -> (ParallelProgram, in ir/) -> simulate / check
    spec -> (reference step, in ir/)      api.py / shrink.py drive them; cli/ and oracle/ on top

``ir/`` importing no torch is checked by executing it (``tests/test_parallel_program.py``);
here: who may import whom.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "trainverify_dsl"

#: For each part of the package, the parts it must never import.
FORBIDDEN = {
    "ir": {"parse", "plan", "spec", "lower", "simulate", "check", "api", "shrink", "cli",
           "oracle"},
    "check": {"parse", "plan", "spec", "lower", "simulate", "api", "shrink", "cli", "oracle"},
    "simulate": {"parse", "plan", "lower", "check", "api", "shrink", "cli", "oracle"},
    "lower": {"simulate", "check", "api", "shrink", "cli", "oracle"},
    "spec": {"parse", "plan", "lower", "simulate", "check", "api", "shrink", "cli", "oracle"},
    "plan": {"lower", "simulate", "check", "spec", "api", "shrink", "cli", "oracle"},
    "parse": {"plan", "lower", "simulate", "check", "spec", "api", "shrink", "cli", "oracle"},
    "api": {"cli", "oracle"},
    "shrink": {"cli", "oracle", "check", "simulate", "api"},
    # the language server reads what `tvp lint` reads, never torch's stages nor the commands
    "lsp": {"spec", "lower", "simulate", "check", "api", "shrink", "cli", "oracle"},
    "importers": {"lower", "simulate", "check", "spec", "api", "shrink", "cli", "oracle"},
}


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, imported part)`` for every import of a ``trainverify_dsl`` module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "trainverify_dsl" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_part_is_classified() -> None:
    parts = {_part(p) for p in MODULES} - {"__init__", "__main__", "resources", "report"}
    assert parts <= set(FORBIDDEN) | {"cli", "oracle"}, parts - set(FORBIDDEN)


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_no_import_against_the_flow(part: str) -> None:
    bad = [f"{p.relative_to(PACKAGE)}:{line} imports trainverify_dsl.{name}"
           for p in MODULES if _part(p) == part
           for line, name in _imports(p) if name in FORBIDDEN[part]]
    assert bad == []


def test_the_checker_reads_nothing_but_ir_and_the_vocabulary() -> None:
    allowed = {"ir", "report", "check"}
    bad = [f"{p.relative_to(PACKAGE)}:{line} imports {name}" for p in MODULES
           if _part(p) == "check" for line, name in _imports(p) if name not in allowed]
    assert bad == []


def _third_party(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_only_the_solver_module_imports_z3_and_the_checker_no_torch() -> None:
    z3_users = sorted(str(p.relative_to(PACKAGE)) for p in MODULES if "z3" in _third_party(p))
    assert z3_users == ["check/solver.py"]
    torch_in_check = [str(p.relative_to(PACKAGE)) for p in MODULES
                      if _part(p) == "check" and "torch" in _third_party(p)]
    assert torch_in_check == []


def test_only_the_language_server_imports_pygls() -> None:
    """``tvp lint`` and every other command run without pygls (an optional dependency):
    only ``lsp/`` imports it, and ``cli/lsp_cmd.py`` loads ``lsp/`` when the command runs."""
    users = sorted(str(p.relative_to(PACKAGE)) for p in MODULES
                   if _third_party(p) & {"pygls", "lsprotocol"})
    assert users and all(user.startswith("lsp/") for user in users), users
    importers = sorted(str(p.relative_to(PACKAGE)) for p in MODULES
                       if _part(p) != "lsp" and any(n == "lsp" for _, n in _imports(p)))
    assert importers == ["cli/lsp_cmd.py"]


def test_a_wrong_import_is_seen(tmp_path: Path) -> None:
    """The scan sees lazy imports inside functions (negative control)."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from trainverify_dsl.lower.bind import x\n")
    assert _imports(source) == [(2, "lower"), (2, "lower")]


def test_the_collective_table_is_the_language_s() -> None:
    """One table of collective semantics (``ir/collectives.py``): the grammar's statement
    keywords, the plan's default backwards and the lowering's IR ops all come from it."""
    from trainverify_dsl.ir.collectives import COLLECTIVES, STATEMENTS
    from trainverify_dsl.ir.ops import OPS
    from trainverify_dsl.parse.ast import COLLECTIVE_KINDS
    from trainverify_dsl.plan.model import DEFAULT_BACKWARD

    assert set(STATEMENTS) == set(COLLECTIVE_KINDS)
    assert DEFAULT_BACKWARD == {k: COLLECTIVES[k].default_backward for k in STATEMENTS}
    for c in COLLECTIVES.values():
        assert c.ir_op is None and c.kind == "identity" or OPS[c.ir_op].collective, c
        assert c.default_backward in COLLECTIVES
    # the backwards that sum cotangents are exactly the reductions
    assert {k for k, c in COLLECTIVES.items() if c.sums} == {"all-reduce", "reduce-scatter"}


def test_tvp_lint_does_not_import_numpy_or_torch() -> None:
    import subprocess
    import sys

    code = ("import sys; from trainverify_dsl.cli.main import main; "
            "main(['lint', 'plans/mlp_tiny_dp.tvp']); "
            "print(sorted(m for m in ('numpy', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


def test_every_algorithm_a_plan_can_name_is_registered() -> None:
    """`tvp lint` knows the names (``plan/vocab.py``); the lowering's registry
    (``lower/algorithms.py: ALGORITHMS``) defines each, with its section of the semantics."""
    from trainverify_dsl.lower.algorithms import ALGORITHMS
    from trainverify_dsl.plan import vocab

    assert set(ALGORITHMS) == set(vocab.ALGORITHMS)
    semantics = (PACKAGE.parent / "docs" / "semantics.md").read_text()
    for algorithm in ALGORITHMS.values():
        assert algorithm.replaces in ("module", "loss")
        assert f"### {algorithm.section[1:]} `{algorithm.name}`" in semantics, algorithm


def test_algorithms_reach_the_lowering_only_through_their_context() -> None:
    source = (PACKAGE / "lower" / "algorithms.py").read_text()
    assert "_Lowering" not in source and "lw." not in source


def test_lowering_findings_carry_registered_codes_not_strings() -> None:
    """Typed like the plan's: every finding of the lowering is built with a code object from
    the registry, so a misspelt code cannot wait until the finding fires."""
    import re

    pattern = re.compile(r"Finding\(\s*\"|finding\(\s*\"|_group\(\s*\"|code=\"")
    bad = [f"{p.relative_to(PACKAGE)}:{n}" for p in (PACKAGE / "lower").glob("*.py")
           for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert bad == []
