"""``tvp spec``: summaries, JSON fields, canonical IR, diagnostics instead of tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

from trainverify_dsl import PROJECT_ROOT
from trainverify_dsl.cli.main import main


def test_json_summary_of_a_tiny_model(capsys) -> None:
    assert main(["spec", "llama_tiny", "--format", "json", "--seq", "8"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["params"] == 19_616
    assert summary["nodes"]["unique"] < summary["nodes"]["expanded"]
    assert summary["block_groups"] == [{"graph": "block0", "layers": 2}]
    assert summary["ops"]["mm"] > 0


def test_text_summary_and_ir(capsys) -> None:
    assert main(["spec", "stdlib/models/mlp.py:MLP", "--config", "mlp_tiny", "--ir"]) == 0
    out = capsys.readouterr().out
    assert "parameters" in out and "trace time" in out
    assert "graph step(" in out and 'param "' in out


def test_bad_reference_is_a_diagnostic_not_a_traceback(capsys) -> None:
    assert main(["spec", "lama_tiny"]) == 2
    err = capsys.readouterr().err
    assert "[TVP301]" in err and "did you mean 'llama_tiny'" in err
    assert "Traceback" not in err


def test_bad_config_in_json(capsys) -> None:
    assert main(["spec", "stdlib/models/llama.py:Llama", "--config", "x", "--format",
                 "json"]) == 2
    assert json.loads(capsys.readouterr().out)["diagnostics"][0]["code"] == "TVP302"


def test_module_does_not_import_torch() -> None:
    code = ("import sys, trainverify_dsl.cli.spec_cmd as m, argparse; "
            "m.configure(argparse.ArgumentParser()); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, text=True,
                         capture_output=True, check=True).stdout
    assert out.strip() == "False"
