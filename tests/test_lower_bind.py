"""Binding errors of the lowering (``lower/bind.py``): plan names resolved against the spec model
``tests/models/tiny_nets.py:TwoLinear`` (``fc1.weight [8, 4]``, ``fc2.weight [4, 8]``, no
biases; inputs ``x``, ``target [batch, seq, 4]``). Every error is a ``LoweringError`` whose
findings carry the statement's plan span and, for names, the closest existing names."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pytest

from trainverify_dsl.api import prepare
from trainverify_dsl.lower.findings import Finding, LoweringError
from trainverify_dsl.lower.lowering import Lowered, lower

# Finding codes: the short keys of lower/findings.py, being renamed to the registered names
# of report/codes_lower.py; either spelling is accepted.
UNBOUND = {"binding", "unbound-name"}
NOT_DIVISIBLE = {"binding", "split-not-divisible"}
PARTIAL_INPUT = {"binding", "partial-input"}

HEADER = 'plan t\nspec "tests/models/tiny_nets.py:TwoLinear" batch 4 seq 2\n'


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def write(tmp_path: Path, body: str, mesh: str = "mesh dp=2, tp=2") -> Path:
    path = tmp_path / "t.tvp"
    path.write_text(HEADER + mesh + "\n" + textwrap.dedent(body).strip() +
                    "\noptimizer sgd lr=0.1\n")
    return path


def lowered(path: Path) -> Lowered:
    setup = prepare(path)
    return lower(setup.plan, setup.fake_model, setup.fake_inputs)


def errors(path: Path) -> tuple[Finding, ...]:
    with pytest.raises(LoweringError) as info:
        lowered(path)
    return info.value.findings


def line_of(path: Path, statement: str) -> int:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith(statement):
            return number
    raise AssertionError(statement)


def at_statement(finding: Finding, path: Path, statement: str) -> bool:
    span = finding.span
    return span is not None and Path(span.file) == path and \
        span.line == line_of(path, statement) and span.col == 1


# -- unknown names ----------------------------------------------------------------------------


def test_misspelt_parameter_in_a_split(tmp_path: Path) -> None:
    path = write(tmp_path, "split fc1.weihgt [tp, -]")
    (finding,) = errors(path)
    assert finding.code.name in UNBOUND
    assert "`fc1.weihgt` names no parameter" in finding.message
    assert at_statement(finding, path, "split fc1.weihgt")
    assert finding.span.end_col > finding.span.col
    assert finding.help is not None and finding.help.startswith("did you mean `fc1.weight`")


def test_unknown_module_in_a_parameter_name_suggests_the_closest(tmp_path: Path) -> None:
    path = write(tmp_path, "split fc3.weight [tp, -]")
    (finding,) = errors(path)
    assert finding.code.name in UNBOUND
    assert "did you mean" in finding.help
    assert "`fc1.weight`" in finding.help and "`fc2.weight`" in finding.help


def test_a_name_nothing_resembles_has_no_help(tmp_path: Path) -> None:
    path = write(tmp_path, "split zzzzzzzz [tp, -]")
    (finding,) = errors(path)
    assert finding.code.name in UNBOUND and finding.help is None


def test_every_unknown_name_is_reported_in_statement_order(tmp_path: Path) -> None:
    path = write(tmp_path, "split fc1.weihgt [tp, -]\nsplit fc2.wieght [-, tp]")
    found = errors(path)
    assert [f.span.line for f in found] == [line_of(path, "split fc1.weihgt"),
                                            line_of(path, "split fc2.wieght")]
    assert "`fc2.weight`" in found[1].help


def test_unknown_module_boundary_in_a_collective(tmp_path: Path) -> None:
    path = write(tmp_path, "all-reduce fc3.out over tp")
    (finding,) = errors(path)
    assert finding.code.name in UNBOUND
    assert "`fc3.out` names no module boundary" in finding.message
    assert at_statement(finding, path, "all-reduce fc3.out")
    assert "`fc2.out`" in finding.help or "`fc1.out`" in finding.help


@pytest.mark.parametrize(("statement", "suggestion"), [
    ("all-reduce fc1.outt over tp", "`fc1.out`"),
    ("copy fc2.inn over tp", "`fc2.in`"),
    ("all-gather fc9.in over tp dim=1", "`fc1.in`"),
])
def test_misspelt_boundaries_in_collectives(tmp_path: Path, statement: str,
                                            suggestion: str) -> None:
    path = write(tmp_path, statement)
    (finding,) = errors(path)
    assert finding.code.name in UNBOUND
    assert at_statement(finding, path, statement.split(" over")[0])
    assert suggestion in finding.help


@pytest.mark.parametrize("statement", [
    "all-reduce grad(fc3.weight) over dp",
    "all-reduce grad(fc*.bias) over dp op=avg",
    "reduce-scatter grad(fc1.weight.x) over dp dim=0",
    "split grad(fc9.weight) [tp, -]",
])
def test_gradient_patterns_that_select_nothing(tmp_path: Path, statement: str) -> None:
    path = write(tmp_path, statement)
    (finding,) = errors(path)
    assert finding.code.name in UNBOUND
    assert "names no gradient" in finding.message
    assert at_statement(finding, path, statement.split(" [")[0].split(" over")[0])
    assert finding.help is not None and "grad(fc" in finding.help


def test_gradient_patterns_that_select_parameters(tmp_path: Path) -> None:
    path = write(tmp_path, "all-reduce grad(fc*.weight) over dp op=avg\n"
                           "all-reduce grad(params) over tp op=avg")
    binding = lowered(path).binding
    assert [names for _, names in binding.grad_statements] == [
        ("fc1.weight", "fc2.weight"), ("fc1.weight", "fc2.weight")]


def test_unknown_module_of_an_algorithm(tmp_path: Path) -> None:
    path = write(tmp_path, "algorithm vocab-parallel-embedding for embed over tp")
    (finding,) = errors(path)
    assert finding.code.name in UNBOUND and "names no module" in finding.message
    assert at_statement(finding, path, "algorithm")


# -- divisibility (Rule 2.1) --------------------------------------------------------------------


def test_split_not_dividing_a_parameter_dimension(tmp_path: Path) -> None:
    path = write(tmp_path, "split fc1.weight [tp, -]", mesh="mesh tp=3")
    (finding,) = errors(path)
    assert finding.code.name in NOT_DIVISIBLE
    assert "`fc1.weight` dimension 0 has size 8, not divisible by tp (3)" in finding.message
    assert at_statement(finding, path, "split fc1.weight")


def test_split_over_two_axes_not_dividing(tmp_path: Path) -> None:
    path = write(tmp_path, "split fc2.weight [(dp, tp), -]", mesh="mesh dp=2, tp=4")
    (finding,) = errors(path)
    assert finding.code.name in NOT_DIVISIBLE
    assert "size 4" in finding.message and "dp, tp (8)" in finding.message


def test_batch_split_with_microbatches_not_dividing(tmp_path: Path) -> None:
    path = write(tmp_path, "microbatches 4\nsplit x [dp, -, -]\nsplit target [dp, -, -]")
    found = errors(path)
    assert [f.code.name in NOT_DIVISIBLE for f in found] == [True, True]
    assert "`x` dimension 0 has size 4, not divisible by dp x microbatches (8)" in \
        found[0].message
    assert at_statement(found[0], path, "split x") and at_statement(found[1], path,
                                                                    "split target")


def test_split_of_a_dimension_the_parameter_does_not_have(tmp_path: Path) -> None:
    path = write(tmp_path, "split fc1.weight [-, -, tp]")
    (finding,) = errors(path)
    assert finding.code.name in NOT_DIVISIBLE | UNBOUND
    assert "`fc1.weight` has 2 dimensions" in finding.message
    assert at_statement(finding, path, "split fc1.weight")


def test_split_with_more_entries_than_dimensions(tmp_path: Path) -> None:
    path = write(tmp_path, "split fc1.weight [tp, -, -]\ncopy fc1.in over tp\n"
                           "split fc2.weight [-, tp]\nall-reduce fc2.out over tp")
    try:
        lowered(path)
    except LoweringError as error:
        assert "dimensions" in error.findings[0].message
        return
    raise AssertionError("a 3-entry split of a 2-d parameter was accepted")


# -- partial layouts on parameters and inputs (Rule 2.3) --------------------------------------


@pytest.mark.parametrize(("statement", "what"), [
    ("partial fc1.weight over tp", "is a parameter"),
    ("partial fc2.weight over dp op=avg", "is a parameter"),
    ("place fc1.weight [P, R]", "is a parameter"),
    ("partial x over dp", "is a model input"),
])
def test_partial_layout_on_a_parameter_or_input(tmp_path: Path, statement: str,
                                                what: str) -> None:
    path = write(tmp_path, statement)
    (finding,) = errors(path)
    assert finding.code.name in PARTIAL_INPUT
    assert what in finding.message and "Rule 2.3" in finding.message
    assert at_statement(finding, path, statement.split(" ")[0])


def test_partial_claim_on_a_computed_tensor_is_not_a_binding_error(tmp_path: Path) -> None:
    path = write(tmp_path, "split fc1.weight [tp, -]\ncopy fc1.in over tp\n"
                           "split fc2.weight [-, tp]\npartial fc2.out over tp\n"
                           "all-reduce fc2.out over tp")
    lw = lowered(path)
    assert "fc2.out" in lw.binding.claims


def test_params_names_every_parameter_and_no_input_or_loss(tmp_path: Path) -> None:
    """`params` means the model's parameters (docs/language.md), whatever its inputs are
    called: `replicate params` must not replicate an input named `x` (it did: only inputs
    named `tokens`/`labels` were excluded) nor claim a layout for `loss`."""
    path = write(tmp_path, """
        split x [dp, -, -]
        split target [dp, -, -]
        replicate params
        all-reduce grad(params) over dp op=avg
        """, mesh="mesh dp=2")
    lw = lowered(path)
    assert not lw.findings, [f.message for f in lw.findings]
    assert "x" in lw.binding.data_layouts and lw.binding.data_layouts["x"].dim_axes
    assert set(lw.binding.param_layouts) == set(lw.binding.params)
    assert "loss" not in lw.binding.claims


def test_the_batch_order_is_megatron_s_sampler_order(tmp_path: Path) -> None:
    """Rule 4.1: the batch is cut into microbatches first, then over the batch axes, so
    microbatch m of data-parallel rank k holds rows m*B/M + k*B/(N*M) + i (Megatron's
    MegatronPretrainingSampler), read through the binding's layout of the input."""
    import numpy as np

    from trainverify_dsl.ir.layout import MICROBATCH_AXIS, take_local

    path = write(tmp_path, """
        split x [dp, -, -]
        split target [dp, -, -]
        all-reduce grad(params) over dp op=avg
        """, mesh="mesh dp=2\nmicrobatches 2")
    lw = lowered(path)
    shape = lw.binding.data["x"]
    batch, per_row = shape[0], int(np.prod(shape[1:]))
    lay = lw.binding.data_layout("x", shape, lw.sizes)
    rows = np.arange(batch * per_row).reshape(shape)
    n, m_count = 2, 2
    for k in range(n):
        for m in range(m_count):
            local = take_local(rows, lay, {"dp": k, MICROBATCH_AXIS: m}, lw.sizes)
            got = (local.reshape(local.shape[0], -1)[:, 0] // per_row).tolist()
            step = batch // (n * m_count)
            assert got == [m * (batch // m_count) + k * step + i for i in range(step)], (k, m)


def test_a_split_that_does_not_divide_is_not_also_a_zero_block_error(tmp_path: Path) -> None:
    """DeepSeek-V3's 256 experts over ep=6 under ZeRO over dp: besides the right TVP234 at
    the split, the ZeRO check reported "42 local rows" (256 // 6) at the optimizer line for
    every parameter, numbers the plan does not have (an outside user's full-size lint)."""
    path = tmp_path / "mlp.tvp"
    root = Path(__file__).resolve().parents[1]
    path.write_text(f'plan p\nspec "{root}/stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 '
                    "seq 1 d_out 4\nspec-optimizer sgd lr=0.1\nmesh dp=2, tp=5\nsplit x [dp, -]\n"
                    "split target [dp, -]\nsplit fc1.weight [tp, -]\n"
                    "all-reduce grad(params) over dp op=avg\n"
                    "optimizer sgd lr=0.1 shard over dp\n", encoding="utf-8")
    from trainverify_dsl.api import layout_diagnostics

    found = layout_diagnostics(path)
    assert found and all("local rows" not in d.message for d in found), found
    assert any(d.code.id == "TVP234" and d.span.line == 7 for d in found), found
