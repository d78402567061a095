"""Model files are code: where a ``spec`` reference may lead, checked before anything runs.

A plan's model path is looked up in the plan's folder, then the project root (``stdlib/...``
only in the shipped stdlib), never in the working directory; the file found, symlinks
resolved, must lie inside the plan's folder, the project or the stdlib unless
``--allow-model-outside-root``. A refused file is never imported: each model file here
writes a marker file when it is imported, and the tests look for the marker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainverify_dsl import PROJECT_ROOT
from trainverify_dsl.cli.main import main
from trainverify_dsl.resources import RESOURCES
from trainverify_dsl.spec.errors import SpecError
from trainverify_dsl.spec.load import ModelAccess, resolve_ref

MARKER = "IMPORTED"


def model_source(marker: Path) -> str:
    """A small valid model whose import leaves ``marker`` behind."""
    return textwrap.dedent(f'''\
        from pathlib import Path

        import torch
        from torch import nn

        Path({str(marker)!r}).write_text("imported", encoding="utf-8")


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)

            def input_specs(self, batch, seq):
                return {{"x": ((batch, 4), torch.float32)}}

            def forward(self, x):
                return self.fc(x).mean()
        ''')


def plan_text(reference: str) -> str:
    return (f'plan t\nspec "{reference}" batch 4 seq 1\nmesh dp=2\nsplit x [dp, -]\n'
            "all-reduce grad(params) over dp op=avg\nspec-optimizer sgd lr=0.1\n"
            "optimizer sgd lr=0.1\n")


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """``plans/`` (where plans go) and ``elsewhere/model.py`` (outside every root)."""
    plans, elsewhere = tmp_path / "plans", tmp_path / "elsewhere"
    plans.mkdir()
    elsewhere.mkdir()
    (elsewhere / "model.py").write_text(model_source(elsewhere / MARKER), encoding="utf-8")
    return plans, elsewhere


def write_plan(folder: Path, reference: str) -> Path:
    path = folder / "p.tvp"
    path.write_text(plan_text(reference), encoding="utf-8")
    return path


def run(capsys, *argv: str) -> tuple[int, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


@pytest.mark.parametrize("command", [["lint", "--spec"], ["simulate"], ["check", "--no-cache"],
                                     ["run-distributed"]],
                         ids=["lint-spec", "simulate", "check", "run-distributed"])
@pytest.mark.parametrize("how", ["relative", "absolute", "symlink"])
def test_a_model_outside_the_roots_is_refused_and_not_imported(layout, capsys, command, how):
    plans, elsewhere = layout
    reference = {"relative": "../elsewhere/model.py:Net",
                 "absolute": f"{elsewhere / 'model.py'}:Net",
                 "symlink": "link.py:Net"}[how]
    if how == "symlink":  # inside the plan's folder by name, outside once resolved
        (plans / "link.py").symlink_to(elsewhere / "model.py")
    plan = write_plan(plans, reference)
    modules_before = set(sys.modules)
    status, output = run(capsys, *command, str(plan))
    assert status == 1, output
    assert f"{plan}:2:1: error:" in output and "[TVP310]" in output, output
    assert "it was not imported" in output and "Traceback" not in output
    assert not (elsewhere / MARKER).exists(), "the refused model file was imported"
    assert not {m for m in set(sys.modules) - modules_before if m.startswith("tvp_user")}


def test_the_flag_allows_a_model_outside_the_roots(layout, capsys) -> None:
    plans, elsewhere = layout
    plan = write_plan(plans, "../elsewhere/model.py:Net")
    status, output = run(capsys, "lint", "--spec", "--allow-model-outside-root", str(plan))
    assert "[TVP310]" not in output and status == 0, output
    assert (elsewhere / MARKER).exists()


def test_run_distributed_takes_the_flag_too(layout, capsys) -> None:
    """TVP310's advice names the flag: every command that imports models has it (the
    distributed oracle had not)."""
    plans, elsewhere = layout
    plan = write_plan(plans, "../elsewhere/model.py:Net")
    status, output = run(capsys, "run-distributed", "--allow-model-outside-root", str(plan))
    assert "[TVP310]" not in output and status == 0, output
    assert "agrees" in output


def test_a_model_beside_the_plan_is_found_and_allowed(tmp_path: Path, capsys) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "net.py").write_text(model_source(tmp_path / MARKER),
                                                encoding="utf-8")
    plan = write_plan(tmp_path, "models/net.py:Net")
    status, output = run(capsys, "simulate", str(plan))
    assert status == 0 and "agrees with the spec" in output, output
    assert (tmp_path / MARKER).exists()


def test_the_working_directory_is_never_searched(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "cwd_model.py").write_text(model_source(tmp_path / MARKER), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as caught:
        resolve_ref("cwd_model.py:Net")
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.code.id == "TVP301"
    assert all(str(tmp_path) not in note for note in diagnostic.notes), diagnostic.notes


def test_stdlib_paths_name_only_the_shipped_stdlib(tmp_path: Path) -> None:
    """A ``stdlib/models/mlp.py`` beside the plan does not pose as the shipped one."""
    fake = tmp_path / "stdlib" / "models"
    fake.mkdir(parents=True)
    (fake / "mlp.py").write_text(model_source(tmp_path / MARKER), encoding="utf-8")
    ref = resolve_ref("stdlib/models/mlp.py:MLP", "mlp_tiny", ModelAccess(base=tmp_path))
    assert ref.file == (RESOURCES.stdlib_dir / "models" / "mlp.py").resolve()


def test_a_stdlib_in_the_working_directory_does_not_replace_the_shipped_one(
        tmp_path: Path) -> None:
    """``python -m`` puts the working directory first on ``sys.path``; a ``stdlib`` package
    there must still not be imported."""
    cwd, plans = tmp_path / "cwd", tmp_path / "plans"
    fake = cwd / "stdlib" / "models"
    fake.mkdir(parents=True)
    plans.mkdir()
    for init in (cwd / "stdlib" / "__init__.py", fake / "__init__.py"):
        init.write_text("", encoding="utf-8")
    for name in ("llama.py", "common.py"):
        (fake / name).write_text(model_source(tmp_path / MARKER), encoding="utf-8")
    plan = plans / "p.tvp"
    plan.write_text('plan t\nspec "stdlib/models/llama.py:Llama" config llama_tiny batch 2 '
                    'seq 8\nmesh dp=2\nsplit tokens [dp, -]\nsplit labels [dp, -]\n'
                    'all-reduce grad(params) over dp op=avg\n',
                    encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT.parent
                                           if RESOURCES.installed else PROJECT_ROOT)}
    result = subprocess.run([sys.executable, "-m", "trainverify_dsl", "lint", "--spec",
                             str(plan)], cwd=cwd, env=env, text=True, capture_output=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / MARKER).exists(), "the working directory's stdlib was imported"


def test_tvp_spec_confines_a_command_line_path(layout, capsys, monkeypatch) -> None:
    plans, elsewhere = layout
    monkeypatch.chdir(plans)
    status, output = run(capsys, "spec", "../elsewhere/model.py:Net")
    assert status == 2 and "[TVP310]" in output, output
    assert not (elsewhere / MARKER).exists()
    status, output = run(capsys, "spec", "../elsewhere/model.py:Net",
                         "--allow-model-outside-root")
    assert status == 0, output
    assert (elsewhere / MARKER).exists()
