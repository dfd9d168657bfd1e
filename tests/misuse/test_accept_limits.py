"""What ``accept`` lets in: payloads a reader can load back, keys and kinds both backends store
alike, and options that mean what they say. Every refusal happens before any SQL: the same
error on SQLite and PostgreSQL, and nothing stored."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

import oncewire
from oncewire import ConfigurationError, Ledger, PayloadConflict
from oncewire.core import ids
from oncewire.core.limits import MAX_DEPTH
from oncewire.errors import InvalidPayload, KindConflict
from tests.contract.conftest import RawDatabase
from tests.support.recursion import recursion_limit, stack_depth


def _nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


# -- payloads -----------------------------------------------------------------------------------

POISON = [
    pytest.param(_nested(990), "nested too deeply", id="990-levels"),
    pytest.param({"n": 10**700}, "n is an integer of more than 640 digits", id="700-digit-int"),
    pytest.param({"text": "ab\ud800"}, "text has a string with a lone surrogate", id="surrogate"),
    pytest.param({"\udfff": 1}, "payload has a key with a lone surrogate", id="surrogate-key"),
]


@pytest.mark.parametrize(("payload", "message"), POISON)
def test_a_payload_a_reader_cannot_load_is_refused_and_nothing_is_stored(
    ledger: Ledger, raw: RawDatabase, payload: Any, message: str
) -> None:
    # Regression: a 990-level payload was accepted and then broke the dispatcher's batch.
    with pytest.raises(InvalidPayload, match=message):
        ledger.accept("poison", "send", payload)
    assert raw.count("oncewire_effects") == 0


def test_the_refusal_does_not_depend_on_therecursion_limit(
    ledger: Ledger, raw: RawDatabase
) -> None:
    deepest_allowed, too_deep = _nested(MAX_DEPTH), _nested(MAX_DEPTH + 1)
    with recursion_limit(100_000), pytest.raises(InvalidPayload, match="nested too deeply"):
        ledger.accept("deep", "send", too_deep)
    with recursion_limit(stack_depth() + 60):  # a caller that lowered it, or is deep already
        ledger.accept("deepest", "send", deepest_allowed)
        with pytest.raises(InvalidPayload, match="nested too deeply"):
            ledger.accept("deep", "send", too_deep)
        read_back = ledger.effects.get("deepest").payload
    assert read_back == deepest_allowed
    assert [row[0] for row in raw.query("SELECT key FROM oncewire_effects")] == ["deepest"]


def test_a_payload_over_max_payload_bytes_is_refused_and_nothing_is_stored(
    store_url: str, raw: RawDatabase
) -> None:
    with Ledger(store_url, max_payload_bytes=64) as small:
        fits = {"t": "é" * 28}  # {"t":""} is 8 bytes, each é 2: 64 bytes exactly
        small.accept("fits", "send", fits)
        with pytest.raises(InvalidPayload, match="65 bytes of canonical JSON; the limit is 64"):
            small.accept("over", "send", {"t": "é" * 28 + "x"})
    assert [row[0] for row in raw.query("SELECT key FROM oncewire_effects")] == ["fits"]


def test_the_default_payload_limit_is_one_mebibyte(ledger: Ledger, raw: RawDatabase) -> None:
    assert ledger.max_payload_bytes == 1 << 20
    with pytest.raises(InvalidPayload, match="the limit is 1048576"):
        ledger.accept("big", "send", "x" * (1 << 20))
    assert raw.count("oncewire_effects") == 0


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1024", None, (256 << 20) + 1])
def test_max_payload_bytes_must_be_a_sensible_integer(store_url: str, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_payload_bytes must be an integer"):
        Ledger(store_url, max_payload_bytes=bad)


def test_a_refused_payload_inside_a_transaction_leaves_the_transaction_usable(
    ledger: Ledger, raw: RawDatabase
) -> None:
    with ledger.transaction() as tx:
        with pytest.raises(InvalidPayload):
            tx.accept("poison", "send", _nested(500))
        tx.accept("fine", "send", {"ok": True})
    assert [row[0] for row in raw.query("SELECT key FROM oncewire_effects")] == ["fine"]


# -- keys and kinds -----------------------------------------------------------------------------

FORMAT = "must not contain a format character (Unicode category Cf)"
# Characters that show as nothing and change how the text around them shows: a key that prints
# as another. Regression: each was accepted in keys, kinds, receipt keys and run ids.
FORMAT_CHARACTERS = [
    pytest.param("a\u200bb", f"{FORMAT}: U+200B at index 1", id="zero-width-space"),
    pytest.param("a\u200cb", f"{FORMAT}: U+200C at index 1", id="zero-width-non-joiner"),
    pytest.param("\U0001f469\u200d\U0001f4bb", f"{FORMAT}: U+200D at index 1", id="zwj"),
    pytest.param("ab\u200e", f"{FORMAT}: U+200E at index 2", id="left-to-right-mark"),
    pytest.param("\u200fab", f"{FORMAT}: U+200F at index 0", id="right-to-left-mark"),
    pytest.param("inv\u202agnp", f"{FORMAT}: U+202A at index 3", id="lre"),
    pytest.param("pay\u202egnp.exe", f"{FORMAT}: U+202E at index 3", id="rtl-override"),
    pytest.param("k\u2066x\u2069", f"{FORMAT}: U+2066 at index 1", id="lri"),
    pytest.param("kx\u2069", f"{FORMAT}: U+2069 at index 2", id="pdi"),
    pytest.param("\ufeffk", f"{FORMAT}: U+FEFF at index 0", id="bom"),
    pytest.param("soft\u00adhyphen", f"{FORMAT}: U+00AD at index 4", id="soft-hyphen"),
    pytest.param("word\u2060joiner", f"{FORMAT}: U+2060 at index 4", id="word-joiner"),
    pytest.param("tag\U000e0041", f"{FORMAT}: U+E0041 at index 3", id="tag-character"),
]

BAD_NAMES = [
    pytest.param("a\x00b", "must not contain a control character: U+0000 at index 1", id="nul"),
    pytest.param("\x00", "must not contain a control character: U+0000 at index 0", id="nul-only"),
    pytest.param("a\nb", "must not contain a control character: U+000A at index 1", id="newline"),
    pytest.param("tab\t", "must not contain a control character: U+0009 at index 3", id="tab"),
    pytest.param("del\x7f", "must not contain a control character: U+007F at index 3", id="del"),
    pytest.param("c1\x85", "must not contain a control character: U+0085 at index 2", id="c1"),
    pytest.param("x\ud800", "must not contain a lone surrogate: U+D800 at index 1", id="surrogate"),
    pytest.param("   ", "must not be only whitespace", id="spaces"),
    pytest.param("\u3000", "must not be only whitespace", id="ideographic-space"),
    *FORMAT_CHARACTERS,
    pytest.param(" k", "must not start or end with whitespace: ' k'", id="leading"),
    pytest.param("k ", "must not start or end with whitespace: 'k '", id="trailing"),
    pytest.param("", "must not be empty", id="empty"),
    pytest.param(7, "must be a string, not int", id="int"),
    pytest.param(None, "must be a string, not NoneType", id="none"),
]


@pytest.mark.parametrize(("key", "problem"), BAD_NAMES)
def test_a_bad_key_is_refused_alike_on_both_backends(
    ledger: Ledger, raw: RawDatabase, key: Any, problem: str
) -> None:
    # Regression: SQLite stored a NUL key and PostgreSQL failed with a driver error.
    with pytest.raises(ConfigurationError) as caught:
        ledger.accept(key, "send", {"a": 1})
    assert str(caught.value) == f"an effect key {problem}"
    assert raw.count("oncewire_effects") == 0


@pytest.mark.parametrize(("kind", "problem"), BAD_NAMES)
def test_a_bad_kind_is_refused_alike_on_both_backends(
    ledger: Ledger, raw: RawDatabase, kind: Any, problem: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ledger.accept("k", kind, {"a": 1})
    assert str(caught.value) == f"an effect kind {problem}"
    assert raw.count("oncewire_effects") == 0


def test_length_limits_are_exact(ledger: Ledger, raw: RawDatabase) -> None:
    ledger.accept("k" * 512, "s" * 128, {})
    with pytest.raises(ConfigurationError, match="is 513 characters long; the limit is 512"):
        ledger.accept("k" * 513, "send", {})
    with pytest.raises(ConfigurationError, match="is 129 characters long; the limit is 128"):
        ledger.accept("k", "s" * 129, {})
    assert raw.count("oncewire_effects") == 1


def test_printable_unicode_keys_are_kept_exactly(ledger: Ledger, raw: RawDatabase) -> None:
    keys = ["zoë/🚀", "a b", "order\u00a0x", "שלום-1", "مرحبا"]  # inner spaces, any script
    for key in keys:
        ledger.accept(key, "send", {})
    stored = sorted(row[0] for row in raw.query("SELECT key FROM oncewire_effects"))
    assert stored == sorted(keys)


# -- the same key, another kind -----------------------------------------------------------------


def test_another_kind_under_a_used_key_says_so(ledger: Ledger, raw: RawDatabase) -> None:
    ledger.accept("k", "send", {"a": 1})
    before = raw.effect_row("k")
    with pytest.raises(KindConflict) as caught:
        ledger.accept("k", "charge", {"a": 1})
    assert str(caught.value) == "key 'k' is bound to kind 'send', not 'charge'; nothing was changed"
    assert isinstance(caught.value, PayloadConflict)  # an except PayloadConflict still holds
    assert caught.value.code == "kind_conflict"
    assert caught.value.as_dict()["stored_kind"] == "send"
    assert raw.effect_row("k") == before
    assert raw.count("oncewire_effects") == 1


def test_another_payload_under_a_used_key_is_still_a_payload_conflict(
    ledger: Ledger, raw: RawDatabase
) -> None:
    ledger.accept("k", "send", {"a": 1})
    with pytest.raises(PayloadConflict) as caught:
        ledger.accept("k", "send", {"a": 2})
    assert not isinstance(caught.value, KindConflict)
    assert caught.value.code == "payload_conflict"
    assert raw.effect_row("k")["payload"] == '{"a":1}'


# -- options ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 1001, True, False, 2.0, "3", None])
def test_max_attempts_is_an_integer_from_1_to_1000(
    ledger: Ledger, raw: RawDatabase, bad: Any
) -> None:
    # Regression: True was accepted as one attempt (a bool is an int to Python).
    with pytest.raises(ConfigurationError, match="max_attempts must be an integer from 1 to 1000"):
        ledger.accept("k", "send", {}, max_attempts=bad)
    assert raw.count("oncewire_effects") == 0


def test_max_attempts_bounds_are_accepted(ledger: Ledger, raw: RawDatabase) -> None:
    ledger.accept("one", "send", {}, max_attempts=1)
    ledger.accept("most", "send", {}, max_attempts=1000)
    assert raw.effect_row("one")["max_attempts"] == 1
    assert raw.effect_row("most")["max_attempts"] == 1000


@pytest.mark.parametrize("bad", [True, False, math.nan, math.inf, -math.inf, "5", None])
def test_delay_seconds_is_a_finite_number(ledger: Ledger, raw: RawDatabase, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="delay_seconds must be a finite number"):
        ledger.accept("k", "send", {}, delay_seconds=bad)
    assert raw.count("oncewire_effects") == 0


@pytest.mark.parametrize("bad", [0, 0.0, -1, True, False, math.nan, math.inf, "60"])
def test_deadline_seconds_is_positive_and_finite(
    ledger: Ledger, raw: RawDatabase, bad: Any
) -> None:
    with pytest.raises(ConfigurationError, match="deadline_seconds must be a finite number"):
        ledger.accept("k", "send", {}, deadline_seconds=bad)
    assert raw.count("oncewire_effects") == 0


def test_this_process_owner_is_public_in_core_ids_and_names_this_process() -> None:
    assert "this_process_owner" in ids.__all__
    assert ids.this_process_owner().split(":")[1] == str(os.getpid())
    with pytest.raises(AttributeError, match=r"oncewire\.core\.ids\.this_process_owner"):
        oncewire.this_process_owner  # noqa: B018  # left the top level; says where it lives


# -- inbound ids follow the same rules ----------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("chat", "c\x00", "chat must not contain a control character: U+0000 at index 1"),
        ("platform_message_id", " ", "platform_message_id must not be only whitespace"),
        ("bot", "bot\n", "bot must not contain a control character: U+000A at index 3"),
        ("thread", "t\ud800", "thread must not contain a lone surrogate: U+D800 at index 1"),
        ("chat", "c\u202e", f"chat {FORMAT}: U+202E at index 1"),
        ("platform_message_id", "\u200b1", f"platform_message_id {FORMAT}: U+200B at index 0"),
    ],
)
def test_a_bad_inbound_id_is_refused_alike_on_both_backends(
    ledger: Ledger, raw: RawDatabase, field: str, value: str, problem: str
) -> None:
    ids = {"platform": "tg", "bot": "b", "chat": "c", "platform_message_id": "1", "thread": ""}
    ids[field] = value
    with pytest.raises(ConfigurationError) as caught:
        ledger.inbound.admit(
            ids["platform"],
            ids["bot"],
            ids["chat"],
            ids["platform_message_id"],
            {"text": "hi"},
            thread=ids["thread"],
        )
    assert str(caught.value) == problem
    assert raw.count("oncewire_inbound") == 0
    assert ledger.inbound.admit("tg", "b", "c", "1", {"text": "hi"}).new  # an empty thread is fine


def test_the_deepest_accepted_payload_reaches_its_sink_under_a_loweredrecursion_limit(
    ledger: Ledger, raw: RawDatabase
) -> None:
    # What accept lets in, a dispatcher can load: even in a process whose recursion limit
    # leaves less room than the payload's nesting needs.
    deepest = _nested(MAX_DEPTH)
    ledger.accept("deepest", "send", deepest)
    ledger.accept("plain", "send", {"n": 1})
    seen: dict[str, Any] = {}

    def sink(attempt: oncewire.Attempt) -> None:
        seen[attempt.key] = attempt.payload

    dispatcher = oncewire.Dispatcher(ledger, {"send": sink})
    with recursion_limit(stack_depth() + 90):
        dispatcher.run(until_idle=True, handle_signals=False)
    assert seen == {"deepest": deepest, "plain": {"n": 1}}
    states = raw.query("SELECT key, state FROM oncewire_effects ORDER BY key")
    assert states == [("deepest", "done"), ("plain", "done")]


@pytest.mark.parametrize("option", ["delay_seconds", "deadline_seconds"])
def test_seconds_too_large_for_a_float_are_refused_not_an_overflow(
    ledger: Ledger, raw: RawDatabase, option: str
) -> None:
    """Regression: ``math.isfinite(10**400)`` raised OverflowError out of the check."""
    with pytest.raises(ConfigurationError):
        ledger.accept("k", "send", {}, **{option: 10**400})
    assert raw.count("oncewire_effects") == 0
