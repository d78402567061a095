"""Where the layout pass reports a problem (issue 8, item 7): at the line the user wrote, with
the template chain as notes, once per statement at fault.

The end-to-end property (every bug plan's error stands at its header's faulty line) is in
``tests/test_simulate_plans.py::test_bug_plan_disagrees``; these are the mechanisms (without
torch), and one end-to-end case.
"""

from __future__ import annotations

from trainverify_dsl.lower.findings import Finding, merge_repeats
from trainverify_dsl.plan.model import ExpansionSite, Origin
from trainverify_dsl.report.codes import lookup
from trainverify_dsl.report.span import Span

PLAN = "plans/p.tvp"
TEMPLATE = Span("stdlib/megatron.tvp", 51, 5, 51, 30)
APPLY = Span(PLAN, 19, 5, 19, 40)
SPLIT = Span(PLAN, 22, 5, 22, 40)


def test_a_template_statement_is_reported_at_its_apply_line() -> None:
    origin = Origin(TEMPLATE, (ExpansionSite("apply", "column_parallel", APPLY),))
    finding = Finding(lookup("collective-mismatch"), "m", origin, "fc1.in")
    assert finding.span == APPLY
    assert finding.notes[0] == f"the statement is at {TEMPLATE}"
    assert f"in template column_parallel, applied at {APPLY}" in finding.notes


def test_a_plan_statement_keeps_its_span_and_adds_no_note() -> None:
    finding = Finding(lookup("partial-nonlinear"), "m", Origin(SPLIT), "layers.0")
    assert finding.span == SPLIT and finding.notes == ()
    assert Finding(lookup("partial-nonlinear"), "m", SPLIT, "x").span == SPLIT


def test_repeats_at_one_statement_merge_into_one_finding_with_the_places() -> None:
    nonlinear = lookup("partial-nonlinear")
    found = [Finding(nonlinear, f"op {i}", SPLIT, f"layers.{i}") for i in range(3)]
    found.insert(1, Finding(lookup("mixed-partial"), "add", SPLIT, "layers.0"))
    found.append(Finding(lookup("partial-nonlinear"), "elsewhere", APPLY, "head"))
    merged = merge_repeats(found)
    assert [(f.code.name, f.span) for f in merged] == [
        ("partial-nonlinear", SPLIT), ("mixed-partial", SPLIT), ("partial-nonlinear", APPLY)]
    first = merged[0]
    assert first.message == "op 0" and first.where == "layers.0"
    assert first.notes == ("2 more findings of this kind trace back to this statement (also "
                           "in `layers.1`, `layers.2`)",)
    assert merged[1].notes == () and merged[2].notes == ()


def test_unlocated_findings_merge_only_when_identical() -> None:
    unbound = lookup("unbound-name")
    found = [Finding(unbound, "a", None, ""), Finding(unbound, "b", None, ""),
             Finding(unbound, "a", None, "")]
    assert [f.message for f in merge_repeats(found)] == ["a", "b"]


# -- end to end (torch) ------------------------------------------------------------------------


def test_vocab_parallel_ce_on_unsplit_logits_is_blamed_on_the_algorithm(tmp_path) -> None:
    """Nothing gathered the logits: the algorithm's own line is at fault (not the last
    collective somewhere upstream)."""
    from pathlib import Path

    from trainverify_dsl.api import layout_diagnostics

    root = Path(__file__).resolve().parents[1]
    text = (root / "plans" / "llama_tiny_tp.tvp").read_text()
    text += "algorithm vocab-parallel-cross-entropy for output, loss over tp\n"
    path = tmp_path / "p.tvp"
    path.write_text(text, encoding="utf-8")
    found = [(d.code.id, d.span.line) for d in layout_diagnostics(path)]
    assert found == [("TVP408", len(text.splitlines()))], found


def _lint_variant(tmp_path, plan: str, old: str, new: str) -> tuple[list[tuple[str, int]], str]:
    from pathlib import Path

    from trainverify_dsl.api import layout_diagnostics

    root = Path(__file__).resolve().parents[1]
    text = (root / "plans" / plan).read_text()
    assert old in text
    text = text.replace(old, new)
    path = tmp_path / "p.tvp"
    path.write_text(text, encoding="utf-8")
    found = layout_diagnostics(path, allow_model_outside_root=True)
    return [(d.code.id, d.span.line) for d in found], "\n".join(d.message for d in found)


def _line(plan: str, statement: str) -> int:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "plans" / plan).read_text()
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(statement))


