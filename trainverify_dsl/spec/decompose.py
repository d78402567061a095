"""Decompositions of our own, beside Core ATen's, in the one table of both programs.

``linalg_vector_norm`` (``torch.norm``, ``F.normalize``) as its arithmetic (``vector_norm``).

``convolution`` (``nn.Conv1d``, ``nn.Conv2d``, ``nn.Conv3d``, ``F.conv*d``) as one batched
matrix product over the gathered windows (im2col): the input padded with zeros along its
spatial dimensions (``cat``), one strided ``slice`` per kernel position, the windows stacked
next to the input channels, and a ``bmm`` per channel group. Every op of it has an IR op and a
layout rule, so both programs differentiate the same arithmetic, and a plan may split the
batch (or any dimension the windows do not read across). A transposed convolution and
padding modes other than zeros (``padding_mode="reflect"`` reaches ATen as a ``pad`` before
the convolution) are left to ATen, and met there as an op without a converter.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch

aten = torch.ops.aten


def convolution(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                transposed: bool, output_padding: Sequence[int], groups: int) -> Any:
    """``aten.convolution`` as windows and one ``bmm`` per group (module docstring)."""
    spatial = weight.dim() - 2
    if transposed or spatial < 1 or x.dim() != weight.dim():
        return NotImplemented  # ATen's own op (no converter: reported as such)
    stride, padding, dilation = (_per_dim(v, spatial) for v in (stride, padding, dilation))
    n = x.shape[0]
    out_channels, group_in = weight.shape[0], weight.shape[1]
    kernel = tuple(weight.shape[2:])
    out = tuple((x.shape[2 + i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1)
                // stride[i] + 1 for i in range(spatial))
    for i, p in enumerate(padding):
        if p:
            shape = list(x.shape)
            shape[2 + i] = p
            zeros = aten.new_zeros(x, shape)
            x = aten.cat([zeros, x, zeros], 2 + i)
    positions = math.prod(out)
    windows = []
    for k in itertools.product(*(range(size) for size in kernel)):
        window = x
        for i, ki in enumerate(k):
            start = ki * dilation[i]
            window = aten.slice(window, 2 + i, start, start + (out[i] - 1) * stride[i] + 1,
                                stride[i])
        windows.append(aten.reshape(window, [n, groups, group_in, 1, positions]))
    taps = len(windows)
    gathered = windows[0] if taps == 1 else aten.cat(windows, 3)
    # [g, c*taps, n*positions]: the contraction (channel, then kernel position) as the weight
    columns = aten.reshape(aten.permute(gathered, [1, 2, 3, 0, 4]),
                           [groups, group_in * taps, n * positions])
    weights = aten.view(weight, [groups, out_channels // groups, group_in * taps])
    product = aten.view(aten.bmm(weights, columns),
                        [groups, out_channels // groups, n, positions])
    result = aten.reshape(aten.permute(product, [2, 0, 1, 3]), [n, out_channels, *out])
    if bias is not None:
        result = aten.add(result, aten.view(bias, [1, out_channels] + [1] * spatial))
    return result


def vector_norm(x: torch.Tensor, ord: float = 2, dim: Any = None, keepdim: bool = False,
                *, dtype: Any = None) -> Any:
    """``aten.linalg_vector_norm`` (``torch.norm``, ``F.normalize``, QK-norm, weight norm) as
    its arithmetic: ``sqrt(sum(x * x))`` for the 2-norm, ``amax(|x|)`` for the max norm,
    ``sum(|x|^p)^(1/p)`` otherwise; the count of non-zeros (``ord=0``) and the min norm are
    left to ATen (met as an op without a converter)."""
    if dtype is not None or ord in (0, float("-inf")) or isinstance(ord, bool):
        return NotImplemented
    dims = list(range(x.dim())) if dim is None or dim == [] else \
        ([dim] if isinstance(dim, int) else list(dim))
    if ord == float("inf"):
        return aten.amax(aten.abs(x), dims, keepdim)
    if ord == 2:
        return aten.sqrt(aten.sum(aten.mul(x, x), dims, keepdim))
    if ord == 1:
        return aten.sum(aten.abs(x), dims, keepdim)
    return aten.pow(aten.sum(aten.pow(aten.abs(x), ord), dims, keepdim), 1.0 / ord)


def _per_dim(value: Sequence[int], spatial: int) -> list[int]:
    value = list(value)
    return value * spatial if len(value) == 1 else value


#: (overload, decomposition) of this module, added to the shared table (``spec/trace.py``)
DECOMPOSITIONS = {aten.convolution.default: convolution,
                  aten.linalg_vector_norm.default: vector_norm}
