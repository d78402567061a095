"""The checker: stages, symmetry, shape reduction, numeric pre-check, z3 proofs.

Nothing is implemented yet (issue 9); `tvp check` does not exist, so nothing in this
project reports "verified".
"""