def test_labels_split_unlike_the_tokens_are_a_located_finding(tmp_path) -> None:
    """Labels replicated while the tokens are split over dp (and the reverse): each rank's
    logits rows and labels disagree. Found by a fuzz of tvp check: the vocab-parallel
    cross-entropy crashed the layout pass with a torch shape error (an internal error); the
    plain loss was blamed on the last collective of the block loop."""
    found, message = _lint_variant(tmp_path, "llama_tiny_sp.tvp", "split labels [dp, -]",
                                   "split labels [-, -]")
    assert found == [("TVP408", _line("llama_tiny_sp.tvp", "apply vocab_parallel_output"))]
    assert "labels" in message and "4/dp" in message
    found, message = _lint_variant(tmp_path, "llama_tiny_tp.tvp", "split labels [dp, -]",
                                   "split labels [-, -]")
    assert found == [("TVP403", _line("llama_tiny_tp.tvp", "split tokens"))], found
    assert "the source is [4/dp" in message
    found, _ = _lint_variant(tmp_path, "llama_tiny_tp.tvp", "split tokens [dp, -]",
                             "split tokens [-, -]")
    assert found == [("TVP403", _line("llama_tiny_tp.tvp", "split labels"))], found


def test_two_copies_of_one_value_sum_its_gradient_twice(tmp_path) -> None:
    """The statements at one point apply one after the other, in the backward too: a second
    `copy fc1.in over tp` sums the gradient the first one's backward already made complete
    (x tp). Found by a fuzz of tvp check (a template line duplicated): the layout pass saw
    both backwards read the same partial cotangent and said nothing."""
    found, message = _lint_variant(tmp_path, "mlp_dp_tp.tvp",
                                   "apply column_parallel_bias(fc1, tp)\n",
                                   "apply column_parallel_bias(fc1, tp)\ncopy fc1.in over tp\n")
    # blamed on the earlier of the two (the template's, at its apply line): the later one's
    # backward ran first and made the gradient complete
    line = _line("mlp_dp_tp.tvp", "apply column_parallel_bias")
    assert found == [("TVP406", line)], found
    assert "already complete over tp" in message


def test_a_copy_over_an_axis_splitting_the_value_is_found(tmp_path) -> None:
    """`copy fc1.in over tp, dp` where the input is split over dp: the backward sums the
    gradients of different rows over dp (found by the fuzz of tvp check: a template's `over
    axis` widened; lint --spec said nothing because tp was partial)."""
    found, message = _lint_variant(tmp_path, "mlp_dp_tp.tvp",
                                   "apply column_parallel_bias(fc1, tp)\n",
                                   "apply column_parallel_bias(fc1, tp)\ncopy fc1.in over dp\n")
    line = _line("mlp_dp_tp.tvp", "apply column_parallel_bias") + 1
    assert ("TVP406", line) in found, found
    assert "sums over dp the gradients of different pieces" in message


def test_a_repeated_gradient_statement_is_found(tmp_path) -> None:
    """`all-reduce grad(embed.weight) over pp` twice sums the tied copies twice; any gradient
    all-reduce repeated over an axis sums complete gradients."""
    statement = "all-reduce grad(embed.weight) over pp\n"
    found, message = _lint_variant(tmp_path, "llama_tiny_tied.tvp", statement, statement * 2)
    line = _line("llama_tiny_tied.tvp", "all-reduce grad(embed.weight) over pp") + 1
    assert ("TVP406", line) in found, found
    assert "already summed over pp" in message
    statement = "all-reduce grad(params) over dp op=avg\n"
    found, message = _lint_variant(tmp_path, "mlp_dp_tp.tvp", statement,
                                   statement + "all-reduce grad(params) over dp\n")
    line = _line("mlp_dp_tp.tvp", "all-reduce grad(params)") + 1
    assert ("TVP406", line) in found, found
    assert "already complete over dp" in message


