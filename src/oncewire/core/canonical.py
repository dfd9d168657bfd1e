"""Canonical JSON and its digest.

Two payloads are "the same" for oncewire exactly when their canonical JSON is byte-for-byte
equal: keys sorted, compact separators, UTF-8, and no NaN or Infinity (they have no JSON form
and would make a digest depend on the parser).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from typing import Any

from oncewire.core.errors import InvalidPayload

__all__ = ["canonical_json", "digest", "digest_json", "loads"]


def _clean(value: Any) -> bool:
    """True when ``value`` has no NaN/Infinity and only string keys: the quick check that
    builds no paths (on the hot path of every accept and command)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        for key, item in value.items():  # noqa: SIM110 - a loop costs half what all() does
            if type(key) is not str or not _clean(item):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:  # noqa: SIM110 - a loop costs half what all() does
            if not _clean(item):
                return False
        return True
    # A subclass of float, dict, list or tuple: the careful walk decides.
    return not isinstance(value, float | dict | list | tuple)


def _check_floats(value: Any, path: str) -> None:
    # json.dumps(allow_nan=False) refuses NaN too, but names no location; walking the value
    # first lets the error say where the bad number is.
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise InvalidPayload(f"{path or 'payload'} is {value!r}, which has no JSON form")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidPayload(f"{path or 'payload'} has a non-string key {key!r}")
            _check_floats(item, f"{path}.{key}" if path else key)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_floats(item, f"{path}[{index}]")


def canonical_json(value: Any) -> str:
    """Encode ``value`` as canonical JSON text."""
    too_deep = "payload is nested too deeply (or contains itself)"
    try:
        if not _clean(value):
            _check_floats(value, "")  # names the bad value's place, or accepts a subclass
    except RecursionError:
        raise InvalidPayload(too_deep) from None
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload is not JSON-serialisable: {exc}") from exc
    except RecursionError:
        raise InvalidPayload(too_deep) from None


def digest(value: Any) -> str:
    """The sha256 hex digest of ``value``'s canonical JSON, UTF-8 encoded."""
    return digest_json(canonical_json(value))


def digest_json(canonical_text: str) -> str:
    """The sha256 hex digest of text that is already canonical JSON."""
    return hashlib.sha256(canonical_text.encode("utf-8")).hexdigest()


def _refuse_constant(name: str) -> Any:
    raise InvalidPayload(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # e.g. 1e999: valid JSON syntax, but it would parse to Infinity
        raise InvalidPayload(f"{text} is out of range for a JSON number")
    return value


@functools.cache
def _decoder() -> json.JSONDecoder:
    # One decoder for the process: json.loads with hooks builds a new one on every call.
    return json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def loads(text: str | bytes) -> Any:
    """Parse JSON text strictly: NaN, Infinity and -Infinity (or numbers that overflow to
    them) are refused."""
    try:
        if isinstance(text, bytes | bytearray):
            text = text.decode("utf-8")
        return _decoder().decode(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidPayload(f"malformed JSON: {exc}") from exc
    except RecursionError:
        raise InvalidPayload("malformed JSON: nested too deeply") from None
