"""The SPMD interpreter runs one local program per rank; collectives combine ranks.

A Megatron-style tensor-parallel MLP (column-parallel W1, row-parallel W2, forward
all-reduce) reproduces the single-device output, and a missing all-reduce does not.
"""

from __future__ import annotations

import numpy as np
import pytest

from trainverify_dsl.ir import GraphBuilder, TensorType, evaluate_graph, evaluate_spmd
from trainverify_dsl.ir.verify import verify_graph

TP = 2
RNG = np.random.default_rng(7)
X, W1, W2 = RNG.normal(size=(3, 4)), RNG.normal(size=(4, 8)), RNG.normal(size=(8, 4))


def mlp(hidden: int, reduce: bool):
    b = GraphBuilder()
    x = b.add_input("x", "data", TensorType((3, 4), "f64"))
    w1 = b.add_input("w1", "param", TensorType((4, hidden), "f64"))
    w2 = b.add_input("w2", "param", TensorType((hidden, 4), "f64"))
    y = b.add("mm", (b.add("tanh", (b.add("mm", (x, w1)),)), w2))
    if reduce:
        y = b.add("all_reduce", (y,), {"axis": "tp", "group_size": TP, "op": "sum"})
    b.add_output("y", y)
    return b.build()


def shards() -> list[dict]:
    cols = np.split(W1, TP, axis=1)
    rows = np.split(W2, TP, axis=0)
    return [{"x": X, "w1": cols[r], "w2": rows[r]} for r in range(TP)]


def test_tensor_parallel_mlp_matches_single_device() -> None:
    want = evaluate_graph(mlp(8, reduce=False), {"x": X, "w1": W1, "w2": W2})["y"]
    local = mlp(8 // TP, reduce=True)
    verify_graph(local, allow_collectives=True)
    for out in evaluate_spmd(local, shards()):
        np.testing.assert_allclose(out["y"], want, rtol=1e-13)


def test_missing_all_reduce_gives_partial_sums() -> None:
    want = evaluate_graph(mlp(8, reduce=False), {"x": X, "w1": W1, "w2": W2})["y"]
    outs = evaluate_spmd(mlp(8 // TP, reduce=False), shards())
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(outs[0]["y"], want, rtol=1e-6)
    np.testing.assert_allclose(outs[0]["y"] + outs[1]["y"], want, rtol=1e-13)
