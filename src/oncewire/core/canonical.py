"""Canonical JSON and its digest.

Two payloads are "the same" for oncewire exactly when their canonical JSON is byte-for-byte
equal: keys sorted, compact separators, UTF-8, and no NaN or Infinity (they have no JSON form
and would make a digest depend on the parser).

What :func:`canonical_json` writes, :func:`loads` reads back in any process: the limits are
fixed constants (:mod:`oncewire.core.limits`), not the caller's recursion limit or int-to-str
digit limit. A value nested more than ``MAX_DEPTH`` deep, an integer of more than
``MAX_INT_DIGITS`` digits, or a string with a lone surrogate (UTF-8 cannot encode it) is
refused as :class:`InvalidPayload` instead of being stored and failing later in a reader.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from oncewire.core.errors import InvalidPayload
from oncewire.core.limits import MAX_DEPTH, MAX_INT_DIGITS

__all__ = [
    "canonical_json",
    "canonical_json_unchecked",
    "digest",
    "digest_json",
    "digest_unchecked",
    "loads",
]

T = TypeVar("T")

_INT_BOUND: int = 10**MAX_INT_DIGITS  # |n| < this: at most MAX_INT_DIGITS decimal digits
_TOO_DEEP = f"payload is nested too deeply: more than {MAX_DEPTH} levels (or it contains itself)"


def _clean(value: Any, depth: int) -> bool:
    """True when ``value`` is plain JSON within the limits: exact builtin types, string keys,
    finite floats, small enough integers, at most ``MAX_DEPTH`` deep. The quick check that
    builds no paths and no copy (on the hot path of every accept and command); a False sends
    the value to the careful walk, which decides and names the place. Strings are checked for
    lone surrogates when the encoded text is (one pass over the output, not every string)."""
    kind = type(value)
    if kind is str:
        return True
    if kind is int:
        number: int = value
        return -_INT_BOUND < number < _INT_BOUND
    if kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        if depth >= MAX_DEPTH:
            return False
        depth += 1
        for key, item in value.items():  # a loop costs half what all() does
            if type(key) is not str or not _clean(item, depth):
                return False
        return True
    if kind is list or kind is tuple:
        if depth >= MAX_DEPTH:
            return False
        depth += 1
        for item in value:  # noqa: SIM110 - a loop costs half what all() does
            if not _clean(item, depth):
                return False
        return True
    return False  # a subclass or another type: the careful walk decides


def _where(path: str) -> str:
    return path or "payload"


def _check_text(text: str, path: str, what: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            char = text[exc.start]
            raise InvalidPayload(
                f"{_where(path)} has a {what} with a lone surrogate U+{ord(char):04X} at index "
                f"{exc.start}, which UTF-8 cannot encode"
            ) from None


def _plain(value: Any) -> Any:
    """A copy of ``value`` made of exact builtin types, checked against every limit.

    Iterative (an explicit stack), so neither the depth limit nor the caller's recursion limit
    decides how deep it can look. Subclasses (an IntEnum, a dict with its own ``items``) are
    read through the builtin methods, so the text written is the data that was checked.
    """
    root: list[Any] = [None]
    # (value, containers around it, path, the copy it goes into, its slot there)
    stack: list[tuple[Any, int, str, Any, Any]] = [(value, 0, "", root, 0)]
    while stack:
        item, depth, path, target, slot = stack.pop()
        if item is None or type(item) is bool:
            target[slot] = item
        elif isinstance(item, str):
            text = str.__str__(item)
            _check_text(text, path, "string")
            target[slot] = text
        elif isinstance(item, int):
            number = int.__int__(item)
            if not -_INT_BOUND < number < _INT_BOUND:
                raise InvalidPayload(
                    f"{_where(path)} is an integer of more than {MAX_INT_DIGITS} digits"
                )
            target[slot] = number
        elif isinstance(item, float):
            real = float.__float__(item)
            if not math.isfinite(real):
                raise InvalidPayload(f"{_where(path)} is {real!r}, which has no JSON form")
            target[slot] = real
        elif isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                raise InvalidPayload(_TOO_DEEP)
            children: list[tuple[Any, int, str, Any, Any]] = []
            if isinstance(item, dict):
                mapping: dict[str, Any] = {}
                for key, child in dict.items(item):
                    if not isinstance(key, str):
                        raise InvalidPayload(f"{_where(path)} has a non-string key {key!r}")
                    key = str.__str__(key)
                    _check_text(key, path, "key")
                    mapping[key] = None
                    children.append(
                        (child, depth + 1, f"{path}.{key}" if path else key, mapping, key)
                    )
                target[slot] = mapping
            else:
                items = list(
                    list.__iter__(item) if isinstance(item, list) else tuple.__iter__(item)
                )
                sequence: list[Any] = [None] * len(items)
                for index, child in enumerate(items):
                    children.append((child, depth + 1, f"{_where(path)}[{index}]", sequence, index))
                target[slot] = sequence
            stack.extend(reversed(children))  # first child first: errors in document order
        else:
            raise InvalidPayload(
                f"payload is not JSON-serialisable: {_where(path)} is a {type(item).__name__}"
            )
    return root[0]


def _with_headroom(fn: Callable[[Any], T], arg: Any) -> T:
    """``fn(arg)`` for a value within ``MAX_DEPTH``, whatever the caller's recursion limit.

    The json module's C code counts each nesting level against the recursion limit, so a
    lowered limit (or a caller already deep in its stack) could refuse a payload the limits
    allow. Only then is the limit lifted, just enough, for this one call.
    """
    try:
        return fn(arg)
    except RecursionError:
        pass
    depth, frame = 0, sys._getframe()
    while frame.f_back is not None:
        depth, frame = depth + 1, frame.f_back
    old = sys.getrecursionlimit()
    lifted = max(old, depth + 2 * MAX_DEPTH + 100)
    sys.setrecursionlimit(lifted)
    try:
        return fn(arg)
    finally:
        if sys.getrecursionlimit() == lifted:  # unless another thread changed it meanwhile
            sys.setrecursionlimit(old)


# The one definition of the canonical form: keys sorted, compact, UTF-8 (not escaped), no NaN.
_encoder = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode

# Canonical JSON of a value already known to be plain JSON within the limits: one that passed
# canonical_json when it was accepted, or was parsed back by loads from text canonical_json
# wrote. The C encoder alone, without the walk: the run ledger's hot path (every command
# writes its run's state). On such values it writes exactly what canonical_json writes
# (tests/unit/test_canonical_unchecked.py holds it to that, byte for byte); on any other value
# it is no check (a NaN raises ValueError, a lone surrogate is written as it is).
canonical_json_unchecked: Callable[[Any], str] = _encoder


def canonical_json(value: Any, *, max_bytes: int | None = None) -> str:
    """Encode ``value`` as canonical JSON text (at most ``max_bytes`` bytes of UTF-8)."""
    try:
        clean = _clean(value, 0)
    except RecursionError:  # the caller's recursion limit is low: the careful walk decides
        clean = False
    if not clean:
        value = _plain(value)  # names the bad value's place, or copies a subclass
    try:
        text = _with_headroom(_encoder, value)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload is not JSON-serialisable: {exc}") from exc
    except RecursionError:
        raise InvalidPayload(_TOO_DEEP) from None
    if text.isascii():  # O(1) for str: the common case costs no encoding
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            _plain(value)  # raises, naming the string with the lone surrogate
            raise InvalidPayload(
                "payload has a lone surrogate, which UTF-8 cannot encode"
            ) from None
    if max_bytes is not None and size > max_bytes:
        raise InvalidPayload(
            f"payload is {size} bytes of canonical JSON; the limit is {max_bytes} "
            "(max_payload_bytes)",
            size_bytes=size,
            max_bytes=max_bytes,
        )
    return text


def digest(value: Any) -> str:
    """The sha256 hex digest of ``value``'s canonical JSON, UTF-8 encoded."""
    return digest_json(canonical_json(value))


def digest_json(canonical_text: str) -> str:
    """The sha256 hex digest of text that is already canonical JSON."""
    return hashlib.sha256(canonical_text.encode("utf-8")).hexdigest()


def digest_unchecked(value: Any) -> str:
    """:func:`digest` of a value already known to be plain JSON (see
    :data:`canonical_json_unchecked`)."""
    return hashlib.sha256(_encoder(value).encode("utf-8")).hexdigest()


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
    them) are refused. Whatever :func:`canonical_json` wrote parses, whatever the process's
    recursion limit."""
    try:
        if isinstance(text, bytes | bytearray):
            text = text.decode("utf-8")
        return _with_headroom(_decoder().decode, text)
    except InvalidPayload:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        # JSONDecodeError, or an integer past the process's int-to-str digit limit.
        raise InvalidPayload(f"malformed JSON: {exc}") from exc
    except RecursionError:
        raise InvalidPayload("malformed JSON: nested too deeply") from None
