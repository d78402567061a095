"""Hostile models and arguments for ``tvp spec``: every failure is a diagnostic naming the
model (its file and, when known, the line) or the op, with exit code 2; never a traceback,
never torch's own dumps on stderr.

The tiny models live in one file written to a temporary directory; cases run in process
(``main([...])``) so torch is imported once, plus one subprocess for the real exit path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainverify_dsl import PROJECT_ROOT
from trainverify_dsl.cli.main import main

MODELS = textwrap.dedent('''\
    import sys
    import torch
    from torch import nn


    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def input_specs(self, batch, seq):
            return {"x": ((batch, 4), torch.float32)}

        def forward(self, x):
            return self.lin(x).sum()


    class NonScalar(Tiny):
        def forward(self, x):  # LINE non-scalar
            return self.lin(x)


    class TupleOut(Tiny):
        def forward(self, x):
            return self.lin(x).sum(), x


    class NoneOut(Tiny):
        def forward(self, x):
            return None


    class IntOut(Tiny):
        def forward(self, x):
            return self.lin(x).sum().long()


    class FFT(Tiny):
        def forward(self, x):
            return torch.fft.fft(self.lin(x)).abs().sum()  # LINE fft


    class DataDependent(Tiny):
        def forward(self, x):
            y = self.lin(x)
            if y.sum() > 0:  # LINE branch
                return y.sum()
            return -y.sum()


    class Item(Tiny):
        def forward(self, x):
            return self.lin(x).sum() * x.sum().item()  # LINE item


    class Raises(Tiny):
        def forward(self, x):
            raise RuntimeError("boom")  # LINE raises


    class Exits(Tiny):
        def forward(self, x):
            sys.exit(5)  # LINE exits


    class NoInputSpecs(nn.Module):
        def forward(self, x):
            return x.sum()


    class SpecsRaise(Tiny):
        def input_specs(self, batch, seq):
            raise ValueError("no such shape")


    class SpecsBadDtype(Tiny):
        def input_specs(self, batch, seq):
            return {"x": ((batch, 4), "float32")}


    class SpecsFloatShape(Tiny):
        def input_specs(self, batch, seq):
            return {"x": ((batch, 4.5), torch.float32)}


    class SpecsNotMapping(Tiny):
        def input_specs(self, batch, seq):
            return [batch, seq]


    class Chatty(Tiny):
        def forward(self, x):
            print("hello from forward")
            return self.lin(x).sum()


    class Effects(Tiny):
        def forward(self, x):
            torch.ops.aten._print("step")  # LINE effects
            return self.lin(x).sum()


    class BufferWrite(Tiny):
        def __init__(self):
            super().__init__()
            self.register_buffer("acc", torch.zeros(4))

        def forward(self, x):
            h = self.lin(x)
            self.acc.add_(h.detach().sum(0))  # LINE buffer
            return h.mean()


    class NoGradBufferWrite(BufferWrite):
        def forward(self, x):
            h = self.lin(x)
            with torch.no_grad():  # export keeps it in a no-grad region until decomposed
                self.acc.add_(h.sum(0))
            return h.mean()


    class Dropout(Tiny):
        def forward(self, x):
            return torch.nn.functional.dropout(self.lin(x), 0.5).mean()  # LINE dropout


    class NoParams(nn.Module):
        def input_specs(self, batch, seq):
            return {"x": ((batch, 4), torch.float32)}

        def forward(self, x):
            return (x * x).mean()


    class NotAModule:
        pass


    def helper():
        return 1
''')


def line_of(marker: str) -> int:
    return next(i for i, text in enumerate(MODELS.splitlines(), 1) if f"# LINE {marker}" in text)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("spec_models")
    (directory / "models.py").write_text(MODELS, encoding="utf-8")
    (directory / "syntax.py").write_text("import torch\nclass X(:\n", encoding="utf-8")
    (directory / "exits.py").write_text("raise SystemExit(3)\n", encoding="utf-8")
    return directory


def spec_run(capsys, *argv: str) -> tuple[int, str]:
    """``tvp spec`` on the temporary model files, which lie outside the project: allowed
    explicitly (tests/test_spec_confinement.py covers the refusal)."""
    code = main(["spec", *argv, "--allow-model-outside-root"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


#: (arguments after the model file, code, line marker or None, words the message holds)
MODEL_CASES = [
    (":Tiny", None, None, ("parameters",)),
    (":NonScalar", "TVP306", "non-scalar", ("shape (1, 4)", "scalar training loss")),
    (":TupleOut", "TVP306", None, ("a tuple of 2 values",)),
    (":NoneOut", "TVP306", None, ("returns None",)),
    (":IntOut", "TVP306", None, ("int64",)),
    (":FFT", "TVP304", "fft", ("aten._fft_r2c",)),
    (":DataDependent", "TVP305", "branch", ("value-dependent",)),
    (":Item", "TVP305", "item", ("value-dependent",)),
    (":Raises", "TVP306", "raises", ("RuntimeError: boom",)),
    (":Exits", "TVP306", "exits", ("SystemExit: 5",)),
    (":NoInputSpecs", "TVP307", None, ("has no input_specs",)),
    (":SpecsRaise", "TVP307", None, ("ValueError: no such shape",)),
    (":SpecsBadDtype", "TVP307", None, ("dtype 'float32'",)),
    (":SpecsFloatShape", "TVP307", None, ("not a sequence of integers",)),
    (":SpecsNotMapping", "TVP307", None, ("non-empty mapping",)),
    (":NotAModule", "TVP301", None, ("not a torch.nn.Module subclass",)),
    (":helper", "TVP301", None, ("is a function",)),
    (":Nope", "TVP301", None, ("has no class 'Nope'",)),
    (":Tiny --config tiny", "TVP302", None, ("from_config_name",)),
    (":Tiny --batch 0", "TVP307", None, ("batch must be a whole number of at least 1",)),
    (":Tiny --batch -3", "TVP307", None, ("got -3",)),
    (":Tiny --seq 0", "TVP307", None, ("seq must be",)),
    (f":Tiny --batch {10**20}", "TVP307", None, ("at most 9223372036854775807",)),
]


@pytest.mark.parametrize("case", MODEL_CASES, ids=lambda c: c[0].strip(":"))
def test_bad_models_are_diagnostics(case, models, capsys) -> None:
    suffix, code, marker, words = case
    ref, *options = suffix.split()
    status, output = spec_run(capsys, str(models / "models.py") + ref, *options)
    assert "Traceback" not in output and "def forward" not in output
    for word in words:
        assert word in output, output
    if code is None:
        assert status == 0, output
        return
    assert status == 2 and f"[{code}]" in output, output
    first = output.splitlines()[0]
    assert "models.py" in first, first  # names the model, not "<model>"
    if marker is not None:
        assert f"models.py:{line_of(marker)}:" in first, first


@pytest.mark.parametrize("argv, code, words", [
    (["nope"], "TVP301", "neither file.py:Class nor a known config"),
    (["missing.py:X"], "TVP301", "not found"),
    (["syntax.py:X"], "TVP303", "SyntaxError"),
    (["exits.py:X"], "TVP303", "SystemExit: 3"),
    (["llama_tiny", "--config", "nope"], "TVP302", "unknown config 'nope'"),
    (["stdlib/models/llama.py:Llama"], "TVP303", "pass --config NAME"),
    (["stdlib/models/llama.py:nn"], "TVP301", "is a module, not a torch.nn.Module"),
    (["mlp_tiny", "--seq", "-1"], "TVP307", "seq must be a whole number of at least 1"),
    (["llama_tiny", "--seq", "100000"], "TVP307", "max_seq_len"),
])
def test_bad_references_are_diagnostics(argv, code, words, models, capsys,
                                        monkeypatch) -> None:
    monkeypatch.chdir(models)
    status, output = spec_run(capsys, *argv)
    assert status == 2 and f"[{code}]" in output and words in output, output
    assert "Traceback" not in output


def test_json_diagnostics_for_a_non_scalar_loss(models, capsys) -> None:
    status, output = spec_run(capsys, f"{models / 'models.py'}:NonScalar", "--format", "json")
    assert status == 2
    (item,) = json.loads(output)["diagnostics"]
    assert item["code"] == "TVP306" and item["file"].endswith("models.py")


def test_model_output_never_corrupts_the_json_summary(models, capsys) -> None:
    assert main(["spec", f"{models / 'models.py'}:Chatty", "--format", "json",
                 "--allow-model-outside-root"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["params"] == 20
    assert "hello from forward" in captured.err


def test_cli_process_exit_code_and_clean_stderr(models) -> None:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "trainverify_dsl", "spec", "models.py:DataDependent"],
        cwd=models, env=env, text=True, capture_output=True, timeout=300)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"{models / 'models.py'}:{line_of('branch')}:1: error:")
    assert "[TVP305]" in lines[0] and len(lines) == 2, result.stderr  # diagnostic + help only


#: a dp=2 plan's statements with the data replicated on every rank
REPLICATED = "all-reduce grad(params) over dp op=avg\n"


def _run_plan(command: list[str], models: Path, cls: str, capsys, body: str = REPLICATED
              ) -> tuple[int, str]:
    """``command`` on a dp=2 plan over the model ``cls`` with the statements ``body``: the
    exit code and everything printed."""
    plan = models / f"{cls.lower()}.tvp"
    plan.write_text(f'plan p\nspec "models.py:{cls}" batch 4 seq 1\n'
                    f"spec-optimizer sgd lr=0.1\nmesh dp=2\n{body}optimizer sgd lr=0.1\n",
                    encoding="utf-8")
    exit_code = main([*command, str(plan), "--allow-model-outside-root"])
    out = capsys.readouterr()
    return exit_code, out.out + out.err


PLAN_MODEL_CASES = [("Effects", "TVP304", "effects", "'_print'"),
                    ("DataDependent", "TVP305", "branch", "value-dependent"),
                    ("Raises", "TVP306", "raises", "RuntimeError: boom"),
                    # a running statistic written in forward: state the spec does not model
                    # (the reference silently disagreed with eager torch on a gradient)
                    ("BufferWrite", "TVP304", "buffer", "writes the buffer `acc` in place")]


@pytest.mark.parametrize("command", [["lint", "--spec"], ["simulate"], ["check"]])
@pytest.mark.parametrize("case", PLAN_MODEL_CASES, ids=lambda c: c[0])
def test_a_plans_model_failing_in_the_capture_is_a_diagnostic(command, case, models, capsys
                                                              ) -> None:
    """The plan's capture of the forward (the layout pass, before the spec's trace) met
    an effect token (``aten._print``), a branch on a tensor value, or a forward that raises,
    and let NotImplementedError, torch's guard error or the model's own exception out as an
    internal error (exit 2; ``api.check`` raised). Every plan command now reports it at the
    model line, as ``tvp spec`` does."""
    cls, code, marker, words = case
    exit_code, text = _run_plan(command, models, cls, capsys,
                                "split x [dp, -]\nall-reduce grad(params) over dp op=sum\n")
    assert exit_code == 1, text
    assert f"models.py:{line_of(marker)}:" in text and f"[{code}]" in text, text
    assert words in text, text
    assert "internal error" not in text and "Traceback" not in text, text


@pytest.mark.parametrize("command", [["simulate"], ["check"]])
def test_a_random_op_in_the_plans_stages_is_a_diagnostic(command, models, capsys) -> None:
    """Dropout (and randn, rand, randperm, ...) in forward: the plan's stage programs met it
    before the spec's trace did, and `tvp simulate` / `tvp check` ended with "internal error:
    UnsupportedOps: aten.native_dropout" (exit 2, no place; found by an outside user). Now
    TVP304 at the model line, as `tvp spec` and `tvp run-distributed` said."""
    exit_code, text = _run_plan(command, models, "Dropout", capsys)
    assert exit_code == 1, text
    assert f"models.py:{line_of('dropout')}:" in text and "[TVP304]" in text, text
    assert "native_dropout" in text and "internal error" not in text, text


@pytest.mark.parametrize("command", [["lint", "--spec"], ["check"]])
def test_a_buffer_written_under_no_grad_is_a_diagnostic(command, models, capsys) -> None:
    """`with torch.no_grad(): self.acc.add_(h.sum(0))`: `tvp check` stopped with "the
    reference step's IR differs from eager torch on grad(...)" (exit 2) and the oracle with a
    traceback (found by an outside user). Now TVP304, naming the buffer."""
    exit_code, text = _run_plan(command, models, "NoGradBufferWrite", capsys)
    assert exit_code == 1, text
    assert "[TVP304]" in text and "writes the buffer `acc` in place" in text, text
    assert "internal error" not in text and "eager torch" not in text, text
    status, output = spec_run(capsys, str(models / "models.py") + ":NoGradBufferWrite")
    assert status != 0 and "[TVP304]" in output, output
    # the write's frame after decomposition is FX's generated code, which is no model line
    assert "<eval_with_key>" not in output and "models.py:" in output, output


def test_a_plan_over_a_model_without_parameters_is_a_diagnostic(models, capsys) -> None:
    """A model with no parameter has no fake mode to take from them: prepare raised
    StopIteration (an internal error). Now the plan's gradient statement names nothing."""
    plan = models / "noparams.tvp"
    plan.write_text('plan p\nspec "models.py:NoParams" batch 4 seq 1\n'
                    "spec-optimizer sgd lr=0.1\nmesh dp=2\nsplit x [dp, -]\n"
                    "all-reduce grad(params) over dp op=sum\noptimizer sgd lr=0.1\n",
                    encoding="utf-8")
    exit_code = main(["lint", "--spec", str(plan), "--allow-model-outside-root"])
    text = "".join(capsys.readouterr())
    assert exit_code == 1 and "[TVP401]" in text and "internal error" not in text, text
