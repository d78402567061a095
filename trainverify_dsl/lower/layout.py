"""Moved to ``trainverify_dsl.ir.layout`` (lineages are IR data); kept as an alias while
branches that import the old path are merged."""

from trainverify_dsl.ir.layout import *  # noqa: F401,F403
from trainverify_dsl.ir.layout import (  # noqa: F401
    MICROBATCH_AXIS,
    Factor,
    LayoutError,
    TLayout,
    append_axes,
    normalize_dim,
    take_local,
    ways,
)
