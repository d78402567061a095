"""The fixed vocabulary the resolver checks names against (one table per kind of name)."""

from __future__ import annotations

from fractions import Fraction

REDUCE_OPS = ("sum", "avg", "max", "min")

#: Options each collective accepts; required ones are listed in ``REQUIRED_OPTIONS``.
COLLECTIVE_OPTIONS: dict[str, tuple[str, ...]] = {
    "all-reduce": ("op", "after"),
    "all-gather": ("dim",),
    "reduce-scatter": ("dim", "op", "after"),
    "all-to-all": ("split-dim", "concat-dim"),
    "copy": (),
    "scatter": ("dim",),
}

#: When a gradient statement runs (``after=``, docs/semantics.md §4.5): after the last
#: microbatch (the default), after every one, or after microbatch ``k`` (a number, 1-based).
SYNC_TIMES = ("last", "each")

REQUIRED_OPTIONS: dict[str, tuple[str, ...]] = {
    "all-reduce": (),
    "all-gather": ("dim",),
    "reduce-scatter": ("dim",),
    "all-to-all": ("split-dim", "concat-dim"),
    "copy": (),
    "scatter": ("dim",),
}

#: Reduce ops each collective (and ``partial``) accepts for ``op=``.
COLLECTIVE_REDUCE_OPS: dict[str, tuple[str, ...]] = {
    "all-reduce": ("sum", "avg", "max", "min"),
    "reduce-scatter": ("sum", "avg"),
    "partial": REDUCE_OPS,
}

BACKWARD_KINDS = ("identity", "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "scatter")

PARTIAL_OPTIONS = ("op",)
CLIP_OPTIONS = ("norm-type", "replicas")
#: ``replicas=``: a gradient copy replicated over a norm-group axis counts once (Megatron's
#: ``param_is_not_tensor_parallel_duplicate``) or once per copy.
CLIP_REPLICAS = ("once", "each")
#: ``loss-reduction`` modes (docs/semantics.md §4.3): the local loss divided by the rank's own
#: token count (the default), by the step's token count, or a sum times a stated scale.
LOSS_REDUCTIONS = ("local-mean", "token-mean", "sum")
LOSS_REDUCTION_DEFAULT = "local-mean"
#: ``loss-reduction``'s options (``scale=`` of ``sum``)
LOSS_REDUCTION_OPTIONS = ("scale",)
#: the ``spec-optimizer`` option giving the reference step's gradient clipping
SPEC_CLIP = "clip-grad-norm"

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")

ALGORITHMS = (
    "vocab-parallel-embedding",
    "vocab-parallel-cross-entropy",
    "context-parallel-attention",
    "expert-parallel",
    "row-parallel-linear",
)
#: The options each algorithm defines (``KEY=VALUE`` on its statement); an algorithm's local
#: program is fixed by docs/semantics.md §7, so any other option is an error rather than a
#: setting silently ignored. ``smoothing=vocabulary|partition``: the label-smoothing term's
#: mean over the whole vocabulary (default) or over the rank's partition (§7.2).
#: ``order=contiguous|zigzag``: the block order of the sequence the context-parallel attention
#: computes its positions for (§7.4; it must be the order the inputs are split in, §2.6).
ALGORITHM_OPTIONS: dict[str, tuple[str, ...]] = {
    **{name: () for name in ALGORITHMS}, "vocab-parallel-cross-entropy": ("smoothing",),
    "context-parallel-attention": ("order",), "row-parallel-linear": ("scatter-dim",)}
ALGORITHM_OPTION_VALUES: dict[tuple[str, str], tuple[str, ...]] = {
    ("vocab-parallel-cross-entropy", "smoothing"): ("vocabulary", "partition"),
    ("context-parallel-attention", "order"): ("contiguous", "zigzag")}

#: Hyper-parameters per optimizer kind; ``lr`` is required for every kind.
OPTIMIZER_HYPER: dict[str, tuple[str, ...]] = {
    "sgd": ("lr", "momentum", "weight-decay"),
    "adam": ("lr", "betas", "eps", "weight-decay"),
    "adamw": ("lr", "betas", "eps", "weight-decay"),
}
REQUIRED_HYPER = ("lr",)
#: torch.optim's defaults of the hyper-parameters a statement may leave out, exact as the
#: plan's decimal literals are (``eps=1e-8`` written out is this default, not the float's
#: binary neighbour).
OPTIMIZER_DEFAULTS: dict[str, dict[str, object]] = {
    "sgd": {"momentum": 0, "weight-decay": 0},
    "adam": {"betas": (Fraction("0.9"), Fraction("0.999")), "eps": Fraction("1e-8"),
             "weight-decay": 0},
    "adamw": {"betas": (Fraction("0.9"), Fraction("0.999")), "eps": Fraction("1e-8"),
              "weight-decay": Fraction("0.01")},
}

#: Model inputs whose dimensions the spec line fixes: dims are (``batch``, ``seq``).
#: Block orders a split entry may state (``split tokens [dp, zigzag(cp)]``, semantics §2.6).
BLOCK_ORDERS = ("contiguous", "zigzag")

INPUT_DIMS: dict[str, tuple[str, ...]] = {"tokens": ("batch", "seq"), "labels": ("batch", "seq")}
