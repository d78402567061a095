"""IR graphs: canonical printing, the verifier's invariants, phase splitting, programs."""

from __future__ import annotations

import numpy as np
import pytest

from trainverify_dsl.ir import (
    Call,
    GraphBuilder,
    IRVerifyError,
    Origin,
    Program,
    TensorType,
    evaluate_graph,
    evaluate_program,
    format_graph,
    graph_problems,
    inline,
    program_problems,
    prune,
    verify_graph,
)
from trainverify_dsl.ir.graph import NO_ORIGIN, Node
from trainverify_dsl.ir.split import split_phases

F4 = TensorType((4,), "f64")
M23 = TensorType((2, 3), "f64")


def small_graph(origin: Origin = NO_ORIGIN) -> GraphBuilder:
    b = GraphBuilder()
    w = b.add_input("w", "param", TensorType((3, 4), "f64"))
    x = b.add_input("x", "data", M23)
    y = b.add("mm", (x, w), origin=origin)
    z = b.add("sum", (y,), {"keepdim": False, "dims": (0, 1)}, origin=origin)
    b.add_output("loss", z)
    return b


def test_printer_names_values_in_order_and_sorts_attributes() -> None:
    text = format_graph(small_graph().build(), "g")
    assert text == (
        "graph g(\n"
        '  %0: f64[3,4] = param "w"\n'
        '  %1: f64[2,3] = data "x"\n'
        ") {\n"
        "  %2: f64[2,4] = mm %1, %0\n"
        "  %3: f64[] = sum[dims=(0,1), keepdim=False] %2\n"
        "} -> (loss = %3)\n")


def test_origin_is_not_part_of_equality_or_canonical_text() -> None:
    a = small_graph(Origin("layers.0.fc", "forward")).build()
    b = small_graph(Origin("elsewhere", "backward")).build()
    assert a == b and hash(a) == hash(b)
    assert format_graph(a) == format_graph(b)
    assert "layers.0.fc" in format_graph(a, origins=True)


def bad_node(graph, index: int, **changes):
    nodes = list(graph.nodes)
    nodes[index] = nodes[index].replace(**changes)
    return type(graph)(graph.inputs, tuple(nodes), graph.outputs)


@pytest.mark.parametrize(("changes", "message"), [
    ({"op": "matmul"}, "unknown op"),
    ({"inputs": (1,)}, "takes 2 operands"),
    ({"inputs": (1, 3)}, "not defined before use"),
    ({"type": TensorType((2, 5), "f64")}, "shape rule gives"),
    ({"type": TensorType((2, 4), "f32")}, "shape rule gives"),
    ({"attrs": (("dims", (0,)),)}, "attributes"),
])
def test_verifier_reports_violations_with_context(changes: dict, message: str) -> None:
    graph = small_graph().build()
    index = 1 if "attrs" in changes else 0
    broken = bad_node(graph, index, **changes)
    with pytest.raises(IRVerifyError) as caught:
        verify_graph(broken)
    assert message in caught.value.problem
    assert "> " in caught.value.context and "%2" in caught.value.context


def test_verifier_checks_outputs_and_collectives() -> None:
    graph = small_graph().build()
    dangling = type(graph)(graph.inputs, graph.nodes, (("loss", 9),))
    assert any("undefined" in m for _, m in graph_problems(dangling))
    b = GraphBuilder()
    x = b.add_input("x", "data", F4)
    b.add_output("y", b.add("all_reduce", (x,), {"axis": "dp", "group_size": 2, "op": "sum"}))
    assert any("collective" in m for _, m in graph_problems(b.build()))
    assert graph_problems(b.build(), allow_collectives=True) == []


def test_prune_drops_dead_nodes() -> None:
    b = small_graph()
    b.add("neg", (0,))
    graph = b.build()
    assert len(prune(graph).nodes) == len(graph.nodes) - 1
    verify_graph(prune(graph))


