"""Canonical JSON: one byte string per value, so that a digest binds a payload to its key."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncewire.core.canonical import canonical_json, digest, digest_json, loads
from oncewire.core.errors import InvalidPayload, OncewireError

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def _shuffled(value: Any, rng: random.Random) -> Any:
    """The same value with every dict's insertion order shuffled."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def test_keys_are_sorted_at_every_level() -> None:
    value = {"b": 1, "a": {"d": [{"z": 0, "y": 1}], "c": 3}}
    assert canonical_json(value) == '{"a":{"c":3,"d":[{"y":1,"z":0}]},"b":1}'


def test_separators_are_compact() -> None:
    assert canonical_json([1, {"a": [2, 3], "b": None}, "x y"]) == '[1,{"a":[2,3],"b":null},"x y"]'


def test_non_ascii_text_is_written_as_utf8_not_escaped() -> None:
    text = canonical_json({"msg": "héllo ✓ 日本 🚀"})
    assert text == '{"msg":"héllo ✓ 日本 🚀"}'
    assert "\\u" not in text


def test_tuples_encode_as_lists() -> None:
    assert canonical_json({"t": (1, 2)}) == canonical_json({"t": [1, 2]})


def test_digest_is_sha256_of_the_utf8_canonical_text() -> None:
    value = {"cents": 1999, "who": "zoë"}
    expected = hashlib.sha256('{"cents":1999,"who":"zoë"}'.encode()).hexdigest()
    assert digest(value) == expected
    assert digest_json(canonical_json(value)) == expected


def test_digest_ignores_key_order_but_not_values() -> None:
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})
    assert digest({"a": 1, "b": 2}) != digest({"a": 1, "b": 3})
    assert digest([1, 2]) != digest([2, 1])  # list order is meaning


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused(bad: float) -> None:
    with pytest.raises(InvalidPayload, match="no JSON form"):
        canonical_json(bad)


def test_nested_nan_names_its_location() -> None:
    with pytest.raises(InvalidPayload) as caught:
        canonical_json({"order": {"lines": [1.0, {"price": float("nan")}]}})
    assert "order.lines[1].price" in str(caught.value)


def test_top_level_nan_is_called_payload() -> None:
    with pytest.raises(InvalidPayload, match=r"^payload is nan"):
        canonical_json(float("nan"))


def test_non_string_keys_are_refused_with_location() -> None:
    # json.dumps would silently turn 1 into "1", making two payloads share one digest.
    with pytest.raises(InvalidPayload, match=r"a has a non-string key 1"):
        canonical_json({"a": {1: "x"}})


@pytest.mark.parametrize("bad", [object(), {1, 2}, b"bytes", {"when": 1j}])
def test_values_without_a_json_form_are_refused(bad: Any) -> None:
    with pytest.raises(InvalidPayload, match="not JSON-serialisable"):
        canonical_json(bad)


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_a_payload_nested_too_deeply_is_invalid_not_a_crash() -> None:
    # Regression: this used to escape as a bare RecursionError.
    with pytest.raises(InvalidPayload, match="nested too deeply"):
        canonical_json(_nested(100_000))


def test_a_payload_that_contains_itself_is_invalid() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(InvalidPayload, match="contains itself"):
        canonical_json(loop)


def test_invalid_payload_is_a_value_error_in_the_tree() -> None:
    with pytest.raises(ValueError) as caught:
        canonical_json(float("inf"))
    assert isinstance(caught.value, OncewireError)
    assert caught.value.code == "invalid_payload"


@pytest.mark.parametrize(
    "text",
    ["NaN", "Infinity", "-Infinity", '{"a": [1, NaN]}', '{"x": {"y": -Infinity}}'],
)
def test_strict_loads_refuses_nan_and_infinity(text: str) -> None:
    json.loads(text)  # the standard parser accepts these ...
    with pytest.raises(InvalidPayload, match="not valid JSON"):
        loads(text)  # ... oncewire's does not


@pytest.mark.parametrize("text", ["1e999", '{"a": [-1e400]}'])
def test_strict_loads_refuses_numbers_that_overflow_to_infinity(text: str) -> None:
    with pytest.raises(InvalidPayload, match="out of range"):
        loads(text)


@pytest.mark.parametrize("text", ["{bad", "", '{"a": 1,}', "[1, 2", "'single'"])
def test_strict_loads_refuses_malformed_text(text: str) -> None:
    with pytest.raises(InvalidPayload, match="malformed JSON"):
        loads(text)


def test_strict_loads_refuses_text_nested_too_deeply() -> None:
    # Regression: this used to escape as a bare RecursionError (a traceback in the CLI).
    with pytest.raises(InvalidPayload, match="nested too deeply"):
        loads("[" * 100_000 + "]" * 100_000)


def test_strict_loads_refuses_bytes_that_are_not_utf8() -> None:
    with pytest.raises(InvalidPayload, match="malformed JSON"):
        loads(b'{"a": "\xff\xfe"}')


def test_strict_loads_accepts_bytes_and_ordinary_numbers() -> None:
    assert loads(b'{"a": [1, 2.5, -0.0, 1e300]}') == {"a": [1, 2.5, -0.0, 1e300]}
    assert loads(str(10**40)) == 10**40  # big integers are exact, not floats


@settings(deadline=None)  # a loaded CI machine must not turn slowness into failure
@given(json_values)
def test_canonical_form_round_trips_and_is_a_fixed_point(value: Any) -> None:
    text = canonical_json(value)
    assert loads(text) == value
    assert canonical_json(loads(text)) == text


@settings(deadline=None)
@given(json_values, st.integers(min_value=0, max_value=2**32))
def test_insertion_order_never_changes_the_digest(value: Any, seed: int) -> None:
    assert digest(_shuffled(value, random.Random(seed))) == digest(value)
