"""Shape reduction (docs/checking.md, "Shape reduction"; check/reduce.py): every op has a
class, an op without one makes a reduced proof inconclusive, the verdict names the classes
it relied on — and on generated plans, `tvp check`'s verdict at the reduced widths is the
verdict of simulating the plan at its full widths."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from trainverify_dsl import api
from trainverify_dsl.api import SimulationSetupError
from trainverify_dsl.ir import ops
from trainverify_dsl.ir.ops import OPS, REDUCTION_CLASSES, REDUCTION_MINIMUM
from trainverify_dsl.lower.findings import LoweringError
from trainverify_dsl.report.diagnostics import Severity

ROOT = Path(__file__).resolve().parents[1]
MEGATRON = ROOT / "stdlib" / "megatron.tvp"


def test_every_op_has_a_reduction_class_and_its_minimum():
    for op in OPS.values():
        assert op.reduction_class in REDUCTION_CLASSES, op.name
        minimum = REDUCTION_MINIMUM.get(op.reduction_class)
        assert op.min_sizes == (None if minimum is None else (minimum,)), op.name


def test_position_and_data_dependent_ops_are_not_called_uniform():
    assert OPS["arange"].reduction_class == "position"
    assert OPS["cumsum"].reduction_class == "position"
    assert OPS["embedding"].reduction_class == "gather"
    assert OPS["topk_indices"].reduction_class == "ordering"
    assert OPS["argmax"].reduction_class == "ordering"


def test_the_verdict_names_the_classes_its_reduction_relied_on():
    verdict = api.check_file(ROOT / "plans" / "mlp_tiny_dp.tvp", cache=False)
    assert verdict.verdict == "verified"
    (reduction,) = [a for a in verdict.assumptions if a.startswith("shape reduction")]
    assert "contraction (1)" in reduction and "elementwise" in reduction
    assert "not proven" in reduction


def test_an_op_without_a_class_makes_a_reduced_proof_inconclusive(
        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(OPS, "mm", dataclasses.replace(OPS["mm"], reduction_class=None))
    verdict = api.check_file(ROOT / "plans" / "mlp_tiny_dp.tvp", cache=False)
    assert verdict.verdict == "inconclusive"
    assert "mm have no shape-reduction class" in verdict.reason
    assert ops.lookup("mm").reduction_class is None  # the registry the checker reads


# -- generated plans: reduced verdict == full-size simulation ---------------------------------

#: one-line faults of the kinds real plans have (each keeps the plan free of layout errors
#: only sometimes: an error at full size must then be an error verdict too)
FAULTS = {
    "none": lambda text: text,
    "sum for avg": lambda text: text.replace("over dp op=avg", "over dp op=sum"),
    "no loss scale": lambda text: text.replace("loss-scale 1/microbatches\n", ""),
    "grad over tp": lambda text: text.replace("grad(params) over dp", "grad(params) over tp"),
    "plain row parallel": lambda text: text.replace("apply row_parallel_bias(fc2, tp)",
                                                    "split fc2.weight [-, tp]"),
}


def plan_text(dp: int, tp: int, microbatches: int, d_in: int, d_hidden: int, batch: int,
              fault: str) -> str:
    text = f"""plan generated
spec "stdlib/models/mlp.py:MLP" config mlp_small batch {batch} seq 1 d_in {d_in} d_hidden {d_hidden}
spec-optimizer sgd lr=0.1
mesh dp={dp}, tp={tp}
microbatches {microbatches}
loss-scale 1/microbatches
use "{MEGATRON}"
split x [dp, -]
split target [dp, -]
apply column_parallel_bias(fc1, tp)
apply row_parallel_bias(fc2, tp)
all-reduce grad(params) over dp op=avg
optimizer sgd lr=0.1
"""
    return FAULTS[fault](text)


def full_size(path: Path) -> str:
    """``agrees``, ``differs`` or ``errors`` of the plan simulated at its full widths, read
    as `tvp check` reads its numeric pre-check: a difference is a counterexample even beside
    layout errors; errors alone are an error."""
    try:
        result = api.simulate_file(path, shrink=False, stop_on_errors=False)
    except (SimulationSetupError, LoweringError):
        return "errors"
    if not result.agrees:
        return "differs"
    errors = [d for d in result.findings if d.severity is Severity.ERROR]
    return "errors" if errors else "agrees"


EXPECTED = {"agrees": "verified", "differs": "counterexample", "errors": "error"}


@settings(max_examples=8, deadline=None, derandomize=True, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dp=st.sampled_from([1, 2]), tp=st.sampled_from([2, 3]),
       microbatches=st.sampled_from([1, 2]), d_in=st.integers(2, 6),
       k=st.integers(1, 4), rows=st.integers(1, 2), fault=st.sampled_from(sorted(FAULTS)))
def test_the_reduced_verdict_is_the_full_size_simulation(
        tmp_path: Path, dp: int, tp: int, microbatches: int, d_in: int, k: int, rows: int,
        fault: str):
    d_hidden = tp * k + (1 if fault == "none" and k == 4 else 0)  # sometimes not divisible
    text = plan_text(dp, tp, microbatches, d_in, d_hidden, dp * microbatches * rows * 2, fault)
    path = tmp_path / f"generated_{dp}_{tp}_{microbatches}_{d_in}_{k}_{rows}.tvp"
    path.write_text(text)
    want = EXPECTED[full_size(path)]
    verdict = api.check_file(path, cache=False)
    assert verdict.verdict == want, (text, verdict.reason)
    if want == "verified":
        assert verdict.sizes, "the checker proved the plan at reduced widths"
