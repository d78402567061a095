"""Numeric simulation of a lowered plan against the spec (``tvp simulate``)."""

from trainverify_dsl.simulate.api import simulate_file
from trainverify_dsl.simulate.run import TOLERANCE, Mismatch, SimulationResult

__all__ = ["Mismatch", "SimulationResult", "TOLERANCE", "simulate_file"]
