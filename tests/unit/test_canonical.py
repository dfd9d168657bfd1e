"""Canonical JSON: one byte string per value, so that a digest binds a payload to its key."""

from __future__ import annotations

import enum
import hashlib
import json
import random
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncewire.core.canonical import canonical_json, digest, digest_json, loads
from oncewire.core.errors import InvalidPayload, OncewireError
from oncewire.core.limits import MAX_DEPTH, MAX_INT_DIGITS
from tests.support.recursion import recursion_limit, stack_depth

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


# -- fixed limits: what canonical_json writes, loads reads back in any process ------------------


def _deep_dict(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"x": value}
    return value


def test_depth_limit_is_exact() -> None:
    assert _nested(MAX_DEPTH - 1) == loads(canonical_json(_nested(MAX_DEPTH - 1)))  # 100 lists
    assert loads(canonical_json(_deep_dict(MAX_DEPTH))) == _deep_dict(MAX_DEPTH)
    with pytest.raises(InvalidPayload, match=f"more than {MAX_DEPTH} levels"):
        canonical_json(_nested(MAX_DEPTH))  # 101 lists
    with pytest.raises(InvalidPayload, match="nested too deeply"):
        canonical_json(_deep_dict(MAX_DEPTH + 1))


def test_a_payload_deep_enough_to_break_a_reader_is_refused_whatever_therecursion_limit() -> None:
    # Regression: a 990-deep payload was accepted (the check depended on the recursion limit)
    # and then could not be read back by a dispatcher deeper in its stack.
    with recursion_limit(100_000), pytest.raises(InvalidPayload, match="nested too deeply"):
        canonical_json(_nested(990))


def test_a_payload_within_the_limits_is_written_and_read_under_a_loweredrecursion_limit() -> None:
    allowed, refused = _deep_dict(MAX_DEPTH), _deep_dict(MAX_DEPTH + 1)
    expected = json.dumps(allowed, sort_keys=True, separators=(",", ":"))
    with recursion_limit(stack_depth() + 40):  # far less room than MAX_DEPTH levels need
        text = canonical_json(allowed)
        back = loads(text)
        with pytest.raises(InvalidPayload, match="nested too deeply"):
            canonical_json(refused)
    assert text == expected
    assert back == allowed


def test_a_deep_payload_is_refused_without_recursing_into_it() -> None:
    with recursion_limit(1_000_000), pytest.raises(InvalidPayload, match="nested too deeply"):
        canonical_json(_nested(200_000))  # a recursive walk this deep would crash the process


def test_integer_digit_limit_is_exact_and_below_any_process_setting() -> None:
    biggest = 10**MAX_INT_DIGITS - 1  # 640 nines
    assert loads(canonical_json([biggest, -biggest])) == [biggest, -biggest]
    for bad in (10**MAX_INT_DIGITS, -(10**MAX_INT_DIGITS), 10**5000):
        with pytest.raises(InvalidPayload, match=r"^n is an integer of more than 640 digits"):
            canonical_json({"n": bad})
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)  # the lowest a process may set
    try:
        assert loads(canonical_json(biggest)) == biggest
    finally:
        sys.set_int_max_str_digits(old)


def test_loads_refuses_integers_past_the_process_digit_limit_as_invalid_payload() -> None:
    # Regression: a bare ValueError escaped (no code, a traceback in the CLI).
    with pytest.raises(InvalidPayload, match="malformed JSON"):
        loads("9" * 5000)


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("\ud800", "payload has a string"),
        ({"a": ["ok", "x\udfffy"]}, r"a\[1\] has a string"),
        ({"a": {"\ud83d": 1}}, "a has a key"),
    ],
)
def test_lone_surrogates_are_refused_with_their_place(value: Any, where: str) -> None:
    # A lone surrogate cannot be UTF-8 encoded: the digest (and the database) would fail later.
    with pytest.raises(InvalidPayload, match=f"^{where} with a lone surrogate U\\+D"):
        canonical_json(value)


def test_surrogate_pairs_written_as_escapes_are_ordinary_text() -> None:
    assert canonical_json(loads('"\\ud83d\\ude80"')) == '"🚀"'


def test_max_bytes_counts_canonical_utf8_bytes() -> None:
    assert canonical_json("é" * 4, max_bytes=10) == '"éééé"'  # 8 bytes + 2 quotes
    with pytest.raises(InvalidPayload, match="is 12 bytes of canonical JSON; the limit is 10"):
        canonical_json({"a": "é" * 2}, max_bytes=10)  # {"a":"éé"}: 12 bytes, 10 characters


class _Flag(enum.IntEnum):
    ON = 1


class _Ratio(float):
    pass


class _Lying(dict[str, Any]):
    def items(self) -> Any:  # what a naive walk would see
        return iter([("safe", 1)])


def test_subclasses_are_written_as_the_data_that_was_checked() -> None:
    assert canonical_json({"flag": _Flag.ON, "r": _Ratio(0.5)}) == '{"flag":1,"r":0.5}'
    with pytest.raises(InvalidPayload, match="r is nan"):
        canonical_json({"r": _Ratio("nan")})
    lying = _Lying(real=[float("inf")])
    with pytest.raises(InvalidPayload, match=r"real\[0\] is inf"):
        canonical_json(lying)
