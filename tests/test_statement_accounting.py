"""Accounting (issue 8 item 4, DESIGN.md §10.6): every statement of a plan is honoured or
rejected with a located diagnostic, never dropped.

The enumeration is statement kind x target x axis class over the bias-free two-layer net
``tests/models/tiny_nets.py:TwoLinear`` (``fc1 [8, 4]``, ReLU, ``fc2 [4, 8]``, inputs
``x``/``target [batch, seq, 4]``; batch 4, seq 2):

- kinds: the layout statements (split, replicate, partial, place), the collectives
  (all-reduce, all-gather, reduce-scatter, all-to-all, copy, scatter), and send,
  pipeline-stage, the optimizer's ``shard over``, loss-scale, loss-reduction, clip-grad-norm,
  a per-rank ``on``, algorithm;
- targets: an activation ``X.out``, an activation ``X.in``, a parameter, ``grad(...)``,
  ``loss``, a model input;
- axes: a data axis (``dp``, splitting the batch), a tensor axis (``tp``), and ``pp``.

``RULES`` (first match wins) gives every combination one outcome:

- ``Lint(code)``: plain ``tvp lint`` rejects the statement, at its line;
- ``Spec(code)``: the binding or the layout pass (``tvp lint --spec``) rejects it, at its line;
- ``Claim(...)``: the statement is a layout claim on a computed tensor; it is checked: a true
  claim lints clean and a false one (``wrong``) is rejected (TVP407) at its line;
- ``Honoured(...)``: the statement takes part in the lowered program (recorded in the
  binding, or visibly used: a stage, a seed) in a plan that lints clean, and a deliberately
  wrong variant of that one line changes the outcome: the simulation differs from the spec
  (``DIFFERS``), or the layout pass rejects the wrong variant with the given code.

A statement accepted with no effect has no outcome class here: ``test_every_combination_has_
an_outcome`` fails for a combination no rule covers. The base contexts are simulated once each
and must agree with the spec.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trainverify_dsl.api import SimulationSetupError, prepare, simulate_file
from trainverify_dsl.lower.diagnose import to_diagnostic
from trainverify_dsl.lower.findings import LoweringError
from trainverify_dsl.lower.lowering import Lowered, lower
from trainverify_dsl.plan import lint_file
from trainverify_dsl.report.diagnostics import Severity

HEAD = ('plan t\nspec "tests/models/tiny_nets.py:TwoLinear" batch 4 seq 2\n'
        'spec-optimizer sgd lr=0.1\n')

_DATA = ("mesh dp=2, tp=2", "split x [dp, -, -]", "split target [dp, -, -]")
_STEP = ("all-reduce grad(params) over dp op=avg", "optimizer sgd lr=0.1")
_MEGATRON = ("split fc1.weight [tp, -]", "copy fc1.in over tp", "split fc2.weight [-, tp]",
             "all-reduce fc2.out over tp")
_CLIP_RECIPE = "spec-optimizer sgd lr=0.1 clip-grad-norm=0.001"

#: Correct plans (each simulated once: it must agree with the spec).
CONTEXTS: dict[str, tuple[str, ...]] = {
    # data parallel: the batch split over dp, gradients averaged
    "dp": _DATA + _STEP,
    # no split at all: every rank computes the whole step
    "rep": ("mesh dp=2, tp=2", "optimizer sgd lr=0.1"),
    # Megatron tensor parallel: fc1 column parallel, fc2 row parallel
    "tp": _DATA + _MEGATRON + _STEP,
    # fc2 column parallel, its output gathered (Megatron gather_output: backward split)
    "col2": _DATA + ("split fc2.weight [tp, -]", "copy fc2.in over tp",
                     "all-gather fc2.out over tp dim=2 backward scatter") + _STEP,
    # fc1 column parallel, its output gathered before a replicated fc2
    "gather": _DATA + ("split fc1.weight [tp, -]", "copy fc1.in over tp",
                       "all-gather fc2.in over tp dim=2 backward scatter") + _STEP,
    # row parallel fc2 reduce-scattered over its output units, then gathered (= all-reduce)
    "rs": _DATA + _MEGATRON[:3] + ("reduce-scatter fc2.out over tp dim=2",
                                   "all-gather fc2.out over tp dim=2 backward scatter") + _STEP,
    # the replicated hidden activation scattered over tp, fc2 row parallel
    "scatter": _DATA + ("scatter fc2.in over tp dim=2", "split fc2.weight [-, tp]",
                        "all-reduce fc2.out over tp") + _STEP,
    # fc1 on sequence halves, an all-to-all to hidden halves (Ulysses-style), fc2 row parallel
    "a2a": _DATA + ("scatter fc1.in over tp dim=1",
                    "all-to-all fc1.out over tp split-dim=2 concat-dim=1",
                    "split fc2.weight [-, tp]", "all-reduce fc2.out over tp",
                    "all-reduce grad(fc1.weight) over tp") + _STEP,
    # ZeRO: gradients reduce-scattered into the optimizer's blocks
    "zero": _DATA + ("reduce-scatter grad(params) over dp dim=0 op=avg",
                     "optimizer sgd lr=0.1 shard over dp"),
    # microbatches with the seed scaled
    "mb": _DATA + ("microbatches 2", "loss-scale 1/microbatches") + _STEP,
    # the sequence split over tp too: tp is a data axis
    "seq": ("mesh dp=2, tp=2", "split x [dp, tp, -]", "split target [dp, tp, -]",
            "all-reduce grad(params) over dp, tp op=avg", "optimizer sgd lr=0.1"),
    # two stages and nothing split over dp (every axis but pp replicates every tensor)
    "pprep": ("mesh pp=2, dp=2", "pipeline-stage 0: fc1", "pipeline-stage 1: fc2, loss",
              "optimizer sgd lr=0.1"),
    # two pipeline stages: fc1 | fc2 and the loss
    "pp": ("mesh pp=2, dp=2", "split x [dp, -, -]", "split target [dp, -, -]",
           "pipeline-stage 0: fc1", "pipeline-stage 1: fc2, loss") + _STEP,
    # Megatron tensor parallel with a recipe that clips (its first line replaces HEAD's
    # recipe); the norm is small enough that the clipping is active
    "clip": (_CLIP_RECIPE,) + _DATA + _MEGATRON + _STEP + ("clip-grad-norm 0.001",),
    # a parameter group on both sides (docs/semantics.md §6.5)
    "group": _DATA + ("on fc1.weight: spec-optimizer sgd lr=0.2",) + _STEP +
    ("on fc1.weight: optimizer sgd lr=0.2",),
}
#: Plans completed by the statement under test (not simulated alone).
FRAGMENTS: dict[str, tuple[str, ...]] = {
    "pp3": ("mesh pp=3, dp=2", "split x [dp, -, -]", "split target [dp, -, -]",
            "pipeline-stage 0: fc1", "pipeline-stage 1: fc2") + _STEP,
}

DIFFERS = "differs"


@dataclass(frozen=True)
class Lint:
    code: str
    statement: str
    context: str = "dp"


@dataclass(frozen=True)
class Spec:
    code: str
    statement: str
    context: str = "dp"
    #: the context line the diagnostic points at, when it is not the statement's
    at: str | None = None


@dataclass(frozen=True)
class Claim:
    #: (context, statement) of a true claim, or None where no true claim of this form exists
    true: tuple[str, str] | None
    #: (context, statement) of a false claim of the same form
    false: tuple[str, str]


@dataclass(frozen=True)
class Honoured:
    context: str
    statement: str
    wrong: str
    #: DIFFERS, or the code the layout pass gives the wrong variant
    effect: str
    #: a context line the statement replaces (the statement is appended otherwise)
    replaces: str | None = None


Outcome = Lint | Spec | Claim | Honoured

LAYOUTS = ("split", "replicate", "partial", "place")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "copy", "scatter")
TARGETS = ("out", "in", "param", "grad", "loss", "input")
AXES = ("dp", "tp", "pp")
#: the concrete tensor of each target class
NAMES = {"out": "fc1.out", "in": "fc2.in", "param": "fc1.weight", "grad": "grad(fc1.weight)",
         "loss": "loss", "input": "x"}
#: statements that are not about a tensor at one axis: (kind, target, axis)
OTHERS = [("send", t, "pp") for t in TARGETS] + [
    ("pipeline-stage", "module", "pp"), ("pipeline-stage", "loss", "pp"),
    ("shard", "optimizer", "dp"),
    ("shard", "optimizer", "tp"), ("shard", "optimizer", "pp"), ("loss-scale", "seed", "-"),
    ("clip-grad-norm", "grads", "-"), ("loss-reduction", "loss", "-"),
    ("on", "optimizer", "dp"),
    *(("on", t, "-") for t in TARGETS),
    ("algorithm", "module", "tp"),
    ("algorithm", "module", "pp")]


def combinations() -> list[tuple[str, str, str]]:
    return list(itertools.product(LAYOUTS + COLLECTIVES, TARGETS, AXES)) + OTHERS


def statement(kind: str, target: str, axis: str) -> str:
    """A generic statement of the combination (used by the rejection rules)."""
    name = NAMES.get(target, target)
    rank = {"out": 3, "in": 3, "param": 2, "grad": 2, "loss": 1, "input": 3}[target]
    entries = ", ".join([axis] + ["-"] * (rank - 1))
    return {
        "split": f"split {name} [{entries}]",
        "replicate": f"replicate {name} over {axis}",
        "partial": f"partial {name} over {axis}",
        "place": f"place {name} [{axis}=S(0)]",
        "all-reduce": f"all-reduce {name} over {axis}",
        "all-gather": f"all-gather {name} over {axis} dim=0",
        "reduce-scatter": f"reduce-scatter {name} over {axis} dim=0",
        "all-to-all": f"all-to-all {name} over {axis} split-dim=0 concat-dim=1",
        "copy": f"copy {name} over {axis}",
        "scatter": f"scatter {name} over {axis} dim=0",
        "send": f"send {name} from 0 to 1",
    }[kind]


def _claim(true: tuple[str, str] | None, false: tuple[str, str]) -> Claim:
    return Claim(true, false)


#: Scenarios written out: (kind, target, axis) -> outcome.
SCENARIOS: dict[tuple[str, str, str], Outcome] = {
    # -- layout claims on activations (checked by the layout pass, TVP407) ------------------
    ("split", "out", "dp"): _claim(("dp", "split fc1.out [dp, -, -]"),
                                   ("dp", "split fc1.out [-, dp, -]")),
    ("split", "out", "tp"): _claim(("tp", "split fc1.out [dp, -, tp]"),
                                   ("tp", "split fc1.out [dp, tp, -]")),
    ("split", "in", "dp"): _claim(("dp", "split fc2.in [dp, -, -]"),
                                  ("dp", "split fc2.in [-, -, dp]")),
    ("split", "in", "tp"): _claim(("tp", "split fc2.in [dp, -, tp]"),
                                  ("tp", "split fc2.in [dp, tp, -]")),
    ("replicate", "out", "dp"): _claim(("rep", "replicate fc1.out over dp"),
                                       ("dp", "replicate fc1.out over dp")),
    ("replicate", "out", "tp"): _claim(("rep", "replicate fc1.out over tp"),
                                       ("tp", "replicate fc1.out over tp")),
    ("replicate", "in", "dp"): _claim(("rep", "replicate fc2.in over dp"),
                                      ("dp", "replicate fc2.in over dp")),
    ("replicate", "in", "tp"): _claim(("rep", "replicate fc2.in over tp"),
                                      ("tp", "replicate fc2.in over tp")),
    ("partial", "out", "dp"): _claim(None, ("dp", "partial fc1.out over dp")),
    ("partial", "out", "tp"): _claim(None, ("tp", "partial fc1.out over tp")),
    ("partial", "in", "dp"): _claim(None, ("dp", "partial fc2.in over dp")),
    ("partial", "in", "tp"): _claim(None, ("tp", "partial fc2.in over tp")),
    ("place", "out", "dp"): _claim(("dp", "place fc1.out [dp=S(0)]"),
                                   ("dp", "place fc1.out [dp=S(1)]")),
    ("place", "out", "tp"): _claim(("tp", "place fc1.out [dp=S(0), tp=S(2)]"),
                                   ("tp", "place fc1.out [tp=S(1)]")),
    ("place", "in", "dp"): _claim(("dp", "place fc2.in [dp=S(0)]"),
                                  ("dp", "place fc2.in [dp=S(2)]")),
    ("place", "in", "tp"): _claim(("tp", "place fc2.in [dp=S(0), tp=S(2)]"),
                                  ("tp", "place fc2.in [tp=R]")),
    # -- layout claims on gradients (the final gradient's layout, §4.5) ----------------------
    ("split", "grad", "dp"): _claim(("zero", "split grad(fc1.weight) [dp, -]"),
                                    ("zero", "split grad(fc1.weight) [-, dp]")),
    ("split", "grad", "tp"): _claim(("tp", "split grad(fc1.weight) [tp, -]"),
                                    ("tp", "split grad(fc1.weight) [-, tp]")),
    ("replicate", "grad", "dp"): _claim(("dp", "replicate grad(fc1.weight) over dp"),
                                        ("zero", "replicate grad(fc1.weight) over dp")),
    ("replicate", "grad", "tp"): _claim(("dp", "replicate grad(fc1.weight) over tp"),
                                        ("tp", "replicate grad(fc1.weight) over tp")),
    ("partial", "grad", "dp"): _claim(None, ("dp", "partial grad(fc1.weight) over dp")),
    ("partial", "grad", "tp"): _claim(None, ("tp", "partial grad(fc1.weight) over tp")),
    ("place", "grad", "dp"): _claim(("zero", "place grad(fc1.weight) [dp=S(0)]"),
                                    ("zero", "place grad(fc1.weight) [dp=S(1)]")),
    ("place", "grad", "tp"): _claim(("tp", "place grad(fc1.weight) [tp=S(0)]"),
                                    ("tp", "place grad(fc1.weight) [tp=S(1)]")),
    # -- layout claims on the loss (Partial(avg) over the data axes, §4.6) -------------------
    ("split", "loss", "dp"): _claim(None, ("dp", "split loss [dp]")),
    ("split", "loss", "tp"): _claim(None, ("dp", "split loss [tp]")),
    ("replicate", "loss", "dp"): _claim(("rep", "replicate loss over dp"),
                                        ("dp", "replicate loss over dp")),
    ("replicate", "loss", "tp"): _claim(("rep", "replicate loss over tp"),
                                        ("seq", "replicate loss over tp")),
    ("partial", "loss", "dp"): _claim(("dp", "partial loss over dp op=avg"),
                                      ("dp", "partial loss over dp")),
    ("partial", "loss", "tp"): _claim(("seq", "partial loss over dp, tp op=avg"),
                                      ("dp", "partial loss over tp op=avg")),
    ("place", "loss", "dp"): _claim(("dp", "place loss [dp=P(avg)]"),
                                    ("dp", "place loss [dp=P(sum)]")),
    ("place", "loss", "tp"): _claim(("rep", "place loss [tp=R]"),
                                    ("seq", "place loss [tp=R]")),
    # -- layouts on parameters and inputs define their distribution --------------------------
    ("split", "param", "tp"): Honoured("tp", "split fc1.weight [tp, -]",
                                       "split fc1.weight [-, tp]", "TVP403"),
    # the batch and the weight rows both split over dp meet in fc1's product; the layout
    # pass blames the input split (issue 8 item 7: the line at fault is the weight's)
    # the weight's split over the data axis meets the batch's: blamed on the weight's
    # statement, where its layer uses it (docs/lowering.md, "Where a finding is reported")
    ("split", "param", "dp"): Spec("TVP403", "split fc1.weight [dp, -]"),
    ("replicate", "param", "tp"): Honoured("dp", "replicate fc1.weight over tp",
                                           "split fc1.weight [tp, -]", "TVP403"),
    ("replicate", "param", "dp"): Honoured("dp", "replicate fc1.weight over dp",
                                           "split fc1.weight [dp, -]", "TVP403"),
    ("place", "param", "tp"): Honoured("tp", "place fc1.weight [tp=S(0)]",
                                       "place fc1.weight [tp=S(1)]", "TVP403",
                                       replaces="split fc1.weight [tp, -]"),
    ("place", "param", "dp"): Honoured("dp", "place fc1.weight [dp=R]",
                                       "place fc1.weight [dp=S(0)]", "TVP403"),
    ("split", "input", "dp"): Honoured("dp", "split x [dp, -, -]", "split x [-, dp, -]",
                                       "TVP403"),
    ("split", "input", "tp"): Honoured("seq", "split x [dp, tp, -]", "split x [dp, -, tp]",
                                       "TVP403"),
    ("replicate", "input", "dp"): Honoured("rep", "replicate x over dp",
                                           "split x [dp, -, -]", "TVP403"),
    ("replicate", "input", "tp"): Honoured("dp", "replicate x over tp", "split x [-, -, tp]",
                                           "TVP403"),
    ("place", "input", "dp"): Honoured("dp", "place x [dp=S(0)]", "place x [dp=S(1)]",
                                       "TVP403", replaces="split x [dp, -, -]"),
    ("place", "input", "tp"): Honoured("dp", "place x [tp=R]", "place x [tp=S(2)]",
                                       "TVP403"),
    # -- collectives on activations over a tensor axis ---------------------------------------
    ("all-reduce", "out", "tp"): Honoured("tp", "all-reduce fc2.out over tp",
                                          "all-reduce fc2.out over tp op=avg", DIFFERS),
    ("all-reduce", "in", "tp"): Spec("TVP406", "all-reduce fc2.in over tp", "tp"),
    ("copy", "in", "tp"): Honoured("col2", "copy fc2.in over tp",
                                   "copy fc2.in over tp backward identity", DIFFERS),
    ("copy", "out", "tp"): Honoured("col2", "copy fc1.out over tp",
                                    "copy fc1.out over tp backward identity", DIFFERS,
                                    replaces="copy fc2.in over tp"),
    ("all-gather", "out", "tp"): Honoured("col2",
                                          "all-gather fc2.out over tp dim=2 backward scatter",
                                          "all-gather fc2.out over tp dim=2", DIFFERS),
    ("all-gather", "in", "tp"): Honoured("gather",
                                         "all-gather fc2.in over tp dim=2 backward scatter",
                                         "all-gather fc2.in over tp dim=2", DIFFERS),
    ("reduce-scatter", "out", "tp"): Honoured("rs", "reduce-scatter fc2.out over tp dim=2",
                                              "reduce-scatter fc2.out over tp dim=2 op=avg",
                                              DIFFERS),
    ("reduce-scatter", "in", "tp"): Spec("TVP403", "reduce-scatter fc2.in over tp dim=2",
                                         "tp"),
    ("scatter", "in", "tp"): Honoured("scatter", "scatter fc2.in over tp dim=2",
                                      "scatter fc2.in over tp dim=1", "TVP403"),
    ("scatter", "out", "tp"): Honoured("scatter", "scatter fc1.out over tp dim=2",
                                       "scatter fc1.out over tp dim=1", "TVP403",
                                       replaces="scatter fc2.in over tp dim=2"),
    ("all-to-all", "out", "tp"): Honoured("a2a",
                                          "all-to-all fc1.out over tp split-dim=2 concat-dim=1",
                                          "all-to-all fc1.out over tp split-dim=2 concat-dim=0",
                                          "TVP403"),
    ("all-to-all", "in", "tp"): Honoured("a2a",
                                         "all-to-all fc2.in over tp split-dim=2 concat-dim=1",
                                         "all-to-all fc2.in over tp split-dim=2 concat-dim=0",
                                         "TVP403",
                                         replaces="all-to-all fc1.out over tp split-dim=2 "
                                                  "concat-dim=1"),
    # -- collectives on activations over the data axis (the batch is split over dp) ----------
    ("all-reduce", "out", "dp"): Spec("TVP406", "all-reduce fc1.out over dp"),
    ("all-reduce", "in", "dp"): Spec("TVP406", "all-reduce fc2.in over dp"),
    ("reduce-scatter", "out", "dp"): Spec("TVP403", "reduce-scatter fc1.out over dp dim=2"),
    ("reduce-scatter", "in", "dp"): Spec("TVP403", "reduce-scatter fc2.in over dp dim=2"),
    ("scatter", "out", "dp"): Spec("TVP403", "scatter fc1.out over dp dim=0"),
    ("scatter", "in", "dp"): Spec("TVP403", "scatter fc2.in over dp dim=0"),
    ("copy", "out", "dp"): Spec("TVP406", "copy fc1.out over dp"),
    ("copy", "in", "dp"): Spec("TVP406", "copy fc2.in over dp"),
    ("all-gather", "out", "dp"): Spec("TVP403", "all-gather fc1.out over dp dim=0"),
    ("all-gather", "in", "dp"): Spec("TVP403", "all-gather fc2.in over dp dim=0"),
    ("all-to-all", "out", "dp"): Spec("TVP403",
                                      "all-to-all fc1.out over dp split-dim=2 concat-dim=0"),
    ("all-to-all", "in", "dp"): Spec("TVP403",
                                     "all-to-all fc2.in over dp split-dim=2 concat-dim=0"),
    # -- gradient statements -------------------------------------------------------------------
    ("all-reduce", "grad", "dp"): Honoured("dp", "all-reduce grad(params) over dp op=avg",
                                           "all-reduce grad(params) over dp op=sum", DIFFERS),
    ("all-reduce", "grad", "tp"): Honoured("a2a", "all-reduce grad(fc1.weight) over tp",
                                           "all-reduce grad(fc1.weight) over tp op=avg",
                                           DIFFERS),
    ("reduce-scatter", "grad", "dp"): Honoured(
        "zero", "reduce-scatter grad(params) over dp dim=0 op=avg",
        "reduce-scatter grad(params) over dp dim=0 op=sum", DIFFERS),
    ("reduce-scatter", "grad", "tp"): Spec("TVP412",
                                           "reduce-scatter grad(fc1.weight) over tp dim=0"),
    # -- the other statements ----------------------------------------------------------------
    # the value crossing fc1 | fc2 is relu(fc1.out) (the root-level ReLU runs with its operand,
    # Rule 5.1): neither boundary is a transferred value, and saying so is the diagnostic
    ("send", "out", "pp"): Spec("TVP244", "send fc1.out from 0 to 1", "pp"),
    ("send", "in", "pp"): Spec("TVP244", "send fc2.in from 0 to 1", "pp"),
    ("send", "param", "pp"): Spec("TVP401", "send fc1.weight from 0 to 1", "pp"),
    ("send", "grad", "pp"): Spec("TVP401", "send grad(fc1.weight) from 0 to 1", "pp"),
    ("send", "loss", "pp"): Spec("TVP401", "send loss from 0 to 1", "pp"),
    ("send", "input", "pp"): Spec("TVP401", "send x from 0 to 1", "pp"),
    ("pipeline-stage", "module", "pp"): Honoured("pp", "pipeline-stage 1: fc2, loss",
                                                 "pipeline-stage 1: fc1, loss", "TVP242"),
    # the loss runs with its operands (Rule 5.1); a stage listing it elsewhere is an error
    ("pipeline-stage", "loss", "pp"): Spec("TVP244", "pipeline-stage 2: loss", "pp3"),
    ("shard", "optimizer", "dp"): Honoured("zero", "optimizer sgd lr=0.1 shard over dp",
                                           "optimizer sgd lr=0.1", "TVP412",
                                           replaces="optimizer sgd lr=0.1 shard over dp"),
    ("shard", "optimizer", "tp"): Spec("TVP230", "optimizer sgd lr=0.1 shard over tp", "tp"),
    ("shard", "optimizer", "pp"): Lint("TVP246", "optimizer sgd lr=0.1 shard over dp, pp", "pp"),
    # the one gradient statement over pp, the embedding group of a tied parameter
    # (docs/semantics.md §5.4): which parameters are tied only the spec knows, so it passes
    # lint, and for a parameter held on one stage the lowering rejects it
    ("all-reduce", "grad", "pp"): Spec("TVP246", "all-reduce grad(fc1.weight) over pp", "pp"),
    ("loss-scale", "seed", "-"): Honoured("mb", "loss-scale 1/microbatches", "loss-scale 1",
                                          DIFFERS, replaces="loss-scale 1/microbatches"),
    # every copy counted: the dp replicas (and the tp-replicated biases) count twice
    ("clip-grad-norm", "grads", "-"): Honoured("clip", "clip-grad-norm 0.001",
                                               "clip-grad-norm 0.001 replicas=each", DIFFERS),
    # the rank's own count (the default, stated) vs the step's count: with the gradients
    # averaged over dp the step's count divides twice (TVP411)
    ("loss-reduction", "loss", "-"): Honoured("dp", "loss-reduction local-mean",
                                              "loss-reduction token-mean", "TVP411"),
    # the plan-wide step restated on dp=1 agrees; another learning rate there differs
    ("on", "optimizer", "dp"): Honoured("dp", "on dp=1: optimizer sgd lr=0.1",
                                        "on dp=1: optimizer sgd lr=0.2", DIFFERS),
    # a parameter group: the plan's restating the recipe's agrees; one on another parameter
    # (a regrouping the text alone does not show) differs
    ("on", "param", "-"): Honoured("group", "on fc1.weight: optimizer sgd lr=0.2",
                                   "on fc2.weight: optimizer sgd lr=0.2", DIFFERS,
                                   replaces="on fc1.weight: optimizer sgd lr=0.2"),
    # a group names parameters: anything else selects none, or is not a path
    ("on", "out", "-"): Spec("TVP401", "on fc1.out: optimizer sgd lr=0.1"),
    ("on", "in", "-"): Spec("TVP401", "on fc2.in: optimizer sgd lr=0.1"),
    ("on", "loss", "-"): Spec("TVP401", "on loss: optimizer sgd lr=0.1"),
    ("on", "input", "-"): Spec("TVP401", "on x: optimizer sgd lr=0.1"),
    ("on", "grad", "-"): Lint("TVP101", "on grad(fc1.weight): optimizer sgd lr=0.1"),
    ("algorithm", "module", "tp"): Spec("TVP408",
                                        "algorithm vocab-parallel-embedding for fc1 over tp",
                                        "tp"),
    ("algorithm", "module", "pp"): Lint("TVP246",
                                        "algorithm vocab-parallel-embedding for fc1 over pp",
                                        "pp"),
}


def rule_outcome(kind: str, target: str, axis: str) -> Outcome | None:
    """The rejection rules of docs/semantics.md, checked generically; written-out
    scenarios first."""
    if (kind, target, axis) in SCENARIOS:
        return SCENARIOS[kind, target, axis]
    text = statement(kind, target, axis)
    if axis == "pp" and kind in ("split", "partial", "place"):
        return Lint("TVP236", text, "pp")
    if axis == "pp" and kind == "replicate":
        # the placement every tensor has on pp (§5); its negation is rejected (TVP236)
        return Claim(("pprep", text), ("pp", statement("split", target, "pp")))
    if axis == "pp" and kind in COLLECTIVES:
        return Lint("TVP246", text, "pp")
    if target == "grad" and kind in COLLECTIVES and kind not in ("all-reduce",
                                                                   "reduce-scatter"):
        return Lint("TVP256", text)
    if target in ("param", "input", "loss") and kind in COLLECTIVES:
        return Spec("TVP401", text)
    if target in ("param", "input") and kind == "partial":
        return Spec("TVP402", text, "rep")
    return None


# -- running plans ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def plan_text(context: str, line: str | None = None, replaces: str | None = None) -> str:
    lines = list(CONTEXTS.get(context) or FRAGMENTS[context])
    head = HEAD
    if lines and lines[0].startswith("spec-optimizer "):  # the context's own recipe
        head = HEAD.replace("spec-optimizer sgd lr=0.1\n", lines.pop(0) + "\n")
    if line is not None and line.startswith("optimizer ") and replaces is None:
        replaces = next(x for x in lines if x.startswith("optimizer "))  # one per plan
    if line is not None and replaces is not None:
        lines[lines.index(replaces)] = line
    elif line is not None and line not in lines:
        lines.append(line)
    return head + "\n".join(lines) + "\n"


def line_of(text: str, statement: str) -> int:
    return text.splitlines().index(statement) + 1


_DIR: list[Path] = []


def write(text: str) -> Path:
    directory = _DIR[0]
    path = directory / f"plan{abs(hash(text))}.tvp"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module", autouse=True)
def _plans_dir(tmp_path_factory: pytest.TempPathFactory):
    _DIR[:] = [tmp_path_factory.mktemp("accounting")]
    yield


@pytest.fixture(scope="module", autouse=True)
def _capture_once():
    """Capturing the spec's forward (torch.export) is ~97% of a lowering here and depends only
    on the model's structure, its input shapes and the marked modules: every plan of this
    file shares the first two, so each set of marks is captured once (the lowering reads the
    capture and never changes it)."""
    import trainverify_dsl.lower.lowering as lowering_module

    original = lowering_module.capture_forward
    memo: dict[object, object] = {}

    def capture(model: Any, inputs: Any, marked: Any) -> Any:
        key = (type(model).__name__, tuple((n, tuple(t.shape)) for n, t in inputs.items()),
               tuple((n, tuple(t.shape)) for n, t in model.named_parameters()),
               frozenset(marked))
        if key not in memo:
            memo[key] = original(model, inputs, marked)
        return memo[key]

    lowering_module.capture_forward = capture
    yield
    lowering_module.capture_forward = original


@pytest.fixture(scope="module", autouse=True)
def _trace_once():
    """The spec's training step depends only on the model, its inputs and the reference
    optimizer, the same for most plans here: traced once each (a speed-up only; if the
    tracer moves, every simulation traces again)."""
    import trainverify_dsl.spec.trace as trace_module

    original = trace_module.trace_training_step
    memo: dict[object, object] = {}

    def trace(model: Any, input_specs: Any, optimizer: Any = None, **options: Any) -> Any:
        key = (type(model).__name__, repr(input_specs), repr(optimizer), repr(options),
               tuple((n, tuple(t.shape)) for n, t in model.named_parameters()))
        if key not in memo:
            memo[key] = original(model, input_specs, optimizer, **options)
        return memo[key]

    trace_module.trace_training_step = trace
    yield
    trace_module.trace_training_step = original


@functools.cache
def lint_codes(text: str) -> tuple[tuple[str, int], ...]:
    found = lint_file(str(write(text)))
    return tuple((d.code.id, d.span.line) for d in found if d.severity is Severity.ERROR)


@functools.cache
def lowering(text: str) -> tuple[tuple[tuple[str, int], ...], Lowered | None]:
    """What ``tvp lint --spec`` reports (its errors, by code and line) and the lowered
    program when there is one: one lowering per plan text."""
    setup = prepare(write(text))
    fallback = setup.plan.spec.origin.span
    try:
        lw = lower(setup.plan, setup.fake_model, setup.fake_inputs)
    except LoweringError as error:
        found, lw = [to_diagnostic(f, fallback) for f in error.findings], None
    else:
        found = [to_diagnostic(f, fallback) for f in lw.findings]
    return tuple((d.code.id, d.span.line) for d in found if d.severity is Severity.ERROR), lw


def spec_codes(text: str) -> tuple[tuple[str, int], ...]:
    return lowering(text)[0]


def lowered(text: str) -> Lowered:
    lw = lowering(text)[1]
    assert lw is not None, spec_codes(text)
    return lw


@functools.cache
def agrees(text: str) -> bool:
    """``tvp simulate`` of the plan agrees with the spec and reports no error (a plan whose
    full-size layout pass reports errors is refused before it is simulated: not agreeing)."""
    try:
        result = simulate_file(write(text))
    except SimulationSetupError as error:
        assert error.diagnostics and any(d.severity is Severity.ERROR
                                         for d in error.diagnostics), error
        return False
    errors = [d for d in result.findings if d.severity is Severity.ERROR]
    return result.agrees and not errors


def recorded(lw: Lowered, text: str, statement: str) -> bool:
    """The statement at its line is part of the lowered program's inputs: a layout the
    binding uses, a collective at a point, a gradient statement, a send, a stage, the
    optimizer or the seed."""
    line = line_of(text, statement)
    b = lw.binding
    spans = [o.span for lay in list(b.param_layouts.values()) + list(b.data_layouts.values())
             for o in lay.origins]
    spans += [st.origin.span for sts in b.point_collectives.values() for st in sts]
    spans += [st.origin.span for st, names in b.grad_statements if names]
    spans += [span for _, _, _, span in b.sends]
    spans += [s.origin.span for s in lw.plan.stages] if len(lw.stages) > 1 else []
    if lw.plan.optimizer is not None and lw.plan.optimizer.shard_axes:
        spans.append(lw.plan.optimizer.origin.span)
    if statement.startswith("clip-grad-norm"):  # the program's GradClip
        from trainverify_dsl.lower.program import parallel_program

        clip = parallel_program(lw).clip
        return clip is not None and clip.origin.span is not None and \
            clip.origin.span.line == line
    if statement.startswith("on "):  # a per-rank override (§6.4) or a parameter group (§6.5)
        from trainverify_dsl.lower.program import parallel_program

        opt = parallel_program(lw).optimizer
        return opt is not None and any(
            s is not None and s.line == line
            for s in [o.origin.span for o in opt.overrides] + [u.group.span for u in opt.updates])
    if statement.startswith("loss-reduction"):  # the program's loss reduction (§4.3)
        from trainverify_dsl.lower.program import parallel_program

        origin = parallel_program(lw).loss.origin
        return origin.span is not None and origin.span.line == line
    if statement.startswith("loss-scale"):
        return lw.plan.loss_scale != 1  # the seed every stage graph is fed (§4.3)
    return any(span is not None and span.line == line for span in spans)


# -- the tests --------------------------------------------------------------------------------


def test_every_combination_has_an_outcome() -> None:
    missing = [c for c in combinations() if rule_outcome(*c) is None]
    assert not missing, f"statements with no outcome (accepted and dropped?): {missing}"
    unused = set(SCENARIOS) - set(combinations())
    assert not unused, f"scenarios for combinations not enumerated: {unused}"


@pytest.mark.parametrize("context", sorted(CONTEXTS))
def test_contexts_agree_with_the_spec(context: str) -> None:
    text = plan_text(context)
    assert not lint_codes(text) and not spec_codes(text), (lint_codes(text), spec_codes(text))
    assert agrees(text), context


def _ids(combination: tuple[str, str, str]) -> str:
    return "-".join(combination)


def _of(kind: type) -> list[tuple[str, str, str]]:
    return [c for c in combinations() if isinstance(rule_outcome(*c), kind)]


@pytest.mark.parametrize("combination", _of(Lint), ids=_ids)
def test_rejected_by_lint(combination: tuple[str, str, str]) -> None:
    outcome = rule_outcome(*combination)
    assert isinstance(outcome, Lint)
    text = plan_text(outcome.context, outcome.statement)
    assert (outcome.code, line_of(text, outcome.statement)) in lint_codes(text), \
        lint_codes(text)


@pytest.mark.parametrize("combination", _of(Spec), ids=_ids)
def test_rejected_by_the_layout_pass(combination: tuple[str, str, str]) -> None:
    outcome = rule_outcome(*combination)
    assert isinstance(outcome, Spec)
    text = plan_text(outcome.context, outcome.statement)
    assert not lint_codes(text), lint_codes(text)
    at = line_of(text, outcome.at or outcome.statement)
    assert (outcome.code, at) in spec_codes(text), spec_codes(text)


def _packed(entries: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(context, claim) -> a plan holding it and other claims of the same context about other
    tensors: one lowering checks a whole pack (claims never stop the lowering)."""
    packs: dict[str, list[list[str]]] = {}
    for context, claim in dict.fromkeys(entries):
        target = claim.split()[1]
        rows = packs.setdefault(context, [])
        row = next((r for r in rows if all(c.split()[1] != target for c in r)), None)
        if row is None:
            rows.append(row := [])
        row.append(claim)
    texts: dict[tuple[str, str], str] = {}
    for context, rows in packs.items():
        for row in rows:
            lines = list(CONTEXTS.get(context) or FRAGMENTS[context]) + row
            text = HEAD + "\n".join(lines) + "\n"
            texts.update({(context, claim): text for claim in row})
    return texts


