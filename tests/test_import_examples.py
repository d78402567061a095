"""Every example import (tests/import_support.py: CASES), end to end.

For each: the plan ``tvp import`` writes is its golden text; it lints clean; the layout pass
(``tvp lint --spec``, torch) finds nothing; the small ones simulate and agree with the spec;
and where the project ships a verified plan for the same parallelisation, the import means
exactly that plan (same layouts, collectives, algorithms, stages and optimizer once names and
source positions are set aside).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from import_support import CASES, DATA, ROOT, Case, imported, meaning, run_tvp

SMALL = [c for c in CASES if c.small]
#: Simulations that stay in the fast loop (the rest are also proven equal to shipped plans
#: below, or are slow).
FAST_SIMULATIONS = {"hf_llama_tiny_causal_lm"}


def by_name(case: Case) -> str:
    return case.name


@pytest.mark.parametrize("case", CASES, ids=by_name)
def test_the_import_is_its_golden_text(case: Case) -> None:
    assert imported(case) == case.golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("case", CASES, ids=by_name)
def test_the_written_plan_lints_clean(case: Case, tmp_path: Path) -> None:
    from trainverify_dsl.plan import lint_file

    output = tmp_path / f"{case.name}.tvp"
    code, out, err = run_tvp(case.argv(output))
    assert (code, out) == (0, ""), err
    assert output.read_text(encoding="utf-8") == case.golden.read_text(encoding="utf-8")
    assert [d for d in lint_file(output) if d.severity == "error"] == []
    assert run_tvp(["fmt", "--check", str(output)])[0] == 0


@pytest.mark.parametrize("case", [pytest.param(c, marks=[] if c.small else pytest.mark.slow)
                                  for c in CASES], ids=by_name)
def test_the_layout_pass_finds_nothing(case: Case) -> None:
    """``tvp lint --spec`` on the golden plan (full size: 30 s for the 8B ones)."""
    code, out, err = run_tvp(["lint", "--spec", str(case.golden)])
    assert code == 0, out + err


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=[] if c.name in FAST_SIMULATIONS else pytest.mark.slow)
    for c in SMALL], ids=by_name)
def test_small_imports_simulate_and_agree(case: Case) -> None:
    code, out, err = run_tvp(["simulate", str(case.golden), "--format", "json"])
    result = json.loads(out)
    assert (code, result["verdict"]) == (0, "agrees"), out + err


@pytest.mark.parametrize(("name", "shipped"), [
    ("hf_configuration_llama", "plans/llama_tiny_tp.tvp"),
    ("nnscaler_llama_tiny", "plans/llama_tiny_tp.tvp"),
])
def test_imports_mean_the_shipped_plan(name: str, shipped: str) -> None:
    """Transformers' Llama tp plan and nnScaler's Megatron-shaped plan on dp=2, tp=2 are the
    shipped (simulated, verified) llama_tiny_tp plan, statement for statement."""
    case = next(c for c in CASES if c.name == name)
    assert meaning(case.golden) == meaning(ROOT / shipped)


def test_galvatron_with_megatron_sequence_parallel_is_the_shipped_sp_plan(
        tmp_path: Path) -> None:
    """A Galvatron strategy on 4 devices (tp=2 consecutive, dp=2 DDP, vocabulary tp=2) with
    Galvatron's --sequence-parallel is plans/llama_tiny_sp.tvp."""
    strategy = {"pp_deg": 1, "tp_sizes_enc": "2,2", "tp_consecutive_flags": "1,1",
                "dp_types_enc": "0,0", "use_sp": "0,0", "checkpoint": "0,0", "global_bsz": 4,
                "chunks": 1, "pp_division": "2", "pipeline_type": "pipedream_flush",
                "default_dp_type": "ddp", "vtp": 2, "vsp": 0, "embed_sdp": 0}
    source = tmp_path / "galvatron_sp.json"
    source.write_text(json.dumps(strategy, indent=4), encoding="utf-8")
    output = tmp_path / "galvatron_sp.tvp"
    code, _, err = run_tvp(["import", "galvatron", str(source), "--config", "llama_tiny",
                            "--seq", "8", "--world-size", "4", "--sequence-parallel",
                            "--optimizer", "sgd lr=0.01", "-o", str(output)])
    assert code == 0, err
    assert meaning(output) == meaning(ROOT / "plans/llama_tiny_sp.tvp")


def test_the_json_and_python_forms_of_a_plan_import_alike(tmp_path: Path) -> None:
    """transformers' configuration class and the same plans as JSON give one plan."""
    python = next(c for c in CASES if c.name == "hf_configuration_llama")
    plans = {"base_model_tp_plan": {}, "base_model_pp_plan": {}}
    source = json.loads((DATA / "hf_llama3_8b_config.json").read_text(encoding="utf-8"))
    for key in plans:
        plans[key] = source[key]
    as_json = tmp_path / "hf_configuration_llama.json"
    as_json.write_text(json.dumps(plans), encoding="utf-8")
    argv = python.argv()
    argv[2] = str(as_json)
    code, out, err = run_tvp(argv)
    assert code == 0, err
    body = [line for line in out.splitlines() if not line.startswith("#")]
    assert body == [line for line in imported(python).splitlines() if not line.startswith("#")]


def test_importing_does_not_import_torch() -> None:
    """Like `tvp lint`: the importers and the emitter's lint run without torch or numpy."""
    import subprocess
    import sys

    argv = next(c for c in CASES if c.name == "tt_llama_tiny_sp").argv()
    code = ("import sys; from trainverify_dsl.cli.main import main; "
            f"main({argv!r}); "
            "print(sorted(m for m in ('numpy', 'torch', 'z3') if m in sys.modules), "
            "file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
