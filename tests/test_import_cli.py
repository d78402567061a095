"""``tvp import`` as a command: options, exit codes, where the plan goes, internal errors;
and every TVP6xx code's `tvp explain` example is refused with its code while its fix imports
(the code registry's examples are test data, as for the lint codes)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from import_support import CASES, run_tvp

from trainverify_dsl.report import codes_import
from trainverify_dsl.report.diagnostics import Code

HF = next(c for c in CASES if c.name == "hf_configuration_llama")


def by_id(code: Code) -> str:
    return f"{code.id}-{code.name}"


def run_snippet(directory: Path, snippet: str) -> tuple[int, str, str]:
    """``# tvp import FORMAT FILE OPTIONS`` then FILE's text: write it, run the command."""
    command, _, text = snippet.partition("\n")
    argv = shlex.split(command.removeprefix("# tvp "))
    (directory / argv[2]).write_text(text, encoding="utf-8")
    argv[2] = str(directory / argv[2])
    return run_tvp(argv)


@pytest.mark.parametrize("code", codes_import.CODES, ids=by_id)
def test_the_example_is_refused_with_its_code(code: Code, tmp_path: Path) -> None:
    status, out, err = run_snippet(tmp_path, code.example)
    assert (status, out) == (1, ""), err
    assert f"[{code.id}]" in err


@pytest.mark.parametrize("code", codes_import.CODES, ids=by_id)
def test_the_fix_imports(code: Code, tmp_path: Path) -> None:
    status, out, err = run_snippet(tmp_path, code.fix)
    assert status == 0, err
    assert out.startswith("# Imported by `tvp import")


def test_the_plan_goes_to_stdout_or_to_the_output_file(tmp_path: Path) -> None:
    code, out, err = run_tvp(HF.argv())
    assert code == 0 and out == HF.golden.read_text(encoding="utf-8") and err == ""
    output = tmp_path / "plan.tvp"
    code, out, err = run_tvp(HF.argv(output))
    assert (code, out) == (0, "") and f"wrote {output}" in err
    assert output.read_text(encoding="utf-8") == HF.golden.read_text(encoding="utf-8")


def test_an_existing_output_is_replaced_only_with_force(tmp_path: Path) -> None:
    output = tmp_path / "plan.tvp"
    output.write_text("keep me\n", encoding="utf-8")
    argv = HF.argv()[:] + ["-o", str(output)]
    code, _, err = run_tvp(argv)
    assert code == 2 and "exists; --force replaces it" in err
    assert output.read_text(encoding="utf-8") == "keep me\n"
    assert run_tvp(argv + ["--force"])[0] == 0


def test_a_refused_import_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "bad.json"
    source.write_text('{"layers.*.mlp": "gather"}', encoding="utf-8")
    output = tmp_path / "plan.tvp"
    code, out, err = run_tvp(["import", "hf", str(source), "--config", "llama_tiny",
                              "--seq", "8", "--batch", "4", "--mesh", "tp=2", "-o",
                              str(output)])
    assert (code, out) == (1, "")
    assert not output.exists()
    assert err.splitlines()[-1] == f"tvp import: {source} refused (1 reason); nothing written"
    assert '    {"layers.*.mlp": "gather"}' in err  # the source line, with a marker under it


@pytest.mark.parametrize(("argv", "message"), [
    (["--config", "llama_tiny", "--seq", "8", "--batch", "4"], "--mesh required"),
    (["--config", "llama_tyni", "--seq", "8"], "did you mean 'llama_tiny'"),
    (["--config", "deepseek_tiny", "--seq", "8"], "the importers know the reference models"),
    (["--config", "llama_tiny", "--seq", "8", "--batch", "4", "--mesh", "ep=2"],
     "expected AXIS=N with AXIS one of pp, dp, tp"),
    (["--config", "llama_tiny", "--seq", "8", "--batch", "4", "--mesh", "tp=2,tp=2"],
     "axis tp given twice"),
    (["--config", "llama_tiny", "--seq", "0"], "0 is not positive"),
    (["--config", "llama_tiny", "--seq", "8", "--batch", "4", "--mesh", "tp=2",
      "--optimizer", "sgd lr=0.1 shard over dp"], "takes no 'shard over'"),
    (["--config", "llama_tiny", "--seq", "8", "--batch", "4", "--mesh", "tp=2",
      "--optimizer", "sgd lr="], "is not an optimizer"),
    # resolved, not only parsed (these made an unlintable plan: "internal error")
    (["--config", "llama_tiny", "--seq", "8", "--batch", "4", "--mesh", "tp=2",
      "--optimizer", "bogus"], "unknown optimizer 'bogus'"),
    (["--config", "llama_tiny", "--seq", "8", "--batch", "4", "--mesh", "tp=2",
      "--optimizer", "adamw lr=x"], "is not an optimizer"),
    (["--config", "llama_tiny", "--seq", "8", "--batch", "4", "--mesh", "tp=2",
      "--optimizer", "sgd lr=-1"], "is not an optimizer"),
    # one statement: a line break would write a second one into the plan
    (["--config", "llama_tiny", "--seq", "8", "--batch", "4", "--mesh", "tp=2",
      "--optimizer", "sgd lr=0.1\nall-reduce grad(params) over tp"], "is not one optimizer"),
    (["--config", "llama_tiny", "--spec", "stdlib/models/gpt2.py:GPT2", "--seq", "8"],
     "is not the model of config llama_tiny"),
    (["--seq", "8"], "the following arguments are required: --config"),
    (["--config", "llama_tiny", "--seq", "8", "--name", "my plan"], "is not a plan name"),
])
def test_usage_errors_exit_2(argv: list[str], message: str) -> None:
    code, out, err = run_tvp(["import", "hf", str(HF.path), *argv])
    assert (code, out) == (2, "")
    assert message in err


def test_a_draft_that_does_not_lint_is_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The importer's own bug is never written and never reported as the user's refusal."""
    import dataclasses

    from trainverify_dsl import importers
    from trainverify_dsl.importers.emit import Line

    real = importers.FORMATS["hf"]

    def broken():  # noqa: ANN202 - an Importer
        def run(path, options, refusals):  # noqa: ANN001, ANN202
            draft = real.load()(path, options, refusals)
            return dataclasses.replace(draft, after=(Line("split output.weight [zz, -]"),))
        return run

    monkeypatch.setitem(importers.FORMATS, "hf", dataclasses.replace(real, load=broken))
    code, out, err = run_tvp(HF.argv())
    assert (code, out) == (2, "")
    assert "internal error: the plan made from" in err and "[TVP2" in err


def test_an_importer_crash_is_an_internal_error_without_a_traceback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from trainverify_dsl import importers

    def crashing():  # noqa: ANN202 - an Importer
        def run(path, options, refusals):  # noqa: ANN001, ANN202
            raise KeyError("boom")
        return run

    monkeypatch.setitem(importers.FORMATS, "hf",
                        dataclasses.replace(importers.FORMATS["hf"], load=crashing))
    code, out, err = run_tvp(HF.argv())
    assert (code, out) == (2, "")
    assert "internal error while importing" in err and "KeyError" in err
    assert "Traceback" not in err


def test_help_lists_the_formats() -> None:
    code, out, _ = run_tvp(["import", "--help"])
    assert code == 0
    for name in ("hf", "torchtitan", "galvatron", "nnscaler"):
        assert name in out
