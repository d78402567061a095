"""Diagnostic codes of the lowering and its layout pass (see report/codes.py for id ranges).

These need the spec model (torch): ``tvp lint --spec`` and ``tvp simulate`` report them. The
code's ``name`` is the key the lowering uses in its findings (``lower/findings.py``); three
findings reuse plan codes with the same meaning, now checked against the spec's real sizes
and data flow: TVP234 ``split-not-divisible`` (also a gradient reduce-scatter that does not
divide), TVP244 ``stage-order`` and TVP230 ``axis-used-twice`` (``shard over`` an axis that
already splits a parameter). Every ``example`` is a plan over the tiny MLP (``fc1``: 4 -> 8,
ReLU, ``fc2``: 8 -> 3, or 8 -> 4 with ``d_out 4`` where a ZeRO block must divide; biases, mean
squared error) or the tiny Llama that produces its code under ``tvp lint --spec``; every ``fix``
does not (tests/test_codes_lower.py runs them).
"""

from trainverify_dsl.report.diagnostics import Code, Severity

_MLP = (
    "plan demo\n"
    'spec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
    "mesh tp=2\n"
)


def _code(id: str, name: str, summary: str, what: str, why: str, example: str, fix: str,
          severity: Severity = Severity.ERROR) -> Code:
    return Code(id, name, severity, summary, what, why, example, fix)


UNBOUND_NAME = _code(
    "TVP401", "unbound-name", "a plan name selects nothing in the spec model",
    "A parameter, model input, module boundary (`X.in`, `X.out`), gradient or module named "
    "by the plan does not exist in the traced spec model. The message suggests the closest "
    "existing names.",
    "A statement about a tensor that does not exist silently does nothing: the parameter "
    "the author meant keeps its default (replicated) layout.",
    _MLP + "split fc1.wieght [tp, -]\n",
    _MLP + "split fc1.weight [tp, -]\nsplit fc1.bias [tp]\ncopy fc1.in over tp\n"
           "all-gather fc2.in over tp dim=1 backward scatter\n",
)
PARTIAL_INPUT = _code(
    "TVP402", "partial-input", "a parameter or model input is declared partial",
    "A `partial` layout on a parameter, optimizer state or model input.",
    "On inputs a layout defines the distribution, and there is no canonical way to cut a "
    "value into summands (Rule 2.3).",
    _MLP + "partial fc1.weight over tp\n",
    _MLP + "split fc1.weight [tp, -]\nsplit fc1.bias [tp]\ncopy fc1.in over tp\n"
           "all-gather fc2.in over tp dim=1 backward scatter\n",
)
LAYOUT_MISMATCH = _code(
    "TVP403", "layout-mismatch", "an op's operands are split incompatibly",
    "An op of the spec cannot run on the local pieces: its operands are split differently "
    "(a contraction whose two sides split the contracted dimension differently, an "
    "elementwise op on a split and a whole operand, a reshape that regroups a split "
    "dimension, a softmax along a split dimension...). No local program exists.",
    "The plan forgot a redistribution (an all-gather, a scatter) or split the wrong tensor.",
    _MLP + "split x [-, tp]\n",
    _MLP + "split x [tp, -]\nsplit target [tp, -]\nall-reduce grad(params) over tp op=avg\n",
)
PARTIAL_NONLINEAR = _code(
    "TVP404", "partial-nonlinear", "a partial sum is consumed by a nonlinear op",
    "A tensor whose pieces are summands of its value (after a contraction over a split "
    "dimension, or a sum over one) reaches an op that is not linear in it (ReLU, "
    "multiplication by another partial tensor, a norm, softmax...) before an `all-reduce`.",
    "relu(a) + relu(b) is not relu(a + b): every rank computes garbage from its summand. The "
    "classic instance is a row-parallel layer whose output is never all-reduced.",
    _MLP + "split fc1.weight [-, tp]\nsplit x [-, tp]\n",
    _MLP + "split fc1.weight [-, tp]\nsplit x [-, tp]\n"
           "algorithm row-parallel-linear for fc1 over tp\n",
)
MIXED_PARTIAL = _code(
    "TVP405", "mixed-partial", "a complete value is added to a partial sum",
    "An addition of a partial sum (over some axes) and a value that is complete over them, "
    "for example a bias added to a row-parallel product before the all-reduce.",
    "Each rank adds the whole value to its summand, so the reduced result contains it once "
    "per rank (docs/semantics.md §4.2 item 5).",
    _MLP + "split fc1.weight [-, tp]\nsplit x [-, tp]\nall-reduce fc1.out over tp\n",
    _MLP + "split fc1.weight [tp, -]\nsplit fc1.bias [tp]\ncopy fc1.in over tp\n"
           "all-gather fc2.in over tp dim=1 backward scatter\n",
)
COLLECTIVE_MISMATCH = _code(
    "TVP406", "collective-mismatch", "a collective does not fit the layout of its tensor",
    "A collective applied where its input layout makes it wrong: an all-reduce with op=sum of "
    "a tensor that is not partial over the axis (every copy is added), a reduction over an "
    "axis that splits the tensor (pieces of different slices are added), op=avg of a partial "
    "sum, an all-gather of a partial sum or of a dimension not split over the axis (or "
    "split in another order).",
    "These are the doubled all-reduce, wrong axis, all-gather-instead-of-all-reduce and "
    "avg-instead-of-sum bugs.",
    _MLP + "all-reduce fc2.out over tp\n",
    _MLP + "split fc1.weight [tp, -]\nsplit fc1.bias [tp]\ncopy fc1.in over tp\n"
           "all-gather fc2.in over tp dim=1 backward scatter\n",
)
CLAIM_CONTRADICTS_LAYOUT = _code(
    "TVP407", "claim-contradicts-layout", "a layout claimed for a computed tensor is not what "
    "the plan computes",
    "A layout statement on an activation (`X.out`, `X.in`) claims a placement that layout "
    "propagation through the spec's ops and the plan's collectives does not give.",
    "Layouts on computed tensors are assertions the checker must prove; one that "
    "contradicts the propagated layout is false (or the plan is missing a collective).",
    _MLP + "split fc1.out [-, tp]\n",
    _MLP + "split fc1.weight [tp, -]\nsplit fc1.bias [tp]\ncopy fc1.in over tp\n"
           "split fc1.out [-, tp]\nall-gather fc2.in over tp dim=1 backward scatter\n",
)
ALGORITHM_NOT_APPLICABLE = _code(
    "TVP408", "algorithm-not-applicable", "a parallel algorithm does not fit its module",
    "The module named by `algorithm` does not have the shape the algorithm needs (an "
    "embedding lookup, split over the algorithm's axes; stacked expert weights; logits split "
    "over the vocabulary), or the algorithm is not implemented by the lowering.",
    "An algorithm replaces the module's local program; applied to the wrong tensors it "
    "computes something else (vocab-parallel cross-entropy on gathered logits).",
    _MLP + "algorithm vocab-parallel-embedding for fc1 over tp\n",
    _MLP + "split fc1.weight [tp, -]\nsplit fc1.bias [tp]\ncopy fc1.in over tp\n"
           "all-gather fc2.in over tp dim=1 backward scatter\n",
)
UNASSIGNED_OP = _code(
    "TVP409", "unassigned-op", "an op of the spec belongs to no pipeline stage",
    "With pipeline stages, an op outside every assigned module that is not computed from "
    "constants alone (the loss, a root-module addition) has no stage, and no stage lists "
    "`loss`.",
    "Every op must run somewhere; ops computed from constants (RoPE tables) are recomputed "
    "where used (docs/semantics.md Rule 5.1), others need a stage.",
    "plan demo\n"
    'spec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
    "mesh pp=2\n"
    "pipeline-stage 0: fc1\n"
    "pipeline-stage 1: fc2\n",
    "plan demo\n"
    'spec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
    "mesh pp=2\n"
    "pipeline-stage 0: fc1\n"
    "pipeline-stage 1: fc2, loss\n",
)

