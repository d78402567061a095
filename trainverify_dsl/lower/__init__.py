"""Lowering: plan + spec IR -> SPMD parallel program with lineages (issue #4).

Nothing is implemented yet; the meaning it must implement is docs/semantics.md.
"""
