"""The hooks of .pre-commit-hooks.yaml run for real: pre-commit installs this package into a
hook environment of its own and runs `tvp-lint` and `tvp-fmt` on a repository of plans. Good
plans pass; a plan with an error fails `tvp-lint`, which names it; a plan out of canonical form
fails `tvp-fmt`, which names it and leaves it unchanged.

pre-commit installs the hook repository with its declared dependencies, and torch is one of
them (hundreds of MB for a hook that never imports it). To keep this test at a few seconds the
hook environment gets an empty distribution named torch instead (a wheel with metadata and no
module), through pip's constraint and find-links settings: the hooks still pass, which also
shows that `tvp lint` and `tvp fmt` never import torch. Everything else (lark, z3-solver, numpy,
rich, setuptools to build the package) comes from the package index as for any user.

`pre-commit try-repo` would do the same with a throw-away store, installing the environment
once per call; a `.pre-commit-config.yaml` naming a local clone installs it once for both runs.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("pre_commit", reason="pre-commit is not installed (it is in the test extra)")

ROOT = Path(__file__).resolve().parent.parent
GOOD = (ROOT / "plans" / "mlp_tiny_dp.tvp").read_text(encoding="utf-8")
#: what `pip install .` of the hook repository needs (the rest of the checkout is left out)
PACKAGE_FILES = ("pyproject.toml", "setup.py", "README.md", ".pre-commit-hooks.yaml", "grammar",
                 "stdlib", "trainverify_dsl")
STUB_TORCH_VERSION = "2.13.0+tvpstub"  # matches the `torch==2.13.0` pin (PEP 440 local label)

pytestmark = [
    pytest.mark.slow,  # installs a hook environment (about 15 s)
    pytest.mark.skipif(shutil.which("git") is None, reason="git is not on PATH"),
    pytest.mark.skipif(not (ROOT / "pyproject.toml").is_file(),
                       reason="needs a source checkout to install the hooks from"),
]


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=tvp tests", "-c", "user.email=tests@tvp",
                           "-c", "commit.gpgsign=false", *args], cwd=cwd, check=True,
                          capture_output=True, text=True)
    return done.stdout.strip()


def _hook_repository(target: Path) -> str:
    """A git repository holding this checkout's package files (uncommitted edits included);
    returns its commit."""
    target.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in PACKAGE_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=ignore)
        else:
            shutil.copy2(source, target / name)
    _git(target, "init", "-q")
    _git(target, "add", "-A")
    _git(target, "commit", "-q", "-m", "hooks under test")
    return _git(target, "rev-parse", "HEAD")


def _stub_wheel(directory: Path, name: str, version: str) -> None:
    """An installable wheel of ``name`` with its metadata and no code at all."""
    directory.mkdir()
    info = f"{name}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tvp tests\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    record = []
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
            digest = hashlib.sha256(text.encode("utf-8")).digest()
            encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")
            record.append(f"{path},sha256={encoded},{len(text.encode('utf-8'))}")
        record.append(f"{info}/RECORD,,")
        wheel.writestr(f"{info}/RECORD", "\n".join(record) + "\n")


@pytest.fixture(scope="module")
def plans_repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(a git repository of plans whose .pre-commit-config.yaml uses both hooks, the
    environment to run pre-commit in)."""
    base = tmp_path_factory.mktemp("precommit")
    commit = _hook_repository(base / "hooks")
    _stub_wheel(base / "wheels", "torch", STUB_TORCH_VERSION)
    (base / "constraints.txt").write_text(f"torch=={STUB_TORCH_VERSION}\n", encoding="utf-8")
    repository = base / "plans"
    repository.mkdir()
    (repository / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {base / 'hooks'}\n    rev: {commit}\n    hooks:\n"
        "      - id: tvp-lint\n      - id: tvp-fmt\n", encoding="utf-8")
    _git(repository, "init", "-q")
    environment = {**os.environ, "PRE_COMMIT_HOME": str(base / "cache"),
                   "PIP_FIND_LINKS": str(base / "wheels"),
                   "PIP_CONSTRAINT": str(base / "constraints.txt"),
                   "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return repository, environment


def _pre_commit(repository: Path, environment: dict[str, str]) -> subprocess.CompletedProcess:
    _git(repository, "add", "-A")
    return subprocess.run([sys.executable, "-m", "pre_commit", "run", "--all-files", "--color",
                           "never"], cwd=repository, env=environment, capture_output=True,
                          text=True, timeout=900)


def _hook_lines(output: str) -> dict[str, str]:
    """``{'tvp lint': 'Passed', 'tvp fmt --check': 'Failed'}`` from pre-commit's status lines."""
    lines = [line for line in output.splitlines() if line.startswith("tvp ")]
    return {line.split(".")[0]: line.rsplit(".", 1)[-1] for line in lines}


def test_the_hooks_pass_good_plans_and_fail_bad_ones(
        plans_repository: tuple[Path, dict[str, str]]) -> None:
    repository, environment = plans_repository
    (repository / "good.tvp").write_text(GOOD, encoding="utf-8")
    (repository / "notes.md").write_text("mesh   dp = 2\n", encoding="utf-8")  # not a plan
    done = _pre_commit(repository, environment)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _hook_lines(done.stdout) == {"tvp lint": "Passed", "tvp fmt --check": "Passed"}

    (repository / "bad.tvp").write_text(GOOD.replace("over dp op=avg", "over dq op=avg"),
                                        encoding="utf-8")
    untidy = GOOD.replace("mesh dp=2", "mesh   dp = 2")
    (repository / "untidy.tvp").write_text(untidy, encoding="utf-8")
    done = _pre_commit(repository, environment)
    assert done.returncode == 1, done.stdout + done.stderr
    assert _hook_lines(done.stdout) == {"tvp lint": "Failed", "tvp fmt --check": "Failed"}
    lint_part, fmt_part = done.stdout.split("tvp fmt --check.")
    assert "bad.tvp:" in lint_part and "unknown mesh axis 'dq'" in lint_part
    assert "good.tvp:" not in lint_part and "untidy.tvp:" not in lint_part
    assert "would reformat untidy.tvp" in fmt_part
    assert "good.tvp" not in fmt_part and "bad.tvp" not in fmt_part
    assert (repository / "untidy.tvp").read_text(encoding="utf-8") == untidy
