"""Numeric simulation: the parallel program and the reference step evaluated on the same random
values, then the named checks (``run.py``); the reference checked against eager torch
(``torch_step.py``); the memory estimate (``budget.py``). The driver is
``trainverify_dsl.api.simulate_file``."""

from trainverify_dsl.simulate.run import TOLERANCE, Mismatch, SimulationResult

__all__ = ["Mismatch", "SimulationResult", "TOLERANCE"]
