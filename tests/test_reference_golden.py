"""The reference step of every small shipped plan is golden IR text.

The reference step (``spec/trace.py``) is the single-device training step the plan is compared
with: forward, loss, backward and the spec's optimizer, with the plan's marked points
(``point:<point>`` outputs) as named values. Its canonical text (``ir.program.format_program``,
repeated layers as calls of one body) is kept in ``tests/golden/reference/``; a change to the
tracer, the converter or an op's decomposition shows up as a diff to review. Regenerate with
``python tests/test_reference_golden.py --update``.

The golden text is not trusted on its own: the same program, inlined, is what ``tvp simulate``
evaluates, and ``tests/test_simulate_torch_step.py`` checks it against eager torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOLDEN = ROOT / "tests" / "golden" / "reference"
SMALL = ("mlp_tiny_dp", "mlp_tiny_zero", "mlp_dp_tp", "llama_tiny_tp", "llama_tiny_sp",
         "llama_tiny_cp", "deepseek_tiny_ep", "deepseek_tiny_pp", "deepseek_tiny_tp",
         "gpt2_tiny_tp")


def reference_step(name: str, reuse: bool = True):  # noqa: ANN201 - test helper
    """The reference step of a shipped plan as ``tvp simulate`` builds it: marked points from
    the lowered parallel program, the optimizer from the plan's ``spec-optimizer``."""
    from trainverify_dsl.api import prepare, spec_optimizer
    from trainverify_dsl.lower.lowering import lower
    from trainverify_dsl.lower.program import parallel_program
    from trainverify_dsl.simulate.run import reference_points
    from trainverify_dsl.spec.trace import trace_training_step

    setup = prepare(ROOT / "plans" / f"{name}.tvp")
    program = parallel_program(lower(setup.plan, setup.fake_model, setup.fake_inputs))
    points = reference_points(program)
    step = trace_training_step(setup.fake_model, setup.input_specs, spec_optimizer(setup.plan),
                               reuse=reuse, points=points)
    return step, setup, points


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow)
                                  if n.startswith("deepseek") else n for n in SMALL])
def test_reference_step_matches_golden(name: str) -> None:
    from trainverify_dsl.ir.program import format_program, program_problems

    step, _, points = reference_step(name)
    assert program_problems(step.program) == []
    named = {out[len("point:"):] for out, _ in step.program.outputs if out.startswith("point:")}
    assert named == set(points), f"{name}: the marked points are not the named values"
    assert (GOLDEN / f"{name}.txt").read_text() == format_program(step.program)


@pytest.mark.parametrize("name", ("llama_tiny_tp",
                                  pytest.param("deepseek_tiny_pp", marks=pytest.mark.slow)))
def test_golden_form_computes_what_simulate_evaluates(name: str) -> None:
    """The golden (calls of one layer body) and the flat trace ``tvp simulate`` evaluates are
    the same step: equal outputs on the same random values."""
    from trainverify_dsl.simulate.run import random_inputs

    calls, setup, _ = reference_step(name, reuse=True)
    flat, _, _ = reference_step(name, reuse=False)
    assert len(calls.program.graphs) < len(flat.program.graphs) or \
        len(calls.program.calls) > len(calls.program.graphs)
    values = random_inputs(flat.program.inputs, setup.build_real(), np.random.default_rng(5))
    a, b = calls.evaluate(values), flat.evaluate(values)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-12, atol=1e-12, err_msg=key)


if __name__ == "__main__" and "--update" in sys.argv:
    from trainverify_dsl.ir.program import format_program

    GOLDEN.mkdir(parents=True, exist_ok=True)
    for plan in SMALL:
        (GOLDEN / f"{plan}.txt").write_text(format_program(reference_step(plan)[0].program))
        print("wrote", GOLDEN / f"{plan}.txt")
