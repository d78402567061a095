"""Every op in the registry against torch (float64 / int64) on random inputs.

``CASES`` holds at least one case per op; ``test_every_op_has_a_case`` fails when an op is
added to the registry without one. Each case builds a one-node graph through the shape rule
(so shape and dtype rules are checked against torch too) and evaluates it with the
interpreter. Collectives are checked against torch reductions/concatenations of the per-rank
tensors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trainverify_dsl.ir import GraphBuilder, TensorType, evaluate_graph, evaluate_spmd
from trainverify_dsl.ir.ops import OPS, ShapeError
from trainverify_dsl.ir.verify import verify_graph
from trainverify_dsl.spec.convert import DTYPES

GEN = torch.Generator().manual_seed(1234)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN, dtype=torch.float64)


def pos(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=GEN, dtype=torch.float64) + 0.1


def ints(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=GEN)


def bools(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=GEN) > 0.5


def scalar(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64)


A, B = rand(3, 4), rand(3, 4)
ROW = rand(4)

# op -> list of (operands, attrs, torch function of the operands)
CASES: dict[str, list[tuple[list[torch.Tensor], dict, object]]] = {
    "full": [([], {"shape": (2, 3), "value": 1.5, "dtype": "f64"},
              lambda: torch.full((2, 3), 1.5, dtype=torch.float64)),
             ([], {"shape": (), "value": -100, "dtype": "i64"}, lambda: torch.tensor(-100))],
    "literal": [([], {"shape": (2, 2), "values": (1, -2, 3, 0), "dtype": "i64"},
                 lambda: torch.tensor([[1, -2], [3, 0]]))],
    "arange": [([], {"start": 2, "end": 11, "step": 3, "dtype": "i64"},
                lambda: torch.arange(2, 11, 3))],
    "neg": [([A], {}, torch.neg)],
    "abs": [([A], {}, torch.abs)],
    "sign": [([A], {}, torch.sign)],
    "exp": [([A], {}, torch.exp)],
    "log": [([pos(3, 4)], {}, torch.log)],
    "log1p": [([pos(3, 4)], {}, torch.log1p)],
    "sqrt": [([pos(3, 4)], {}, torch.sqrt)],
    "rsqrt": [([pos(3, 4)], {}, torch.rsqrt)],
    "reciprocal": [([pos(3, 4)], {}, torch.reciprocal)],
    "sin": [([A], {}, torch.sin)],
    "cos": [([A], {}, torch.cos)],
    "tanh": [([A], {}, torch.tanh)],
    "sigmoid": [([A], {}, torch.sigmoid)],
    "erf": [([A], {}, torch.erf)],
    "relu": [([A], {}, torch.relu)],
    "isnan": [([torch.tensor([0.0, float("nan"), 1.0], dtype=torch.float64)], {}, torch.isnan)],
    "logical_not": [([bools(3, 4)], {}, torch.logical_not)],
    "bitwise_not": [([bools(3, 4)], {}, torch.bitwise_not), ([ints(9, 5)], {}, torch.bitwise_not)],
    "gelu": [([A], {"approximate": "none"}, F.gelu),
             ([A], {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh"))],
    "clamp": [([A], {"min": -0.5, "max": 0.25}, lambda x: torch.clamp(x, -0.5, 0.25)),
              ([ints(20, 6)], {"min": 3, "max": None}, lambda x: torch.clamp(x, min=3))],
    "convert": [([A * 3], {"dtype": "i64"}, lambda x: x.to(torch.int64)),
                ([ints(3, 5)], {"dtype": "bool"}, lambda x: x.to(torch.bool)),
                ([ints(9, 5)], {"dtype": "f32"}, lambda x: x.to(torch.float32))],
    "add": [([A, ROW], {}, torch.add)],
    "sub": [([A, rand(3, 1)], {}, torch.sub)],
    "mul": [([A, scalar(2.5)], {}, torch.mul), ([ints(5, 4), ints(5, 4)], {}, torch.mul)],
    "div": [([A, pos(4)], {}, torch.div), ([ints(9, 4), ints(3, 4) + 1], {}, torch.div)],
    "pow": [([pos(3, 4), scalar(3.0)], {}, torch.pow), ([pos(3, 4), rand(3, 4)], {}, torch.pow)],
    "maximum": [([A, B], {}, torch.maximum)],
    "minimum": [([A, B], {}, torch.minimum)],
    "eq": [([ints(3, 6), ints(3, 6)], {}, torch.eq)],
    "ne": [([ints(3, 6), torch.tensor(1)], {}, torch.ne)],
    "lt": [([A, B], {}, torch.lt)],
    "le": [([ints(3, 6), ints(3, 6)], {}, torch.le)],
    "gt": [([A, B], {}, torch.gt)],
    "ge": [([A, scalar(0.0)], {}, torch.ge)],
    "logical_and": [([bools(5), bools(5)], {}, torch.logical_and)],
    "logical_or": [([bools(5), bools(5)], {}, torch.logical_or)],
    "bitwise_and": [([bools(5), bools(5)], {}, torch.bitwise_and)],
    "bitwise_or": [([ints(16, 5), ints(16, 5)], {}, torch.bitwise_or)],
    "bitwise_xor": [([ints(16, 5), ints(16, 5)], {}, torch.bitwise_xor)],
    "where": [([bools(3, 4), A, scalar(0.0)], {}, torch.where)],
    "sum": [([rand(2, 3, 4)], {"dims": (0, 2), "keepdim": False}, lambda x: x.sum((0, 2))),
            ([bools(2, 3)], {"dims": (0, 1), "keepdim": False}, lambda x: x.sum())],
    "mean": [([rand(2, 3, 4)], {"dims": (1,), "keepdim": True},
              lambda x: x.mean(1, keepdim=True))],
    "amax": [([rand(2, 3, 4)], {"dims": (2,), "keepdim": False}, lambda x: x.amax(2))],
    "amin": [([rand(2, 3, 4)], {"dims": (0, 1), "keepdim": True},
              lambda x: x.amin((0, 1), keepdim=True))],
    "any": [([bools(3, 4)], {"dims": (1,), "keepdim": False}, lambda x: x.any(1))],
    "argmax": [([rand(3, 5)], {"dim": 1, "keepdim": True},
                lambda x: x.argmax(1, keepdim=True))],
    "cumsum": [([rand(3, 5)], {"dim": 1}, lambda x: x.cumsum(1))],
    "mm": [([rand(3, 5), rand(5, 2)], {}, torch.mm)],
    "bmm": [([rand(2, 3, 5), rand(2, 5, 4)], {}, torch.bmm)],
    "reshape": [([rand(2, 6)], {"shape": (3, 2, 2)}, lambda x: x.reshape(3, 2, 2))],
    "expand": [([rand(3, 1)], {"shape": (2, 3, 4)}, lambda x: x.expand(2, 3, 4))],
    "permute": [([rand(2, 3, 4)], {"dims": (2, 0, 1)}, lambda x: x.permute(2, 0, 1))],
    "unsqueeze": [([rand(2, 3)], {"dim": 1}, lambda x: x.unsqueeze(1))],
    "squeeze": [([rand(2, 1, 3, 1)], {"dims": (1, 3)}, lambda x: x.squeeze((1, 3)))],
    "flip": [([rand(2, 3, 4)], {"dims": (0, 2)}, lambda x: x.flip((0, 2)))],
    "slice": [([rand(4, 9)], {"dim": 1, "start": 1, "end": 8, "step": 3},
               lambda x: x[:, 1:8:3])],
    "slice_scatter": [([rand(4, 9), rand(4, 3)], {"dim": 1, "start": 1, "end": 8, "step": 3},
                       lambda x, s: torch.slice_scatter(x, s, 1, 1, 8, 3))],
    "select": [([rand(4, 5)], {"dim": 1, "index": 3}, lambda x: x[:, 3])],
    "select_scatter": [([rand(4, 5), rand(4)], {"dim": 1, "index": 2},
                        lambda x, s: torch.select_scatter(x, s, 1, 2))],
    "cat": [([rand(2, 3), rand(2, 1), rand(2, 2)], {"dim": 1},
             lambda *xs: torch.cat(xs, 1))],
    "gather": [([rand(3, 5), ints(5, 3, 2)], {"dim": 1}, lambda x, i: torch.gather(x, 1, i))],
    "scatter": [([rand(3, 5), torch.tensor([[0, 4], [1, 2], [3, 0]]), rand(3, 2)], {"dim": 1},
                 lambda d, i, s: torch.scatter(d, 1, i, s))],
    "scatter_add": [([rand(3, 5), ints(5, 3, 4), rand(3, 4)], {"dim": 1},
                     lambda d, i, s: torch.scatter_add(d, 1, i, s))],
    "index": [([rand(6, 4), ints(6, 2, 3)], {"skip": 0}, lambda x, i: x[i]),
              ([rand(5, 4, 3), ints(5, 7), ints(4, 7)], {"skip": 0}, lambda x, i, j: x[i, j]),
              ([rand(5, 4, 3), ints(4, 2, 2)], {"skip": 1}, lambda x, i: x[:, i])],
    "index_put": [([rand(6, 4), rand(5, 4), ints(6, 5)], {"accumulate": True, "skip": 0},
                   lambda x, v, i: torch.index_put(x, (i,), v, accumulate=True)),
                  ([rand(6, 4), rand(4), torch.tensor([1, 4])], {"accumulate": False, "skip": 0},
                   lambda x, v, i: torch.index_put(x, (i,), v)),
                  ([rand(3, 6), rand(3, 5), ints(6, 5)], {"accumulate": True, "skip": 1},
                   lambda x, v, i: torch.ops.aten.index_put(x, [None, i], v, True))],
    "index_select": [([rand(6, 4), ints(4, 5)], {"dim": 1},
                      lambda x, i: torch.index_select(x, 1, i))],
    "embedding": [([rand(10, 4), ints(10, 2, 3)], {}, lambda w, i: F.embedding(i, w))],
    "softmax": [([rand(3, 5)], {"dim": 1}, lambda x: torch.softmax(x, 1))],
    "log_softmax": [([rand(3, 5)], {"dim": 0}, lambda x: torch.log_softmax(x, 0))],
    "softmax_backward": [([rand(3, 5), torch.softmax(rand(3, 5), 1)], {"dim": 1},
                          lambda g, y: torch.ops.aten._softmax_backward_data(
                              g, y, 1, torch.float64))],
    "log_softmax_backward": [([rand(3, 5), torch.log_softmax(rand(3, 5), 1)], {"dim": 1},
                              lambda g, y: torch.ops.aten._log_softmax_backward_data(
                                  g, y, 1, torch.float64))],
    "topk_values": [([rand(3, 6)], {"dim": 1, "k": 2, "largest": True},
                     lambda x: torch.topk(x, 2, 1).values),
                    ([rand(3, 6)], {"dim": 0, "k": 2, "largest": False},
                     lambda x: torch.topk(x, 2, 0, largest=False).values)],
    "topk_indices": [([rand(3, 6)], {"dim": 1, "k": 3, "largest": True},
                      lambda x: torch.topk(x, 3, 1).indices)],
    "sort_values": [([rand(3, 6)], {"dim": 1, "descending": True},
                     lambda x: torch.sort(x, 1, descending=True).values)],
    "sort_indices": [([rand(3, 6)], {"dim": 0, "descending": False},
                      lambda x: torch.sort(x, 0).indices)],
}

RANKS = [rand(4, 8) for _ in range(4)]
COLLECTIVE_CASES = {
    "all_reduce": [({"op": "sum"}, lambda xs: [sum(xs)] * 4),
                   ({"op": "avg"}, lambda xs: [sum(xs) / 4] * 4),
                   ({"op": "max"}, lambda xs: [torch.stack(xs).amax(0)] * 4)],
    "all_gather": [({"dim": 1}, lambda xs: [torch.cat(xs, 1)] * 4)],
    "reduce_scatter": [({"dim": 0, "op": "sum"}, lambda xs: list(sum(xs).chunk(4, 0)))],
    "all_to_all": [({"split_dim": 1, "concat_dim": 0},
                    lambda xs: [torch.cat([x.chunk(4, 1)[j] for x in xs], 0) for j in range(4)])],
    "local_scatter": [({"dim": 1}, lambda xs: [x.chunk(4, 1)[k] for k, x in enumerate(xs)])],
    "send_recv": [({"pairs": ((0, 1), (1, 2), (2, 0))},
                   lambda xs: [xs[2], xs[0], xs[1], torch.zeros_like(xs[3])])],
}


def ir_type(t: torch.Tensor) -> TensorType:
    return TensorType(tuple(t.shape), DTYPES[t.dtype])


def run_one(op: str, operands: list[torch.Tensor], attrs: dict) -> tuple[np.ndarray, TensorType]:
    builder = GraphBuilder()
    ids = [builder.add_input(f"x{i}", "data", ir_type(t)) for i, t in enumerate(operands)]
    out = builder.add(op, ids, attrs)
    builder.add_output("out", out)
    graph = builder.build()
    verify_graph(graph)
    values = evaluate_graph(graph, {f"x{i}": t.numpy() for i, t in enumerate(operands)})
    return values["out"], graph.value_type(out)


def test_every_op_has_a_case() -> None:
    single = {name for name, op in OPS.items() if not op.collective}
    collective = {name for name, op in OPS.items() if op.collective}
    assert single - set(CASES) == set(), "ops without a numeric test case"
    assert collective - set(COLLECTIVE_CASES) == set(), "collectives without a test case"
    assert set(CASES) <= set(OPS) and set(COLLECTIVE_CASES) <= set(OPS)


@pytest.mark.parametrize(("op", "index"),
                         [(op, i) for op, cases in CASES.items() for i in range(len(cases))])
def test_op_matches_torch(op: str, index: int) -> None:
    operands, attrs, fn = CASES[op][index]
    expected = fn(*operands)
    got, type_ = run_one(op, operands, attrs)
    assert type_ == ir_type(expected), f"{op}: IR type {type_} vs torch {ir_type(expected)}"
    if expected.dtype.is_floating_point:
        # torch rounds float32 results; the IR means real arithmetic.
        rtol = 1e-12 if expected.dtype == torch.float64 else 1e-6
        np.testing.assert_allclose(got, expected.double().numpy(), rtol=rtol, atol=1e-14)
    else:
        np.testing.assert_array_equal(got, expected.numpy())


@pytest.mark.parametrize(("op", "index"), [(op, i) for op, cases in COLLECTIVE_CASES.items()
                                           for i in range(len(cases))])
def test_collective_semantics(op: str, index: int) -> None:
    attrs, fn = COLLECTIVE_CASES[op][index]
    attrs = {**attrs, "axis": "tp", "group_size": 4}
    builder = GraphBuilder()
    x = builder.add_input("x", "data", ir_type(RANKS[0]))
    builder.add_output("y", builder.add(op, (x,), attrs))
    graph = builder.build()
    verify_graph(graph, allow_collectives=True)
    results = evaluate_spmd(graph, [{"x": t.numpy()} for t in RANKS])
    for got, want in zip(results, fn(RANKS), strict=True):
        assert got["y"].shape == graph.value_type(graph.output_value("y")).shape
        np.testing.assert_allclose(got["y"], want.numpy(), rtol=1e-12)


def test_collectives_follow_mesh_groups() -> None:
    """Two tp groups of two ranks each reduce separately."""
    builder = GraphBuilder()
    x = builder.add_input("x", "data", TensorType((2,), "f64"))
    builder.add_output("y", builder.add("all_reduce", (x,), {"axis": "tp", "group_size": 2,
                                                              "op": "sum"}))
    values = [np.full(2, float(r)) for r in range(4)]
    out = evaluate_spmd(builder.build(), [{"x": v} for v in values],
                        groups=lambda axis: [[0, 1], [2, 3]])
    assert [o["y"][0] for o in out] == [1.0, 1.0, 5.0, 5.0]


@pytest.mark.parametrize(("op", "operands", "attrs"), [
    ("mm", [TensorType((2, 3), "f32"), TensorType((4, 5), "f32")], {}),
    ("add", [TensorType((2, 3), "f32"), TensorType((4,), "f32")], {}),
    ("reshape", [TensorType((2, 3), "f32")], {"shape": (4, 2)}),
    ("reduce_scatter", [TensorType((6,), "f32")],
     {"axis": "dp", "dim": 0, "group_size": 4, "op": "sum"}),
    ("gather", [TensorType((2, 3), "f32"), TensorType((2, 3), "f32")], {"dim": 0}),
])
def test_shape_rules_reject_bad_operands(op: str, operands: list[TensorType],
                                         attrs: dict) -> None:
    with pytest.raises(ShapeError):
        OPS[op].shape_rule(tuple(operands), attrs)


def test_erf_helper_agrees_with_math() -> None:
    got, _ = run_one("erf", [torch.tensor([0.5, -1.0], dtype=torch.float64)], {})
    assert got.tolist() == [math.erf(0.5), math.erf(-1.0)]