MISSING_COLLECTIVE = _code(
    "TVP410", "missing-collective", "a gradient comes out partial and nothing reduces it",
    "A complete value feeds a computation split over an axis (a column-parallel layer, a "
    "batch- or sequence-split activation), so on each rank its gradient is only a share "
    "(Partial(sum), docs/semantics.md §3.3); no `copy`/`all-gather` over the axis sums it on "
    "the way back, and no gradient statement reduces the parameters it reaches. A tied "
    "parameter used on several pipeline stages (an embedding tied to the output head) is "
    "partial over `pp` the same way: each stage's copy gets its own uses' gradient "
    "(docs/semantics.md §5.4).",
    "This is the missing `copy` in front of a column-parallel layer, the sequence-parallel "
    "norm weight whose gradient is never all-reduced, the missing data-parallel "
    "gradient all-reduce, and the missing embedding-group all-reduce of tied embeddings "
    "(`all-reduce grad(embed.weight) over pp`): the replicas drift apart.",
    _MLP.replace("tp=2", "dp=2") + "split x [dp, -]\nsplit target [dp, -]\n",
    _MLP.replace("tp=2", "dp=2") + "split x [dp, -]\nsplit target [dp, -]\n"
                                   "all-reduce grad(params) over dp op=avg\n",
)
LOSS_SCALE_MISMATCH = _code(
    "TVP411", "loss-scale-mismatch", "the loss scale and the gradient reduction do not undo "
    "each other",
    "Over the data axes (those splitting an input), the gradient statement's factor (1 for "
    "sum, 1/n for avg) times the loss scale times the number of data ranks and microbatches "
    "is not 1, so gradients come out that many times the spec's (docs/semantics.md §4.7).",
    "Loss not scaled by the microbatch count, scaled twice, or summed where the mean is "
    "needed: training runs with a silently wrong learning rate.",
    "plan demo\n"
    'spec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
    "mesh dp=2\nmicrobatches 2\nsplit x [dp, -]\nsplit target [dp, -]\n"
    "all-reduce grad(params) over dp op=avg\n",
    "plan demo\n"
    'spec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1\n'
    "mesh dp=2\nmicrobatches 2\nloss-scale 1/microbatches\nsplit x [dp, -]\n"
    "split target [dp, -]\nall-reduce grad(params) over dp op=avg\n",
)

