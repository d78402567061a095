"""The parallel program (``ir/parallel.py``): the whole training step as IR data.

- ``ir/`` imports no torch and no project package but the span vocabulary;
- the program of every small shipped plan verifies, and its canonical text (stage graphs
  included; the reference step's is in ``tests/test_reference_golden.py``) is golden
  (``tests/golden/parallel/``; regenerate with ``python tests/test_parallel_program.py
  --update`` and review the diff);
- the verifier catches broken programs (a missing transfer, a reduction over the pipeline axis
  of a parameter one stage holds, an update at the wrong shape);
- the reference step's optimizer is the plan's `spec-optimizer`: a plan whose optimizer differs is a
  finding at its `optimizer` line, a plan with no `spec-optimizer` cannot agree;
- claims on `grad(...)` and `loss` are checked on values (docs/semantics.md §2.4).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOLDEN = ROOT / "tests" / "golden" / "parallel"
SMALL = ("mlp_tiny_dp", "mlp_tiny_zero", "mlp_dp_tp", "llama_tiny_tp", "llama_tiny_sp",
         "llama_tiny_cp", "llama_tiny_cp_zigzag", "deepseek_tiny_ep", "deepseek_tiny_pp",
         "deepseek_tiny_tp", "llama_tiny_interleaved", "llama_tiny_tied", "gpt2_tiny_tp")

IMPORT_PURITY = """
import sys, pkgutil, importlib
import trainverify_dsl.ir as ir
for m in pkgutil.iter_modules(ir.__path__):
    importlib.import_module(f"trainverify_dsl.ir.{m.name}")
bad = sorted(n for n in sys.modules if n == "torch" or n.startswith("torch.") or (
    n.startswith("trainverify_dsl.") and not n.startswith(("trainverify_dsl.ir",
    "trainverify_dsl.report.span"))))
