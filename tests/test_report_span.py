"""``new_span`` (the parser's fast way to make a span) makes exactly what ``Span(...)`` makes."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainverify_dsl.report.span import Span, new_span

FIELDS = st.tuples(st.text(max_size=8), *[st.integers(-1, 10**6)] * 6)


@given(FIELDS)
def test_new_span_is_the_span_the_constructor_makes(fields: tuple) -> None:
    made, built = new_span(*fields), Span(*fields)
    assert type(made) is Span
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    assert dataclasses.astuple(made) == fields
    assert dataclasses.replace(made, line=7) == dataclasses.replace(built, line=7)


def test_a_new_span_is_frozen() -> None:
    span = new_span("a.tvp", 1, 2, 1, 5, 1, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        span.line = 3  # type: ignore[misc]
