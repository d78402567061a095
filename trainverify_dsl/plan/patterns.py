"""AST paths to resolved ``TensorPattern``s."""

from __future__ import annotations

from trainverify_dsl.parse import ast
from trainverify_dsl.plan.model import (
    GlobSeg,
    IndexSeg,
    NameSeg,
    PatternSegment,
    SliceSeg,
    TensorPattern,
)


def _segment(seg: ast.Segment) -> PatternSegment:
    match seg:
        case ast.Name(name=name):
            return NameSeg(name)
        case ast.Index(index=index):
            return IndexSeg(index)
        case ast.Slice(start=start, stop=stop, step=step):
            return SliceSeg(start, stop, step)
        case ast.Glob(pattern=pattern):
            return GlobSeg(pattern)
    raise AssertionError(f"unknown path segment {seg!r}")


def pattern_of(node: ast.Path | ast.GradRef) -> TensorPattern:
    """The resolved pattern of an (already substituted) path or ``grad(path)``."""
    if isinstance(node, ast.GradRef):
        return TensorPattern(tuple(_segment(s) for s in node.path.segments), grad=True)
    return TensorPattern(tuple(_segment(s) for s in node.segments))


def zero_step_slice(node: ast.Path | ast.GradRef) -> ast.Slice | None:
    """A ``[a:b:0]`` segment, which selects nothing and is reported, if any."""
    path = node.path if isinstance(node, ast.GradRef) else node
    for seg in path.segments:
        if isinstance(seg, ast.Slice) and seg.step == 0:
            return seg
    return None
