"""The unchecked canonical JSON is canonical JSON: byte for byte what canonical_json writes.

The run ledger encodes its states and events with ``canonical_json_unchecked`` (the encoder
without the walk), on values that passed ``canonical_json`` or were parsed back by ``loads``.
A digest stored by one and recomputed by the other (an event's request digest, checked again
by verification) must not differ: this pins the two to one byte string per value.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from oncewire.core.canonical import (
    canonical_json,
    canonical_json_unchecked,
    digest,
    digest_unchecked,
    loads,
)
from oncewire.core.limits import MAX_INT_DIGITS

_BOUND = 10**MAX_INT_DIGITS - 1

keys = st.text(max_size=12)  # any code point a key may hold, non-ASCII included (no surrogates)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-_BOUND, max_value=_BOUND)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(keys, children, max_size=5)
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_unchecked_writes_the_bytes_canonical_json_writes(value: Any) -> None:
    text = canonical_json(value)
    assert canonical_json_unchecked(value).encode("utf-8") == text.encode("utf-8")
    assert digest_unchecked(value) == digest(value)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_a_value_parsed_back_is_written_again_to_the_same_bytes(value: Any) -> None:
    # What the run ledger encodes most: a state or request read back from its stored text.
    text = canonical_json(value)
    parsed = loads(text)
    assert canonical_json_unchecked(parsed).encode("utf-8") == text.encode("utf-8")
    assert digest_unchecked(parsed) == digest(value)
