"""The fixed limits on what oncewire accepts: keys, kinds, counts, payloads, results and waits.

Every entry point (effects, receipts, inbound messages) checks its arguments here, in Python,
before any SQL: the same input is refused the same way on every backend, with a message that
says what is wrong, and nothing is stored. The limits are constants, not properties of the
process (its recursion limit, its int-to-str limit), so what one process accepts another can
read back.
"""

from __future__ import annotations

import math
import re
import unicodedata

from oncewire.core.errors import ConfigurationError

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_MAX_RESULT_BYTES",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_DEADLINE_SECONDS",
    "MAX_DELAY_SECONDS",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_KEY_CHARS",
    "MAX_KIND_CHARS",
    "MAX_PAYLOAD_BYTES_LIMIT",
    "MAX_RETRY_SECONDS",
    "check_count",
    "check_max_payload_bytes",
    "check_max_result_bytes",
    "check_name",
    "check_seconds",
]

# Payloads (checked by oncewire.core.canonical).
MAX_DEPTH = 100  # lists/objects nested inside each other; `[]` is 1 deep
# 640 is the lowest int<->str digit limit a process can set (sys.set_int_max_str_digits), so
# no process setting can stop an accepted integer from being written or read back.
MAX_INT_DIGITS = 640
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20  # 1 MiB of canonical UTF-8
MAX_PAYLOAD_BYTES_LIMIT = 256 << 20  # well below either backend's largest text value (~1 GB)

# Results: what a sink answered, stored with its done effect (Dispatcher(max_result_bytes=...)).
# The work did happen, so a bigger result does not fail the effect: it is done, its result not
# stored, and last_error says so (logged at WARNING).
DEFAULT_MAX_RESULT_BYTES = 1 << 20  # 1 MiB of canonical UTF-8, as for payloads

# Keys and kinds.
MAX_KEY_CHARS = 512
MAX_KIND_CHARS = 128

MAX_ATTEMPTS_LIMIT = 1000

# Waits. Every time oncewire schedules is now plus one of these, so a stored time is a date any
# reader can print (Python's datetime ends with the year 9999) and a wait that ends.
MAX_DELAY_SECONDS = 366 * 86_400  # accept's delay_seconds: the first attempt within a year
MAX_DEADLINE_SECONDS = 366 * 86_400  # accept's deadline_seconds
MAX_RETRY_SECONDS = 86_400  # one retry's wait: NotSent.retry_after, Retry-After, the backoff

# Control characters (C0, DEL, C1) and lone surrogates: the first make a key that prints as
# another (or that PostgreSQL refuses while SQLite stores it), the second cannot be encoded.
_FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _format_character(value: str) -> tuple[int, str] | None:
    """The first Unicode format character (category Cf) in ``value``, with its index.

    Zero-width characters (U+200B..U+200F, U+FEFF) and bidirectional overrides and isolates
    (U+202A..U+202E, U+2066..U+2069) show nothing themselves and change how the text around
    them shows: ``"pay\u202egnp.exe"`` prints as ``payexe.png``, ``"a\u200bb"`` as ``ab``.
    """
    for index, char in enumerate(value):
        if unicodedata.category(char) == "Cf":
            return index, char
    return None


def check_name(what: str, value: object, max_chars: int, *, empty: bool = False) -> str:
    """``value`` as a plain ``str`` if it is a usable key, kind or id; else ConfigurationError.

    It refuses a non-string, the empty string (unless ``empty``), more than ``max_chars``
    characters, control characters, lone surrogates, Unicode format characters (category Cf:
    zero-width and bidirectional-override characters, which make a key print as another), only
    whitespace, or leading or trailing whitespace (``"a "`` and ``"a"`` would be two keys that
    print the same).
    """
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be a string, not {type(value).__name__}")
    if type(value) is not str:
        value = str.__str__(value)  # the characters themselves, whatever the subclass does
    if not value:
        if empty:
            return value
        raise ConfigurationError(f"{what} must not be empty")
    if len(value) > max_chars:
        raise ConfigurationError(
            f"{what} is {len(value)} characters long; the limit is {max_chars}"
        )
    if not value.isprintable():  # the quick test; the pattern says what is wrong
        bad = _FORBIDDEN.search(value)
        if bad is not None:
            char = bad.group()
            kind = "a lone surrogate" if "\ud800" <= char <= "\udfff" else "a control character"
            raise ConfigurationError(
                f"{what} must not contain {kind}: U+{ord(char):04X} at index {bad.start()}"
            )
        found = _format_character(value)
        if found is not None:
            index, char = found
            raise ConfigurationError(
                f"{what} must not contain a format character (Unicode category Cf): "
                f"U+{ord(char):04X} at index {index}"
            )
    stripped = value.strip()
    if stripped != value:
        if not stripped:
            raise ConfigurationError(f"{what} must not be only whitespace")
        raise ConfigurationError(f"{what} must not start or end with whitespace: {value!r}")
    return value


def check_count(name: str, value: object, low: int, high: int) -> int:
    """An ``int`` (not a bool) within ``low..high``; else ConfigurationError."""
    if type(value) is bool or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(f"{name} must be an integer from {low} to {high}, not {value!r}")
    return int(value)


def check_seconds(
    name: str, value: object, *, positive: bool = False, most: float | None = None
) -> float:
    """A finite number of seconds (not a bool), >= 0 or > 0, and at most ``most`` when given;
    else ConfigurationError.

    An int too large for a float (``10**400``) is not finite either: it is refused here instead
    of raising OverflowError wherever the seconds are used.
    """

    def refused() -> ConfigurationError:  # built only when raised: this runs on every accept
        wanted = "positive" if positive else ">= 0"
        return ConfigurationError(f"{name} must be a finite number {wanted}, not {value!r}")

    if type(value) is bool or not isinstance(value, int | float):
        raise refused()
    try:
        seconds = float(value)
    except OverflowError:
        raise refused() from None
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise refused()
    if most is not None and seconds > most:
        raise ConfigurationError(
            f"{name} is {value!r} s; the limit is {most!r} s ({most / 86_400:g} days)"
        )
    return seconds


def check_max_payload_bytes(value: object) -> int:
    """The ``max_payload_bytes`` option: 1 byte up to :data:`MAX_PAYLOAD_BYTES_LIMIT`."""
    return check_count("max_payload_bytes", value, 1, MAX_PAYLOAD_BYTES_LIMIT)


def check_max_result_bytes(value: object) -> int:
    """The ``max_result_bytes`` option: 1 byte up to :data:`MAX_PAYLOAD_BYTES_LIMIT`."""
    return check_count("max_result_bytes", value, 1, MAX_PAYLOAD_BYTES_LIMIT)