def test_a_failing_fake_op_leaves_no_torch_log_on_stderr(tmp_path) -> None:
    """An algorithm whose code fails on the plan's local shapes is one located diagnostic;
    torch's own ERROR log of the failed fake op (a traceback) is not printed (found by the
    fuzz of tvp check: `tvp lint --spec` printed pages of it)."""
    import subprocess
    import sys

    from test_plan_support import row_parallel_weight_over_dp

    row_parallel_weight_over_dp(tmp_path)
    run = subprocess.run([sys.executable, "-m", "trainverify_dsl", "lint", "--spec", "p.tvp"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "TVP408" in run.stdout and "row-parallel-linear" in run.stdout
    assert run.stderr == "", run.stderr[:2000]


def test_gradient_statements_that_do_not_sum(tmp_path) -> None:
    """op=max on a gradient statement (found by the fuzz of tvp check: the tied copies'
    gradients maxed, reported only at the next statement by the simulation), and a sum over
    the data axis before the plan's average (the sequence-parallel norm's `over tp, dp`: the
    later average divides nothing, so the gradient is dp times too large, blamed on the
    statement that summed)."""
    found, message = _lint_variant(tmp_path, "llama_tiny_tied.tvp",
                                   "all-reduce grad(embed.weight) over pp\n",
                                   "all-reduce grad(embed.weight) over pp op=max\n")
    line = _line("llama_tiny_tied.tvp", "all-reduce grad(embed.weight) over pp")
    assert ("TVP406", line) in found and "op=max does not synchronise" in message, found
    found, message = _lint_variant(tmp_path, "mlp_dp_tp.tvp", "split fc1.out [dp, tp]\n",
                                   "split fc1.out [dp, tp]\nall-reduce grad(fc1.bias) over dp\n")
    line = _line("mlp_dp_tp.tvp", "split fc1.out") + 1
    assert found == [("TVP411", line)], found
    assert "come out 2 times the spec's" in message


def test_a_weight_split_on_its_contracted_dimension_is_blamed_not_the_bias(tmp_path) -> None:
    """`split fc1.weight [-, tp]` (the input dimension) before a correct `split fc1.bias [tp]`:
    the matrix product's TVP403 stands at the weight's statement, the split the other operand
    lacks (an outside user's plan had it at the bias, the op's latest statement)."""
    found, message = _lint_variant(
        tmp_path, "mlp_dp_tp.tvp", "apply column_parallel_bias(fc1, tp)\n",
        "split fc1.weight [-, tp]\nsplit fc1.bias [tp]\ncopy fc1.in over tp\n")
    weight = _line("mlp_dp_tp.tvp", "apply column_parallel_bias")
    assert found[0] == ("TVP403", weight), found
    assert "contracted dimension" in message


def test_a_collective_dimension_past_the_values_rank_is_located(tmp_path) -> None:
    """`all-gather fc1.out over tp dim=2` on a 2-d value (and the other dimension options of
    every activation collective): an internal IndexError in every command before, found by
    the fuzz of tvp check (a `dim=` moved). Now TVP406 at the statement."""
    line = _line("mlp_dp_tp.tvp", "apply column_parallel_bias") + 1
    for statement, option in (("all-gather fc1.out over tp dim=2", "dim=2"),
                              ("reduce-scatter fc2.out over tp dim=7", "dim=7"),
                              ("scatter fc1.in over tp dim=4", "dim=4"),
                              ("all-to-all fc1.out over tp split-dim=5 concat-dim=0",
                               "split-dim=5"),
                              ("all-to-all fc1.out over tp split-dim=0 concat-dim=9",
                               "concat-dim=9")):
        found, message = _lint_variant(tmp_path, "mlp_dp_tp.tvp",
                                       "apply column_parallel_bias(fc1, tp)\n",
                                       f"apply column_parallel_bias(fc1, tp)\n{statement}\n")
        assert found == [("TVP406", line)], (statement, found)
        assert f"{option} is out of range: the value has 2 dimensions" in message


USER_MODELS = '''import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def input_specs(self, batch, seq):
        return {"x": ((batch, 4), torch.float32), "y": ((batch, 4), torch.float32)}


class Gram(Net):
    def forward(self, x, y):
        h = self.fc(x)
        return ((h @ h.T) ** 2).mean()  # in-batch similarities: every pair of rows


class MaxLoss(Net):
    def forward(self, x, y):
        return ((self.fc(x) - y) ** 2).amax()  # the worst element of the batch
'''


def _lint_user_model(tmp_path, cls: str) -> list:
    """The layout pass of a dp=2 plan splitting the rows of both inputs of ``cls``."""
    from trainverify_dsl.api import layout_diagnostics

    (tmp_path / "user_models.py").write_text(USER_MODELS, encoding="utf-8")
    path = tmp_path / f"{cls.lower()}.tvp"
    path.write_text(f'plan p\nspec "user_models.py:{cls}" batch 8 seq 1\n'
                    "spec-optimizer sgd lr=0.1\nmesh dp=2\nsplit x [dp, -]\nsplit y [dp, -]\n"
                    "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.1\n",
                    encoding="utf-8")
    return layout_diagnostics(path, allow_model_outside_root=True)


def test_a_product_of_two_row_splits_is_a_located_layout_error(tmp_path) -> None:
    """`h @ h.T` with the rows split over dp (an in-batch contrastive or Gram loss without
    an all-gather): the result was laid out split over dp along both dimensions, so each
    rank computed its diagonal block only; `tvp lint --spec` said nothing and `tvp check`
    placed its counterexample at the `spec` line (found by an outside user). Now TVP403 at
    the split, in every command."""
    found = _lint_user_model(tmp_path, "Gram")
    assert [(d.code.id, d.span.line) for d in found] == [("TVP403", 5)], found
    assert "split over dp along dimensions 0 and 1" in found[0].message


def test_a_loss_that_is_a_maximum_over_split_data_is_found_by_the_layout_pass(tmp_path) -> None:
    """`err.amax()` over rows split over dp: each rank's loss is its own block's maximum,
    and no loss reduction makes the step's. `tvp lint --spec` said nothing (only the numeric
    comparison of simulate and check found it, at the `spec` line; an outside user's find).
    Now TVP414 at the split."""
    found = _lint_user_model(tmp_path, "MaxLoss")
    assert [(d.code.id, d.span.line) for d in found] == [("TVP414", 5)], found
    assert "the loss is a maximum over dp" in found[0].message