def _claims() -> list[Claim]:
    return [o for c in combinations() if isinstance(o := rule_outcome(*c), Claim)]


TRUE_CLAIMS = _packed([c.true for c in _claims() if c.true is not None])
#: false claims the layout pass checks (a `split ... [pp]` one is rejected by lint alone)
FALSE_CLAIMS = _packed([c.false for c in _claims() if "pp" not in c.false[1]])


@pytest.mark.parametrize("combination", _of(Claim), ids=_ids)
def test_claims_are_checked(combination: tuple[str, str, str]) -> None:
    outcome = rule_outcome(*combination)
    assert isinstance(outcome, Claim)
    if outcome.true is not None:
        text = TRUE_CLAIMS[outcome.true]
        assert not lint_codes(text) and not spec_codes(text), (lint_codes(text),
                                                                spec_codes(text))
    context, wrong = outcome.false
    text = FALSE_CLAIMS.get(outcome.false) or plan_text(context, wrong)
    found = lint_codes(text) or spec_codes(text)
    at_line = {code for code, line in found if line == line_of(text, wrong)}
    assert at_line & {"TVP407", "TVP236"}, found


@pytest.mark.parametrize("combination", _of(Honoured), ids=_ids)
def test_honoured_and_a_wrong_variant_changes_the_outcome(
        combination: tuple[str, str, str]) -> None:
    outcome = rule_outcome(*combination)
    assert isinstance(outcome, Honoured)
    text = plan_text(outcome.context, outcome.statement, outcome.replaces)
    assert not lint_codes(text) and not spec_codes(text), (lint_codes(text), spec_codes(text))
    assert recorded(lowered(text), text, outcome.statement)
    wrong = text.replace(f"\n{outcome.statement}\n", f"\n{outcome.wrong}\n")
    assert wrong != text
    if outcome.effect == DIFFERS:
        assert not lint_codes(wrong), lint_codes(wrong)
        assert not agrees(wrong), "the wrong variant agrees: the statement has no effect"
    else:
        codes = {code for code, _ in lint_codes(wrong) or spec_codes(wrong)}
        assert outcome.effect in codes, (outcome.effect, codes)