def joint_like() -> GraphBuilder:
    """y = sum(w * x); backward: grad(w) = t * x (t the tangent), with a constant."""
    b = GraphBuilder()
    w, x = b.add_input("w", "param", F4), b.add_input("x", "data", F4)
    t = b.add_input("t", "tangent", TensorType((), "f64"))
    y = b.add("sum", (b.add("mul", (w, x)),), {"dims": (0,), "keepdim": False})
    two = b.add("full", (), {"shape": (), "value": 2.0, "dtype": "f64"})
    g = b.add("mul", (b.add("mul", (t, x)), two))
    b.add_output("y", y)
    b.add_output("grad(w)", g)
    return b


def test_split_phases_recomputes_constants_and_matches_the_joint_graph() -> None:
    graph = joint_like().build()
    forward, backward = split_phases(graph, {"t": 1}, 2)
    assert forward.output_names == ("y",)
    assert [g.name for g in backward.inputs] == ["x", "t"]
    assert any(n.op == "full" for n in backward.nodes)
    values = {"w": np.arange(4.0), "x": np.ones(4) * 3, "t": np.array(0.5)}
    joint = evaluate_graph(graph, values)
    y = evaluate_graph(forward, values)["y"]
    g = evaluate_graph(backward, values)["grad(w)"]
    assert y == joint["y"] and np.array_equal(g, joint["grad(w)"])


def test_split_phases_carries_saved_values() -> None:
    b = GraphBuilder()
    x, t = b.add_input("x", "data", F4), b.add_input("t", "tangent", F4)
    e = b.add("exp", (x,))
    b.add_output("y", e)
    b.add_output("g", b.add("mul", (t, e)))
    forward, backward = split_phases(b.build(), {"t": 1}, 2)
    assert forward.output_names == ("y", "saved.2")
    assert "saved.2" in [g.name for g in backward.inputs]


def two_call_program() -> Program:
    b = GraphBuilder()
    h = b.add_input("h", "activation", F4)
    s = b.add_input("s", "param", F4)
    b.add_output("out", b.add("tanh", (b.add("mul", (h, s)),)))
    layer = b.build()
    calls = (Call("layer", ("x", "s0"), ("h1",), "layers.0"),
             Call("layer", ("h1", "s1"), ("h2",), "layers.1"))
    inputs = tuple(layer.inputs[1].__class__(n, "param", F4) for n in ("s0", "s1"))
    x = layer.inputs[0].__class__("x", "data", F4)
    return Program(inputs + (x,), (("layer", layer),), calls, (("y", "h2"),))


def test_program_evaluates_like_its_inlined_graph() -> None:
    program = two_call_program()
    assert program_problems(program) == []
    values = {"x": np.linspace(-1, 1, 4), "s0": np.full(4, 2.0), "s1": np.full(4, -0.5)}
    want = np.tanh(np.tanh(values["x"] * 2.0) * -0.5)
    np.testing.assert_allclose(evaluate_program(program, values)["y"], want, rtol=1e-15)
    flat = inline(program)
    verify_graph(flat)
    np.testing.assert_allclose(evaluate_graph(flat, values)["y"], want, rtol=1e-15)
    assert program.unique_node_count == 2 and program.expanded_node_count == 4


def test_program_problems_catch_bad_wiring() -> None:
    program = two_call_program()
    swapped = Program(program.inputs, program.graphs, program.calls[::-1], program.outputs)
    assert any("not defined yet" in p for p in program_problems(swapped))
    wrong = Program(program.inputs, program.graphs,
                    (Call("layer", ("x", "s0", "s1"), ("h1",)),), program.outputs)
    assert any("wrong number" in p for p in program_problems(wrong))


def test_nodes_are_immutable_values() -> None:
    node = Node("neg", (0,), (), F4)
    with pytest.raises(AttributeError):
        node.op = "exp"  # type: ignore[misc]
    assert node.replace(op="exp").op == "exp" and node.op == "neg"
