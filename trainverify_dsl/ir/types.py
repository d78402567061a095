"""Tensor types of the IR: a static shape and a dtype name.

Dtypes are short strings (``f32``, ``bf16``, ``i64``, ``bool``...). The numeric interpreter
computes every float dtype in float64 and every integer dtype in int64: the IR means real
arithmetic, and rounding to the storage dtype is deliberately not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLOAT_DTYPES = ("f16", "bf16", "f32", "f64")
INT_DTYPES = ("u8", "i8", "i16", "i32", "i64")
BOOL_DTYPES = ("bool",)
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES

_CATEGORY = {**{d: 2 for d in FLOAT_DTYPES}, **{d: 1 for d in INT_DTYPES}, "bool": 0}
_RANK = {d: i for i, d in enumerate(ALL_DTYPES)}


@dataclass(frozen=True, slots=True)
class TensorType:
    """A static shape (tuple of non-negative ints; ``()`` for a scalar) and a dtype name."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(s) for s in self.shape)}]"


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def category(dtype: str) -> int:
    """0 bool, 1 integer, 2 float: the promotion categories of torch."""
    return _CATEGORY[dtype]


def numpy_dtype(dtype: str) -> type:
    """The interpreter's carrier type: float64, int64 or bool."""
    return (np.bool_, np.int64, np.float64)[category(dtype)]


def promote(types: tuple[TensorType, ...]) -> str:
    """Result dtype of an elementwise op, following torch's rule for tensor operands.

    The highest category present wins; within it, dimensioned tensors outrank 0-d tensors
    (so ``f32[4] * f64[]`` is ``f32``); among equals the wider dtype wins (``bf16``/``f16``
    mixes give ``f32``).
    """
    top = max(category(t.dtype) for t in types)
    candidates = [t for t in types if category(t.dtype) == top and t.rank > 0]
    if not candidates:
        candidates = [t for t in types if category(t.dtype) == top]
    names = {t.dtype for t in candidates}
    if names == {"f16", "bf16"}:
        return "f32"
    return max(names, key=_RANK.__getitem__)