_MLP = 'plan demo\nspec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
_MLP_DP = _MLP + "mesh dp=2\nsplit x [dp, -]\nsplit target [dp, -]\n"
_MLP_PP = _MLP + ("mesh pp=2, dp=2\nsplit x [dp, -]\nsplit target [dp, -]\n"
                  "pipeline-stage 0: fc1\npipeline-stage 1: fc2, loss\n")

#: The gaps of issue 8 this file accounts for, as a new user wrote them: each was dropped
#: ("agrees", exit 0) or an internal error (exit 2); each is now a diagnostic at its line.
GAPS = [
    (_MLP_DP + "all-reduce grad(params) over dp op=avg\n"
     "all-to-all grad(fc1.weight) over dp split-dim=0 concat-dim=1\n", "TVP256", 7),
    (_MLP_DP + "copy grad(params) over dp\nall-reduce grad(params) over dp op=avg\n",
     "TVP256", 6),
    (_MLP_PP + "all-reduce grad(params) over dp op=avg\nall-reduce grad(fc1.weight) over pp\n",
     "TVP246", 9),
    (_MLP_PP + "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.1 shard over dp, pp\n",
     "TVP246", 9),
    (_MLP_PP + "split fc1.weight [pp, -]\nall-reduce grad(params) over dp op=avg\n",
     "TVP236", 8),
    (_MLP_PP + "all-reduce fc1.out over pp\nall-reduce grad(params) over dp op=avg\n",
     "TVP246", 8),
    (_MLP_DP + "reduce-scatter grad(fc2.bias) over dp dim=0 op=avg\n"
     "all-reduce grad(fc1.*) over dp op=avg\nall-reduce grad(fc2.weight) over dp op=avg\n",
     "TVP234", 6),
    (_MLP_DP.replace("seq 1", "seq 1 d_out 4") +
     "reduce-scatter grad(fc1.weight) over dp dim=1 op=avg\n"
     "all-reduce grad(fc1.bias) over dp op=avg\nall-reduce grad(fc2.*) over dp op=avg\n"
     "optimizer sgd lr=0.1 shard over dp\n", "TVP412", 6),
    (_MLP_DP + "reduce-scatter grad(fc1.weight) over dp dim=0 op=avg\n"
     "all-reduce grad(fc1.bias) over dp op=avg\nall-reduce grad(fc2.*) over dp op=avg\n"
     "optimizer sgd lr=0.1\n", "TVP412", 6),
]


@pytest.mark.parametrize(("text", "code", "line"), GAPS, ids=[f"{c}-{i}" for i, (_, c, _)
                                                              in enumerate(GAPS)])
def test_issue_gaps_are_located_diagnostics(text: str, code: str, line: int,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from trainverify_dsl.cli.main import main

    path = write(text)
    assert text.splitlines()[line - 1]
    assert main(["simulate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert f"{path}:{line}:1: error:" in out and f"[{code}]" in out, out + err
    assert "internal error" not in err and "agrees" not in out
