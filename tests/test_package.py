"""The built package carries what it needs: the grammar, the plan library and the reference
models, found from the installed package wherever the command runs.

One wheel is built (without build isolation, from a copy of the sources so the checkout
gets no build/ folder) and unpacked into a temporary folder used as an import path; a fresh
virtualenv with the wheel installed is .ci/run's job. ``resources.locate`` is also checked on
both layouts directly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from trainverify_dsl.resources import locate

ROOT = Path(__file__).resolve().parent.parent
#: What a build needs from the checkout.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "grammar", "stdlib", "trainverify_dsl")
DATA = "trainverify_dsl/_data"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         str(source), "-w", str(work / "dist")],
        cwd=work, text=True, capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr
    (built,) = (work / "dist").glob("trainverify_dsl-*.whl")
    return built


def test_the_wheel_carries_grammar_stdlib_and_models(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"{DATA}/grammar/tvp.lark", f"{DATA}/grammar/tvp.tables.json",
              f"{DATA}/stdlib/models/configs.json"}
    wanted |= {f"{DATA}/{p.relative_to(ROOT).as_posix()}"
               for pattern in ("stdlib/*.tvp", "stdlib/**/*.py")
               for p in ROOT.glob(pattern) if "__pycache__" not in p.parts}
    wanted |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "trainverify_dsl").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert len(wanted) > 60
    assert wanted <= names, sorted(wanted - names)
    assert not [n for n in names if n.startswith(("grammar/", "stdlib/", "tests/", "plans/"))]


INSTALLED_CHECK = textwrap.dedent('''\
    import json, sys
    from pathlib import Path
    import trainverify_dsl
    from trainverify_dsl.plan import lint_file
    from trainverify_dsl.resources import RESOURCES
    from trainverify_dsl.spec.load import ModelAccess, resolve_ref

    plan = Path(sys.argv[1])
    refs = [resolve_ref(r, None, ModelAccess(base=plan.parent))
            for r in ("stdlib/models/llama.py:Llama", "deepseek_tiny")]
    print(json.dumps({
        "package": trainverify_dsl.__file__,
        "installed": RESOURCES.installed,
        "grammar": str(RESOURCES.grammar_file),
        "stdlib": str(RESOURCES.stdlib_dir),
        "models": [str(r.file) for r in refs],
        "lint": [f"{d.code.id} {d.message}" for d in lint_file(plan)],
    }))
''')


def test_the_unpacked_wheel_finds_its_resources_from_anywhere(wheel: Path,
                                                              tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plan = elsewhere / "p.tvp"
    plan.write_text('plan p\nspec "stdlib/models/llama.py:Llama" config llama_tiny batch 4 '
                    'seq 8\nmesh tp=2\nuse "stdlib/megatron.tvp"\n'
                    "apply column_parallel(layers.0.attention.wq, tp)\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", INSTALLED_CHECK, str(plan)], cwd=elsewhere,
                            env=env, text=True, capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    data = site / DATA
    assert found["package"] == str(site / "trainverify_dsl" / "__init__.py")
    assert found["installed"] is True
    assert found["grammar"] == str(data / "grammar" / "tvp.lark")
    assert found["stdlib"] == str(data / "stdlib")
    assert found["models"] == [str(data / "stdlib" / "models" / name)
                               for name in ("llama.py", "deepseek.py")]
    assert found["lint"] == []


def test_locate_prefers_the_bundled_copy(tmp_path: Path) -> None:
    package = tmp_path / "site" / "trainverify_dsl"
    (package / "_data" / "grammar").mkdir(parents=True)
    (package / "_data" / "grammar" / "tvp.lark").write_text("", encoding="utf-8")
    (tmp_path / "site" / "grammar").mkdir()  # a stray folder beside an installed package
    found = locate(package)
    assert found.installed and found.project_root == package / "_data"
    assert found.stdlib_base == package / "_data"
    assert found.configs_file == package / "_data" / "stdlib" / "models" / "configs.json"


def test_locate_in_a_checkout() -> None:
    found = locate(ROOT / "trainverify_dsl")
    assert not found.installed and found.project_root == ROOT
    assert found.grammar_file == ROOT / "grammar" / "tvp.lark" and found.grammar_file.is_file()
    assert found.stdlib_dir == ROOT / "stdlib" and found.configs_file.is_file()