bad = [n for n in bad if n not in ("trainverify_dsl.report", "trainverify_dsl.resources")]
print(",".join(bad))
"""


def test_ir_imports_no_torch_and_no_later_stage() -> None:
    done = subprocess.run([sys.executable, "-c", IMPORT_PURITY], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"ir/ pulls in {done.stdout.strip()}"


def _program(name: str):  # noqa: ANN202 - test helper
    from trainverify_dsl.api import prepare
    from trainverify_dsl.lower.lowering import lower
    from trainverify_dsl.lower.program import parallel_program

    setup = prepare(ROOT / "plans" / f"{name}.tvp")
    return parallel_program(lower(setup.plan, setup.fake_model, setup.fake_inputs))


class _Programs(dict):
    """Each plan lowered once, when a test first asks for it."""

    def __missing__(self, name: str):  # noqa: ANN204 - test helper
        self[name] = _program(name)
        return self[name]


@pytest.fixture(scope="module")
def programs() -> dict:
    return _Programs()


#: the DeepSeek plans lower in several seconds each: their golden checks are `slow`
GOLDEN_CASES = [pytest.param(n, marks=pytest.mark.slow) if n.startswith("deepseek") else n
                for n in SMALL]


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_program_verifies_and_matches_golden(programs: dict, name: str) -> None:
    from trainverify_dsl.ir.parallel import format_parallel, parallel_problems

    program = programs[name]
    assert parallel_problems(program) == []
    text = format_parallel(program)
    assert (GOLDEN / f"{name}.txt").read_text() == text


def test_golden_text_is_deterministic(programs: dict) -> None:
    from trainverify_dsl.ir.parallel import format_parallel

    again = _program("mlp_tiny_dp")
    assert format_parallel(again) == format_parallel(programs["mlp_tiny_dp"])


def test_verifier_finds_a_missing_transfer(programs: dict) -> None:
    from trainverify_dsl.ir.parallel import parallel_problems

    program = programs["deepseek_tiny_pp"]
    assert program.transfers, "the pipeline plan has transfers"
    broken = dataclasses.replace(program, transfers=program.transfers[1:])
    assert any("has no transfer" in p for p in parallel_problems(broken))


def test_verifier_finds_a_reduction_over_pp_of_a_one_stage_parameter(programs: dict) -> None:
    from trainverify_dsl.ir.parallel import GradSync, Source, parallel_problems

    program = programs["deepseek_tiny_pp"]
    param = next(p for p, _ in program.param_layouts if len(program.holders(p)) == 1)
    sync = GradSync("all_reduce", ("pp",), "sum", 0, (param,), Source(None))
    broken = dataclasses.replace(program, grad_syncs=program.grad_syncs + (sync,))
    assert any("reduced over pp" in p for p in parallel_problems(broken))


def test_verifier_accepts_only_the_embedding_group_over_pp(programs: dict) -> None:
    """§5.4: over the pipeline axis only an all-reduce over pp alone, of a parameter held on
    two or more pp ranks (the tied embedding), has a meaning."""
    from trainverify_dsl.ir.parallel import parallel_problems

    program = programs["llama_tiny_tied"]
    group = next(s for s in program.grad_syncs if s.axes == ("pp",))
    assert group.params == ("embed.weight",) and program.holding_ranks("embed.weight") == (0, 1)
    assert parallel_problems(program) == []
    for wrong in (dataclasses.replace(group, kind="reduce_scatter"),
                  dataclasses.replace(group, axes=("dp", "pp"))):
        syncs = tuple(wrong if s is group else s for s in program.grad_syncs)
        problems = parallel_problems(dataclasses.replace(program, grad_syncs=syncs))
        assert any("only the all-reduce of a tied parameter" in p for p in problems), problems


def test_verifier_finds_an_update_at_the_wrong_shape(programs: dict) -> None:
    from trainverify_dsl.ir.parallel import parallel_problems

    program = programs["llama_tiny_tp"]
    opt = program.optimizer
    other = next(u for u in opt.updates if u.graph != opt.updates[0].graph)
    wrong = dataclasses.replace(opt.updates[0], graph=other.graph)
    broken = dataclasses.replace(program, optimizer=dataclasses.replace(
        opt, updates=(wrong,) + opt.updates[1:]))
    assert any("is not the block's" in p for p in parallel_problems(broken))


# -- the reference step and claims, through `tvp simulate` ------------------------------------

MLP = """plan t
spec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1
{recipe}
mesh dp=2
microbatches 2
loss-scale 1/microbatches
split x [dp, -]
split target [dp, -]
all-reduce grad(params) over dp op=avg
{extra}
"""


def _simulate(tmp_path: Path, recipe: str, extra: str):  # noqa: ANN202 - test helper
    from trainverify_dsl.api import simulate_file

    path = tmp_path / "t.tvp"
    path.write_text(MLP.format(recipe=recipe, extra=extra))
    return simulate_file(path)


def test_matching_recipe_agrees(tmp_path: Path) -> None:
    result = _simulate(tmp_path, "spec-optimizer sgd lr=0.1", "optimizer sgd lr=0.1")
    assert result.agrees


def test_a_different_learning_rate_is_found_at_the_optimizer_line(tmp_path: Path) -> None:
    """`tvp lint` sees it first (TVP280), so the simulation stops with that diagnostic."""
    from trainverify_dsl.api import SimulationSetupError

    with pytest.raises(SimulationSetupError) as error:
        _simulate(tmp_path, "spec-optimizer sgd lr=0.1", "optimizer sgd lr=0.2")
    assert [(d.code.id, d.span.line) for d in error.value.diagnostics] == [("TVP280", 10)]


def test_a_plan_optimizer_without_a_spec_recipe_cannot_agree(tmp_path: Path) -> None:
    result = _simulate(tmp_path, "", "optimizer sgd lr=0.1")
    assert not result.agrees
    assert any("no `spec-optimizer`" in m.detail for m in result.mismatches)


def test_a_spec_recipe_without_a_plan_optimizer_cannot_agree(tmp_path: Path) -> None:
    """`tvp lint` sees it first (TVP280 at the `spec-optimizer`), so the simulation stops
    with that diagnostic."""
    from trainverify_dsl.api import SimulationSetupError

    with pytest.raises(SimulationSetupError) as error:
        _simulate(tmp_path, "spec-optimizer sgd lr=0.1", "")
    assert [(d.code.id, d.span.line) for d in error.value.diagnostics] == [("TVP280", 3)]


def test_a_malformed_recipe_is_a_lint_diagnostic_at_its_line(tmp_path: Path) -> None:
    from trainverify_dsl.plan import resolve_file

    path = tmp_path / "t.tvp"
    path.write_text(MLP.format(recipe="spec-optimizer sgd betas=(0.9, 0.95)",
                               extra="optimizer sgd lr=0.1"))
    found = {(d.code.name, d.span.line) for d in resolve_file(path).diagnostics}
    assert ("unknown-hyperparameter", 3) in found and ("missing-hyperparameter", 3) in found


@pytest.mark.parametrize(("claim", "holds"), [
    ("replicate grad(fc1.weight) over dp", True),       # all-reduced: every copy complete
    ("partial grad(fc1.weight) over dp op=sum", False),  # the copies' sum is 2x the spec's
    ("partial loss over dp op=avg", True),               # §4.6
    ("replicate loss over dp", False),                   # each rank holds its block's loss
])
def test_claims_on_gradients_and_loss_are_checked(tmp_path: Path, claim: str,
                                                   holds: bool) -> None:
    """A true claim agrees; a false one is found at its line, by the full-size layout pass
    (TVP407) before the simulation, or by the simulation's value check."""
    from trainverify_dsl.api import SimulationSetupError

    try:
        result = _simulate(tmp_path, "spec-optimizer sgd lr=0.1",
                           f"optimizer sgd lr=0.1\n{claim}")
    except SimulationSetupError as error:
        assert not holds
        assert any(d.code.id == "TVP407" and d.span.line == 11 for d in error.diagnostics)
        return
    assert result.agrees is holds, result.mismatches[:3]
    if not holds:
        assert any(m.check == "claims" and m.span.line == 11 for m in result.mismatches)


