"""Reading foreign files as located data (importers/source.py): the JSON reader agrees with
the standard library and knows where everything is; the Python reader reads literals and
refuses everything that would have to run."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainverify_dsl.importers.source import (
    Call,
    Node,
    Unreadable,
    read_class_attributes,
    read_json,
    read_python,
    read_style_string,
)
from trainverify_dsl.report.span import Span


def plain(node: Node) -> object:
    """The Python value of a node tree (calls as tuples)."""
    value = node.value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    if isinstance(value, Call):
        return (value.name, [plain(a) for a in value.args],
                {k: plain(v) for k, v in value.kwargs})
    return value


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.sampled_from([None, 1, 2]), st.booleans())
def test_the_json_reader_reads_what_json_reads(value: object, indent: int | None,
                                               ascii_only: bool) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    assert plain(read_json(text, "x.json")) == json.loads(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_the_json_reader_refuses_what_json_refuses(text: str) -> None:
    try:
        expected = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        with pytest.raises(Unreadable):
            read_json(text, "x.json")
        return
    if isinstance(expected, dict) and text.count(":") != len(expected):
        return  # a repeated key: json keeps the last, the reader refuses (tested below)
    if _non_finite(expected):  # NaN and Infinity: Python's extension, not JSON (RFC 8259)
        with pytest.raises(Unreadable):
            read_json(text, "x.json")
        return
    assert plain(read_json(text, "x.json")) == expected


def _non_finite(value: object) -> bool:
    import math

    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    return isinstance(value, list) and any(_non_finite(v) for v in value)


def test_positions_of_values_and_keys() -> None:
    text = '{\n  "a": [1, {"b": "c"}],\n  "é": true\n}'
    root = read_json(text, "f.json")
    a = root.get("a")
    assert a is not None and (a.span.line, a.span.col) == (2, 8)
    assert a.key_span is not None and (a.key_span.line, a.key_span.col) == (2, 3)
    inner = a.value[1].get("b")  # type: ignore[index]
    assert (inner.span.line, inner.span.col, inner.span.end_col) == (2, 18, 21)
    assert inner.path == '["a"][1]["b"]'
    accent = root.get("é")
    assert accent is not None and (accent.span.line, accent.span.col) == (3, 8)


@pytest.mark.parametrize(("text", "message", "where"), [
    ('{"a": 1, "a": 2}', 'not valid JSON: the key "a" appears twice', (1, 10)),
    ('{"a": 1,}', "not valid JSON: a trailing comma before '}'", (1, 8)),
    ("[1 2]", "not valid JSON: expected ',' or ']'", (1, 4)),
    ('{"a": tru}', "not valid JSON: expected a value", (1, 7)),
    ("[" * 150 + "]" * 150, "not valid JSON: nested more than 100 levels deep", (1, 102)),
    ('"\\x"', "not valid JSON: Invalid \\escape", (1, 2)),
])
def test_invalid_json_is_located(text: str, message: str, where: tuple[int, int]) -> None:
    with pytest.raises(Unreadable) as refused:
        read_json(text, "f.json")
    diagnostic = refused.value.diagnostic
    assert (diagnostic.message, diagnostic.span.line, diagnostic.span.col) == (message, *where)
    assert diagnostic.code.id == "TVP601"


def test_python_literals_and_style_calls() -> None:
    source = ("from torch.distributed.tensor import Shard\n"
              '"""doc"""\n'
              "plan = {'x': torch.distributed.tensor.parallel.RowwiseParallel("
              "output_layouts=Shard(-1), use_local_output=False), 'y': [1, (2, -3.5), None]}\n")
    found = read_python(source, "p.py")
    assert plain(found["plan"]) == {
        "x": ("torch.distributed.tensor.parallel.RowwiseParallel", [],
              {"output_layouts": ("Shard", [-1], {}), "use_local_output": False}),
        "y": [1, [2, -3.5], None]}
    key = found["plan"].value["x"].key_span  # type: ignore[index]
    assert key is not None and (key.line, key.col) == (3, 9)


@pytest.mark.parametrize(("source", "message"), [
    ("plan = {'x': width + 1}\n", "the importer reads literals only"),
    ("plan = {'x': make()()}\n", "a call must name a class"),
    ("plan = {'x': ColwiseParallel(*args)}\n", "*args and **kwargs cannot be read"),
    ("plan = {'x': [i for i in range(3)]}\n", "the importer reads literals only"),
    ("plan = {}\nplan = {}\n", "'plan' is assigned twice"),
    ("plan = {}\nplan['x'] = 1\n", "only simple assignments NAME = literal are read"),
    ("import os\nos.system('true')\n", "the importer reads imports and NAME = literal"),
    ("plan = {k: 1}\n", "dict keys must be string literals"),
    ("plan = {\n", "not valid Python"),
])
def test_python_that_would_have_to_run_is_refused(source: str, message: str) -> None:
    with pytest.raises(Unreadable) as refused:
        read_python(source, "p.py")
    assert message in refused.value.diagnostic.message


def test_class_attributes_are_read_and_their_other_uses_refused() -> None:
    source = ("@decorate(x=call())\n"
              "class C(Base):\n"
              "    tp = {'a': 'colwise'}\n"
              "    other = compute()\n"
              "    def f(self):\n"
              "        return 1\n")
    assert plain(read_class_attributes(source, "c.py", frozenset({"tp"}))["tp"]) == \
        {"a": "colwise"}
    with pytest.raises(Unreadable) as refused:
        read_class_attributes(source + "C.tp['b'] = 'rowwise'\n", "c.py", frozenset({"tp"}))
    assert refused.value.diagnostic.span.line == 7


def test_a_style_string_points_at_its_json_string() -> None:
    span = Span("f.json", 3, 10, 3, 40)
    node = read_style_string("ColwiseParallel(input_layouts=Shard(1))", span, "p")
    call = node.value
    assert isinstance(call, Call) and call.name == "ColwiseParallel"
    assert dict(call.kwargs)["input_layouts"].span == span
    with pytest.raises(Unreadable) as refused:
        read_style_string("ColwiseParallel(", span, "p")
    assert refused.value.diagnostic.span == span
