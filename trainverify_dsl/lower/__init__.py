"""Lowering: plan + spec model -> the plan's ``ParallelProgram`` (docs/lowering.md).

``capture`` traces the spec's forward with its module boundaries marked, ``bind`` resolves the
plan's names against it, ``lowering`` rewrites it into one SPMD local program per pipeline
stage (layout ``rules``, ``collectives`` as a torch custom op, ``algorithms`` from their
registry) with its layout pass (``gradients``: the cotangent check, ``findings``), ``joint``
differentiates each stage with AOTAutograd, and ``program`` assembles the ``ParallelProgram``
(``ir/parallel.py``) that everything after the lowering reads.
"""
