"""Moved to ``trainverify_dsl.ir.mesh``; kept as an alias while branches that import the old
path are merged."""

from trainverify_dsl.ir.mesh import Mesh, MeshGroups  # noqa: F401
