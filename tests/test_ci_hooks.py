"""The pre-commit hooks (.pre-commit-hooks.yaml) and the GitHub Actions workflow of docs/ci.md:
every `tvp` command in them is a valid invocation of the real argument parser, and the hooks
behave as pre-commit users expect (a bad plan fails `tvp-lint`, a plan out of canonical form
fails `tvp-fmt` without being rewritten, good plans pass)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from trainverify_dsl.cli.main import build_parser, main

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
HOOKS = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
GOOD = (ROOT / "plans" / "mlp_tiny_dp.tvp").read_text(encoding="utf-8")


def _hook(hook_id: str) -> dict:
    return next(h for h in HOOKS if h["id"] == hook_id)


def test_hooks_are_well_formed() -> None:
    assert [h["id"] for h in HOOKS] == ["tvp-lint", "tvp-fmt"]
    for hook in HOOKS:
        assert {"id", "name", "entry", "language", "files"} <= set(hook)
        assert hook["language"] == "python"
        assert re.search(hook["files"], "plans/llama3_8b_3d.tvp")
        assert not re.search(hook["files"], "plans/README.md")
        # stated, not left to pre-commit's defaults: the staged plans as arguments, and any
        # number of processes (every plan is checked on its own)
        assert hook["pass_filenames"] is True
        assert hook["require_serial"] is False


def test_pre_commit_accepts_the_hooks_file() -> None:
    """pre-commit's own schema (what `pre-commit validate-manifest` checks)."""
    clientlib = pytest.importorskip("pre_commit.clientlib", reason="pre-commit not installed")
    hooks = clientlib.load_manifest(str(ROOT / ".pre-commit-hooks.yaml"))
    assert [h["id"] for h in hooks] == ["tvp-lint", "tvp-fmt"]


@pytest.mark.parametrize("hook_id", ["tvp-lint", "tvp-fmt"])
def test_hook_entry_is_a_valid_command(hook_id: str) -> None:
    program, *args = shlex.split(_hook(hook_id)["entry"])
    assert program == "tvp"
    build_parser(args[0]).parse_args([*args, "a.tvp", "b.tvp"])  # SystemExit if invalid


def _run(hook_id: str, files: list[Path], monkeypatch: pytest.MonkeyPatch, cwd: Path) -> int:
    monkeypatch.chdir(cwd)
    _, *args = shlex.split(_hook(hook_id)["entry"])
    return main([*args, *(str(f.relative_to(cwd)) for f in files)])


def test_lint_hook_fails_on_a_bad_plan_and_passes_good_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = tmp_path / "good.tvp"
    good.write_text(GOOD, encoding="utf-8")
    bad = tmp_path / "bad.tvp"
    bad.write_text(GOOD.replace("over dp op=avg", "over dq op=avg"), encoding="utf-8")
    assert _run("tvp-lint", [good], monkeypatch, tmp_path) == 0
    assert _run("tvp-lint", [good, bad], monkeypatch, tmp_path) == 1


def test_fmt_hook_fails_without_rewriting(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    untidy = tmp_path / "untidy.tvp"
    text = GOOD.replace("mesh dp=2", "mesh   dp = 2")
    untidy.write_text(text, encoding="utf-8")
    tidy = tmp_path / "tidy.tvp"
    tidy.write_text(GOOD, encoding="utf-8")
    assert _run("tvp-fmt", [tidy], monkeypatch, tmp_path) == 0
    assert _run("tvp-fmt", [tidy, untidy], monkeypatch, tmp_path) == 1
    assert untidy.read_text(encoding="utf-8") == text


def _page_blocks() -> list:
    """Every YAML block of docs/ci.md, loaded."""
    page = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", page, flags=re.S)]


def _walk(node: object) -> list[dict]:
    """Every mapping inside ``node``."""
    if isinstance(node, dict):
        return [node] + [m for value in node.values() for m in _walk(value)]
    if isinstance(node, list):
        return [m for item in node for m in _walk(item)]
    return []


def _workflow() -> dict:
    return next(b for b in _page_blocks() if isinstance(b, dict) and "jobs" in b)


def _documented_commands() -> list[list[str]]:
    """The `tvp` commands of the page as argument lists: workflow steps (`run`, without a
    redirection) and local hooks (`entry`, given two files as pre-commit does)."""
    commands = []
    for mapping in (m for b in _page_blocks() for m in _walk(b)):
        if str(mapping.get("run", "")).startswith("tvp "):
            commands.append(shlex.split(mapping["run"].split(">")[0]))
        if str(mapping.get("entry", "")).startswith("tvp "):
            commands.append([*shlex.split(mapping["entry"]), "a.tvp", "b.tvp"])
    return commands


def test_the_documented_commands_are_valid_invocations() -> None:
    commands = _documented_commands()
    assert len(commands) >= 6
    for words in commands:
        args = build_parser(words[1]).parse_args(words[1:])  # SystemExit if invalid
        assert args.command in ("lint", "fmt", "check"), words


def test_the_documented_workflow_uploads_what_tvp_writes() -> None:
    steps = [s for job in _workflow()["jobs"].values() for s in job["steps"]]
    commands = [s["run"] for s in steps if str(s.get("run", "")).startswith("tvp ")]
    sarif = next(c for c in commands if "--format sarif" in c)
    written = sarif.split(">")[1].strip()
    uploads = [s for s in steps if str(s.get("uses", "")).startswith(
        "github/codeql-action/upload-sarif")]
    assert uploads and uploads[0]["with"]["sarif_file"] == written
    assert any("github" in words for words in _documented_commands())
    assert _workflow()["permissions"]["security-events"] == "write"


def test_the_documented_hooks_are_the_shipped_ones() -> None:
    """The remote config names hooks that exist; the local variant runs the same commands on
    the same files."""
    blocks = [b for b in _page_blocks() if isinstance(b, dict) and "repos" in b]
    remote = next(r for b in blocks for r in b["repos"] if r["repo"] != "local")
    assert [h["id"] for h in remote["hooks"]] == [h["id"] for h in HOOKS]
    local = next(r for b in blocks for r in b["repos"] if r["repo"] == "local")
    for hook in local["hooks"]:
        shipped = _hook(hook["id"])
        assert (hook["entry"], hook["files"]) == (shipped["entry"], shipped["files"])
