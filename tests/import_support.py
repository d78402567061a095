"""Shared by the ``tvp import`` tests: the example imports and their golden plans.

Every example is a foreign plan under ``tests/data/import/`` written in its framework's real
format, imported with the command-line options it lacks. Its output is kept as golden text in
``tests/golden/import/NAME.tvp``; regenerate after a reviewed change with

    python tests/import_support.py --update

The golden text is not trusted on its own: each test lints it (and ``tvp lint --spec`` runs
the layout pass on it), and the small ones are simulated against the spec.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "import"
GOLDEN = ROOT / "tests" / "golden" / "import"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ADAMW = "adamw lr=3e-4 betas=(0.9, 0.95) eps=1e-8 weight-decay=0.1"


@dataclass(frozen=True)
class Case:
    name: str
    format: str
    file: str
    args: tuple[str, ...]
    #: small enough for `tvp simulate` (llama_tiny)
    small: bool

    @property
    def path(self) -> Path:
        return DATA / self.file

    @property
    def golden(self) -> Path:
        return GOLDEN / f"{self.name}.tvp"

    def argv(self, output: Path | None = None) -> list[str]:
        out = ["-o", str(output), "--force"] if output else []
        return ["import", self.format, str(self.path), "--name", self.name, *self.args, *out]


CASES = (
    Case("hf_llama3_8b", "hf", "hf_llama3_8b_config.json",
         ("--config", "llama3_8b", "--batch", "512", "--seq", "8192", "--mesh",
          "pp=4,dp=4,tp=8", "--microbatches", "16", "--schedule", "1f1b", "--optimizer",
          ADAMW), False),
    Case("hf_configuration_llama", "hf", "hf_configuration_llama.py",
         ("--config", "llama_tiny", "--batch", "4", "--seq", "8", "--mesh", "dp=2,tp=2",
          "--optimizer", "sgd lr=0.01"), True),
    Case("hf_llama_tiny_causal_lm", "hf", "hf_llama_tiny_causal_lm.json",
         ("--config", "llama_tiny", "--batch", "4", "--seq", "8", "--mesh", "tp=2",
          "--optimizer", "sgd lr=0.01"), True),
    Case("tt_llama3_8b_sp", "torchtitan", "tt_llama3_sp.py",
         ("--config", "llama3_8b", "--batch", "128", "--seq", "8192", "--mesh",
          "pp=2,dp=8,tp=8", "--microbatches", "8", "--schedule", "1f1b", "--loss-parallel",
          "--optimizer", ADAMW), False),
    Case("tt_llama_tiny_sp", "torchtitan", "tt_llama3_sp.py",
         ("--config", "llama_tiny", "--batch", "4", "--seq", "8", "--mesh", "dp=2,tp=2",
          "--loss-parallel", "--optimizer", "sgd lr=0.01"), True),
    Case("tt_llama_tiny_tp", "torchtitan", "tt_llama3_tp.json",
         ("--config", "llama_tiny", "--batch", "4", "--seq", "8", "--mesh", "tp=2",
          "--optimizer", "sgd lr=0.01"), True),
    Case("galvatron_llama3_8b", "galvatron", "galvatron_llama3_8b.json",
         ("--config", "llama3_8b", "--seq", "8192", "--world-size", "32", "--optimizer",
          ADAMW), False),
    Case("galvatron_llama_tiny", "galvatron", "galvatron_llama_tiny.json",
         ("--config", "llama_tiny", "--seq", "8", "--world-size", "8", "--optimizer",
          "adam lr=0.001"), True),
    Case("nnscaler_llama_tiny", "nnscaler", "nnscaler_llama_tiny_plan.json",
         ("--ops", str(DATA / "nnscaler_llama_tiny_ops.json"), "--config", "llama_tiny",
          "--batch", "4", "--seq", "8", "--optimizer", "sgd lr=0.01"), True),
)


def cases(format_name: str) -> list[Case]:
    return [c for c in CASES if c.format == format_name]


def run_tvp(argv: list[str]) -> tuple[int, str, str]:
    """``tvp ARGV`` in process: (exit code, stdout, stderr)."""
    from trainverify_dsl.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = int(stop.code or 0)
    return code, out.getvalue(), err.getvalue()


def imported(case: Case) -> str:
    """The plan text ``tvp import`` prints for ``case`` (it must succeed)."""
    code, out, err = run_tvp(case.argv())
    assert code == 0, err
    return out


def import_file(tmp: Path, format_name: str, name: str, text: str,
                *args: str) -> tuple[int, str, str]:
    """Write ``text`` to ``tmp/name`` and import it."""
    path = tmp / name
    path.write_text(text, encoding="utf-8")
    return run_tvp(["import", format_name, str(path), *args])


def error_lines(stderr: str) -> list[str]:
    """The ``FILE:LINE:COL: error: ... [CODE]`` headlines, the file name cut to its base."""
    return [re.sub(r"^[^:]*/", "", line) for line in stderr.splitlines()
            if ": error: " in line]


def meaning(path: Path) -> dict:
    """The resolved plan without names, files and source positions; statement lists as
    sorted lists (two plans stating the same things in another order mean the same)."""
    from trainverify_dsl.plan import plan_to_dict, resolve_file

    resolved = resolve_file(path, project_root=ROOT)
    assert resolved.ok, resolved.diagnostics
    data = _strip(plan_to_dict(resolved.plan))
    for key in ("layouts", "collectives", "algorithms", "sends"):
        data[key] = sorted(data[key], key=lambda item: json.dumps(item, sort_keys=True))
    return data


def _strip(value: object) -> object:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items()
                if k not in ("name", "file", "files", "origin", "origins", "trail")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def update() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        case.golden.write_text(imported(case), encoding="utf-8")
        print("wrote", case.golden.relative_to(ROOT))


if __name__ == "__main__" and "--update" in sys.argv:
    update()