_ZERO_MLP = (
    "plan demo\n"
    'spec "stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1 d_out 4\n'
    "mesh dp=2\nsplit x [dp, -]\nsplit target [dp, -]\n"
)
GRADIENT_LAYOUT_MISMATCH = _code(
    "TVP412", "gradient-layout-mismatch", "a reduce-scattered gradient is not the block the "
    "optimizer updates",
    "A `reduce-scatter grad(P)` leaves each rank a block of the gradient, but the optimizer "
    "step needs another piece: without `shard over` every rank updates its whole piece of "
    "the parameter; with `optimizer ... shard over A` a rank updates block `Z(P)` of dimension "
    "0 over `A` (docs/semantics.md Rule 6.1), so the reduce-scatter must be over exactly `A`, "
    "in that order, on dimension 0.",
    "The update would combine a parameter block with the gradient of another block (or of a "
    "quarter of it): DeepSpeed's ZeRO-2 reduce-scatters gradients into the same partition "
    "that owns the optimizer states, and a mismatch trains on the wrong gradients.",
    _ZERO_MLP + "reduce-scatter grad(params) over dp dim=0 op=avg\n"
                "spec-optimizer sgd lr=0.1\noptimizer sgd lr=0.1\n",
    _ZERO_MLP + "reduce-scatter grad(params) over dp dim=0 op=avg\n"
                "spec-optimizer sgd lr=0.1\noptimizer sgd lr=0.1 shard over dp\n",
)

_MASKED = (
    "plan demo\n"
    'spec "stdlib/models/llama.py:Llama" config llama_tiny batch 4 seq 8 ignore_index -100\n'
    "mesh dp=2, tp=2\nsplit tokens [dp, -]\nsplit labels [dp, -]\n"
)
LOSS_REDUCTION_MISMATCH = _code(
    "TVP414", "loss-reduction-mismatch", "the loss cannot be normalised as `loss-reduction` "
    "says",
    "`loss-reduction token-mean` and `sum` divide the spec loss's sum of per-token losses "
    "differently than the spec does (docs/semantics.md Rule 4.5): the spec's loss must end in "
    "a mean over every dimension or a sum divided by a token count, and a token-mean may sum "
    "the counts only over data axes (axes that split a model input; the ranks along any other "
    "axis hold the same tokens, whose counts would be added twice).",
    "A token count summed over a tensor-parallel axis divides every loss by tp times the "
    "tokens: gradients come out tp times too small.",
    _MASKED + "loss-reduction token-mean over dp, tp\nall-reduce grad(params) over dp op=sum\n",
    _MASKED + "loss-reduction token-mean over dp\nall-reduce grad(params) over dp op=sum\n",
)

COUNT_PER_BLOCK = _code(
    "TVP415", "count-per-block", "each block divides its loss by its own token count",
    "The spec's loss is a sum of per-token losses divided by a token count of the data "
    "(labels with an ignore index, a mask), and the plan divides otherwise than by the step's "
    "count: under the default `loss-reduction local-mean` each data block and microbatch "
    "divides by its own count and the step averages those means; `loss-reduction sum "
    "scale=s` divides by a fixed number. Either is the spec's loss only for batches where "
    "every block counts the same tokens (or exactly 1/s): `tvp simulate` compares at drawn "
    "inputs, and `tvp check` never verifies such a plan (docs/semantics.md §4.3).",
    "The mean of local means weights a token in a block with few counted tokens more than "
    "one in a full block: Hugging Face's gradient-accumulation loss bug (2024), and the "
    "padded-length normalisation of SFT batches.",
    _MASKED + "all-reduce grad(params) over dp op=avg\n",
    _MASKED + "loss-reduction token-mean\nall-reduce grad(params) over dp op=sum\n",
    Severity.WARNING,
)

# TVP413 `not-lowered` is retired (its one statement, `clip-grad-norm`, is lowered since
# session 8, docs/semantics.md §6.3): the id is never reused.

CODES: tuple[Code, ...] = (
    UNBOUND_NAME, PARTIAL_INPUT, LAYOUT_MISMATCH, PARTIAL_NONLINEAR,
    MIXED_PARTIAL, COLLECTIVE_MISMATCH, CLAIM_CONTRADICTS_LAYOUT,
    ALGORITHM_NOT_APPLICABLE, UNASSIGNED_OP, MISSING_COLLECTIVE, LOSS_SCALE_MISMATCH,
    GRADIENT_LAYOUT_MISMATCH, LOSS_REDUCTION_MISMATCH, COUNT_PER_BLOCK,
)