if __name__ == "__main__" and "--update" in sys.argv:
    from trainverify_dsl.ir.parallel import format_parallel

    GOLDEN.mkdir(parents=True, exist_ok=True)
    for plan in SMALL:
        (GOLDEN / f"{plan}.txt").write_text(format_parallel(_program(plan)))
        print(f"wrote {GOLDEN / plan}.txt")


# -- rank-batched evaluation equals rank-by-rank evaluation ------------------------------------


#: the DeepSeek plans take about 10 s each: `slow` (the fast loop keeps context parallelism)
@pytest.mark.parametrize("name", ["llama_tiny_cp", "llama_tiny_tied",
                                  pytest.param("deepseek_tiny_ep", marks=pytest.mark.slow),
                                  pytest.param("deepseek_tiny_pp", marks=pytest.mark.slow)])
def test_rank_batched_evaluation_equals_rank_by_rank(name: str) -> None:
    import numpy as np

    from trainverify_dsl.api import prepare, spec_optimizer
    from trainverify_dsl.ir.execute import evaluate_parallel
    from trainverify_dsl.lower.lowering import lower
    from trainverify_dsl.lower.program import parallel_program
    from trainverify_dsl.simulate.run import plan_states, random_inputs
    from trainverify_dsl.spec.trace import trace_training_step

    setup = prepare(ROOT / "plans" / f"{name}.tvp")
    program = parallel_program(lower(setup.plan, setup.fake_model, setup.fake_inputs))
    spec = trace_training_step(setup.fake_model, setup.input_specs, spec_optimizer(setup.plan),
                               reuse=False)
    rng = np.random.default_rng(3)
    values = random_inputs(spec.program.inputs, setup.real_model, rng)
    plan_states(program, values, rng)
    one = evaluate_parallel(program, values, batched=False)
    batched = evaluate_parallel(program, values, batched=True)
    assert one.losses == batched.losses
    for got, want in ((batched.grads, one.grads), (batched.updates, one.updates)):
        assert got.keys() == want.keys()
        for rank in want:
            assert got[rank].keys() == want[rank].keys()
            for key in want[rank]:
                np.testing.assert_array_equal(got[rank][key], want[rank][key])
    assert batched.observed.keys() == one.observed.keys()
