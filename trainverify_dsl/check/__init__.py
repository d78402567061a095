"""The checker (``tvp check``; docs/checking.md): the pair of programs proven equal.

- ``pair.py``: the reference step and the parallel program as one value;
- ``terms.py``: exact symbolic values in a normal form (hash-consed);
- ``symbolic.py``: every IR op on symbolic tensors (one encoding per registry op), as an
  ``ir.interp.Domain``, so both programs run through their own interpreter code;
- ``prove.py``: both programs on symbols, the checks of ``ir/compare.py`` compared exactly,
  obligations decided by ``expand.py`` (multiplying out) and ``solver.py`` (z3, the only
  module importing it);
- ``verdict.py``: ``verified`` / ``counterexample`` / ``inconclusive`` / ``error`` with the
  assumptions each rests on.

Imports ``ir/`` and ``report/`` only (tests/test_architecture.py).
"""
