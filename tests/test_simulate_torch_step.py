"""The reference step's IR checked against eager torch on every simulation (issue 14, item 2).

``simulate.torch_step`` runs the spec model with torch.autograd and steps torch.optim from the
same states; ``check_reference`` must accept the traced reference on every optimizer recipe and
refuse a reference that is wrong by a relative 1e-6 anywhere (the tolerance is a literal here),
and ``tvp simulate`` then gives no verdict (exit 2) instead of "agrees" or "differs".
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from trainverify_dsl.api import prepare
from trainverify_dsl.cli.main import main
from trainverify_dsl.simulate.run import random_inputs
from trainverify_dsl.simulate.torch_step import ReferenceDisagrees, check_reference
from trainverify_dsl.spec import optim
from trainverify_dsl.spec.trace import trace_training_step

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-9
FLOOR = 1e-6

RECIPES = {
    "sgd": optim.optimizer_config("sgd", {"lr": 0.1}),
    "sgd-momentum-nesterov": optim.optimizer_config(
        "sgd", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight-decay": 0.01}),
    "sgd-momentum-dampening": optim.optimizer_config(
        "sgd", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1}),
    "adam": optim.optimizer_config("adam", {"lr": 0.01, "weight-decay": 0.1}),
    "adamw": optim.optimizer_config("adamw", {"lr": 0.01, "betas": (0.8, 0.9), "eps": 1e-6}),
    "none": None,
}


def _case(plan: str, recipe: optim.Optimizer | None) -> tuple:
    setup = prepare(ROOT / "plans" / plan, shrink=None)
    spec = trace_training_step(setup.fake_model, setup.input_specs, recipe, reuse=False)
    values = random_inputs(spec.program.inputs, setup.real_model, np.random.default_rng(1))
    data = [name for name in setup.input_specs]
    return spec.evaluate(values), setup.real_model, values, data


@pytest.fixture(scope="module")
def cases() -> dict:
    return {name: _case("mlp_tiny_dp.tvp", recipe) for name, recipe in RECIPES.items()}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_traced_reference_is_eager_torch(name: str, cases: dict) -> None:
    want, model, values, data = cases[name]
    compared = check_reference(want, model, values, data, RECIPES[name], TOL, FLOOR)
    n_params = 4
    states = len(RECIPES[name].states) if RECIPES[name] else 0
    # loss, a gradient per parameter, and (with an optimizer) its update and new states
    assert compared == 1 + n_params + (n_params * (1 + states) if RECIPES[name] else 0)


def test_a_llama_reference_is_eager_torch() -> None:
    recipe = RECIPES["adamw"]
    want, model, values, data = _case("llama_tiny_tp.tvp", recipe)
    assert check_reference(want, model, values, data, recipe, TOL, FLOOR) > 20


@pytest.mark.parametrize("name", ["loss", "grad(fc2.weight)", "new(fc1.bias)",
                                  "new(m(fc1.weight))", "new(v(fc2.bias))"])
def test_a_reference_wrong_by_a_relative_1e6_is_refused(name: str, cases: dict) -> None:
    want, model, values, data = cases["adam"]
    wrong = dict(want)
    value = np.array(want[name], dtype=np.float64)
    flat = value.reshape(-1)
    k = int(np.argmax(np.abs(flat)))
    flat[k] *= 1 + 1e-6
    wrong[name] = value
    with pytest.raises(ReferenceDisagrees, match=re.escape(f"`{name}`")):
        check_reference(wrong, model, values, data, RECIPES["adam"], TOL, FLOOR)


def test_a_reference_with_another_recipe_is_refused(cases: dict) -> None:
    """The reference traced with momentum 0.9, checked as if its recipe had 0.8."""
    want, model, values, data = cases["sgd-momentum-dampening"]
    other = optim.optimizer_config("sgd", {"lr": 0.1, "momentum": 0.8, "dampening": 0.1})
    with pytest.raises(ReferenceDisagrees, match="new"):
        check_reference(want, model, values, data, other, TOL, FLOOR)


def test_a_missing_output_is_refused(cases: dict) -> None:
    want, model, values, data = cases["sgd"]
    partial = {k: v for k, v in want.items() if k != "new(fc2.bias)"}
    with pytest.raises(ReferenceDisagrees, match="new\\(fc2.bias\\)"):
        check_reference(partial, model, values, data, RECIPES["sgd"], TOL, FLOOR)


def test_simulate_gives_no_verdict_when_the_reference_is_wrong(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A reference IR that is off (here: its loss doubled) is neither "agrees" nor "differs"."""
    from trainverify_dsl.spec.program import SpecProgram

    evaluate = SpecProgram.evaluate

    def doubled_loss(self, values):  # noqa: ANN001, ANN202 - a patched method
        out = dict(evaluate(self, values))
        out["loss"] = out["loss"] * 2
        return out

    monkeypatch.setattr(SpecProgram, "evaluate", doubled_loss)
    assert main(["simulate", str(ROOT / "plans" / "mlp_tiny_dp.tvp")]) == 2
    captured = capsys.readouterr()
    assert "no verdict" in captured.err and "`loss`" in captured.err
    assert "agrees" not in captured.out and "DIFFERS" not in captured.out
