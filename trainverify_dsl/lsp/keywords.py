"""What each keyword of the plan language means, in one line: the editor's hover text.

Transcribed from the language reference, ``docs/language.md`` (its sections *Header
statements*, *Layouts*, *Collectives*, *Pipeline*, *Optimizer*, *Parallel algorithms*,
*Templates and loops*); that file stays the full reference and this table its short form.
``tests/test_lsp.py`` checks that the table names exactly the grammar's keywords and the ones
the reference lists. Two tables, because keywords are soft and ``for`` means two things: a
statement's first word (``STATEMENTS``), and the words inside a statement (``INNER``).
"""

from __future__ import annotations

#: statement keyword -> (the statement's form, what it means)
STATEMENTS: dict[str, tuple[str, str]] = {
    "plan": ("plan NAME",
             "Names the plan. Only in a main plan file; a file without it is a fragment."),
    "spec": ('spec "FILE:CLASS" config NAME batch N seq N [KEY VALUE]...',
             "The model (a Python file and an nn.Module class), its named configuration, the "
             "global batch size and the sequence length."),
    "spec-optimizer": ("spec-optimizer KIND KEY=VALUE...",
                       "The reference step's optimizer: the single-device training script's "
                       "torch.optim recipe, which the plan's `optimizer` is checked against; "
                       "`clip-grad-norm=X` when the script clips."),
    "mesh": ("mesh AXIS=SIZE, ...",
             "Named mesh axes, outermost first; global ranks are row-major over the axes."),
    "microbatches": ("microbatches N [schedule S]",
                     "The global batch is cut into N microbatches, each split over the batch "
                     "axes; gradients accumulate over them."),
    "loss-scale": ("loss-scale EXPR",
                   "Every device's local backward starts from seed EXPR (default 1); with a "
                   "mean loss and microbatches the correct value is 1/microbatches."),
    "loss-reduction": ("loss-reduction local-mean | token-mean [over AXES] | sum scale=EXPR",
                       "How every rank normalises its local loss: by its own token count "
                       "(local-mean, the default), by the token count of the whole step summed "
                       "over the data axes and microbatches (token-mean), or a plain sum times "
                       "a stated scale (sum)."),
    "use": ('use "PATH"',
            "Includes a fragment (paths relative to the including file, then to the project "
            "root; stdlib/... names the shipped library). Its templates become visible; its "
            "other statements are included at the point of use."),
    "split": ("split T [E0, E1, ...]",
              "One entry per tensor dimension: `-` (not split), a mesh axis, or `(a, b)` "
              "(several axes, the first outermost). Defines the layout of an input or "
              "parameter; on a computed tensor it is a claim the checker proves."),
    "replicate": ("replicate T [over AXES]",
                  "Every rank of the axes holds a copy (no axes: every axis)."),
    "partial": ("partial T over AXES [op=sum|avg|max|min]",
                "The logical value is `op` over the ranks' pieces (default sum)."),
    "place": ("place T [S(0), R, P(sum)]",
              "DTensor placements, one per mesh axis in mesh order, or named: "
              "`place T [tp=S(0), dp=R]`."),
    "all-reduce": ("all-reduce T over AXES [op=sum|avg|max]",
                   "Reduce over the group, result replicated. Default backward: identity."),
    "all-gather": ("all-gather T over AXES dim=D",
                   "Concatenate the group's pieces along D. Default backward: reduce-scatter."),
    "reduce-scatter": ("reduce-scatter T over AXES dim=D [op=sum|avg]",
                       "Reduce, then scatter along D. Default backward: all-gather."),
    "all-to-all": ("all-to-all T over AXES split-dim=D concat-dim=E",
                   "Exchange blocks. Default backward: all-to-all (the inverse)."),
    "copy": ("copy T over AXES",
             'Identity ("copy to region"). Default backward: all-reduce.'),
    "scatter": ("scatter T over AXES dim=D",
                "Keep the local block, no communication. Default backward: all-gather."),
    "send": ("send T from N to M",
             "An explicit point-to-point transfer between pipeline stages; the implied "
             "transfers need no statement."),
    "pipeline-stage": ("pipeline-stage N: M, M, ...",
                       "Assigns spec modules to pp rank N. Stages are numbered 0 .. pp-1, must "
                       "not overlap and must cover the module list in order; with "
                       "interleaved-1f1b a stage lists its layer chunks (virtual stages)."),
    "optimizer": ("optimizer sgd|adam|adamw KEY=VALUE... [shard over AXES]",
                  "The plan's implementation of the step, checked against `spec-optimizer`; "
                  "`shard over` is ZeRO-1."),
    "on": ("on AXIS=K[, AXIS=K]...: optimizer KIND KEY=VALUE... | on TARGET, ...: "
           "optimizer|spec-optimizer KIND KEY=VALUE...",
           "A per-rank override: on the ranks with those mesh coordinates the optimizer step "
           "uses these hyper-parameters in place of the plan-wide `optimizer`'s (the same "
           "kind, no `shard`, unstated ones inherited): how a setting changed on some ranks "
           "is written down. With parameters instead of coordinates, a parameter group (of "
           "the plan's optimizer, or of the `spec-optimizer` recipe): those parameters are "
           "updated with these hyper-parameters, as a torch.optim parameter group."),
    "clip-grad-norm": ("clip-grad-norm X [over AXES] [replicas=once|each]",
                       "Clip gradients by their norm: squares summed over the axes (no axes: "
                       "every mesh axis), replicated copies counted once by default."),
    "algorithm": ("algorithm NAME for T, ... [over AXES]",
                  "Selects a parallel algorithm whose local program is not \"the same op on "
                  "local pieces\"; checked like everything else, never trusted."),
    "template": ("template NAME(PARAMS):",
                 "Defines an indented block of statements that `apply` expands, each parameter "
                 "replaced by its argument."),
    "apply": ("apply NAME(ARGS)",
              "Expands a template; positional arguments come before keyword arguments."),
    "for": ("for V in LIST, ...:",
            "Repeats its block for every element of the listed module lists "
            "(`for l in layers` means `layers.*`)."),
}

#: keyword inside a statement -> (where it stands, what it means)
INNER: dict[str, tuple[str, str]] = {
    "over": ("... over AXES",
             "The mesh axes: a collective's group (the ranks that differ only in those axes), "
             "or the axes of `replicate`, `partial`, `shard` and `clip-grad-norm`."),
    "in": ("for V in LIST, ...:", "The module lists the loop variable ranges over."),
    "for": ("algorithm NAME for T, ...", "The tensors or modules the algorithm is for."),
    "from": ("send T from N to M", "The pipeline stage the transfer leaves."),
    "to": ("send T from N to M", "The pipeline stage the transfer reaches."),
    "backward": ("... backward KIND",
                 "States a collective's backward: identity, all-reduce, all-gather, "
                 "reduce-scatter, all-to-all or scatter (default: Megatron's)."),
    "schedule": ("microbatches N schedule S",
                 "The pipeline schedule: gpipe, 1f1b or interleaved-1f1b; schedules order "
                 "work, they never change values."),
    "shard": ("optimizer ... shard over AXES",
              "ZeRO-1: the optimizer states and the update are sharded over the axes."),
    "grad": ("grad(X)", "The gradient of the loss with respect to X (X may be a pattern)."),
}


def describe(keyword: str, *, heads_statement: bool) -> tuple[str, str] | None:
    """(form, meaning) of ``keyword`` as a statement's first word or inside a statement."""
    table = STATEMENTS if heads_statement else INNER
    return table.get(keyword)
