"""The error tree: one root, typed subclasses, codes that scripts can rely on."""

from __future__ import annotations

import re

import pytest

import oncewire
from oncewire.core import errors
from oncewire.core.errors import (
    ConfigurationError,
    CrashPointUnknown,
    EffectNotFound,
    InboundNotFound,
    OncewireError,
    PayloadConflict,
    ReceiptNotFound,
    ReplyNotFound,
    RunError,
    RunNotFound,
    SchemaError,
    StorageError,
    StoreBusy,
)

# The codes are a public interface (the CLI prints them, scripts match on them): changing or
# removing one is a breaking change, so this table only grows, and only on purpose.
STABLE_CODES = {
    "OncewireError": "oncewire_error",
    "InvalidPayload": "invalid_payload",
    "PayloadConflict": "payload_conflict",
    "KindConflict": "kind_conflict",
    "EffectNotFound": "effect_not_found",
    "ReceiptNotFound": "receipt_not_found",
    "InvalidState": "invalid_state",
    "StaleFence": "stale_fence",
    "StorageError": "storage_error",
    "StoreBusy": "store_busy",
    "SchemaError": "schema_error",
    "ConfigurationError": "configuration_error",
    "CrashPointUnknown": "crash_point_unknown",
    "WrongType": "wrong_type",
    "InboundNotFound": "inbound_not_found",
    "ReplyNotFound": "reply_not_found",
    "RunNotFound": "run_not_found",
    "RevertBarrierHeld": "revert_barrier_held",
}
# Removed or renamed before 0.1.0, while that was free; never to be reused for something else.
RETIRED_CODES = {"unknown_sink", "revert_barrier"}


def _all_error_classes() -> list[type[OncewireError]]:
    found: list[type[OncewireError]] = []
    pending: list[type[OncewireError]] = [OncewireError]
    while pending:
        cls = pending.pop()
        if cls not in found:  # RunNotFound is reached twice: from RunError and from _NotFound
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return found


def test_every_exported_error_is_in_the_tree() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, OncewireError), name
    for name in oncewire.__all__:
        value = getattr(oncewire, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, OncewireError), name


def test_published_codes_never_change() -> None:
    actual = {cls.__name__: cls.code for cls in _all_error_classes()}
    assert {name: actual.get(name) for name in STABLE_CODES} == STABLE_CODES
    assert not RETIRED_CODES & set(actual.values())


def test_all_lists_every_public_error_once() -> None:
    # The core's errors; an optional extra (the gateway) keeps its own subclasses beside its code,
    # which is why only the classes defined in core.errors are compared with its __all__.
    public = {
        cls.__name__
        for cls in _all_error_classes()
        if not cls.__name__.startswith("_") and cls.__module__ == errors.__name__
    }
    assert sorted(errors.__all__) == sorted(public)
    assert len(errors.__all__) == len(set(errors.__all__))


def test_codes_are_unique_snake_case_and_declared_by_each_class() -> None:
    classes = _all_error_classes()
    codes = [cls.code for cls in classes]
    assert len(codes) == len(set(codes))
    for cls in classes:
        assert "code" in vars(cls), f"{cls.__name__} inherits its code"
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", cls.code), cls.code


def test_default_message_is_the_docstring_first_line() -> None:
    assert str(StorageError()) == "The store failed."
    assert str(StoreBusy()).startswith("The store stayed locked")
    assert str(StorageError("disk on fire")) == "disk on fire"


def test_as_dict_carries_code_message_and_fields() -> None:
    exc = EffectNotFound("no effect with key 'k'", key="k")
    assert exc.as_dict() == {
        "code": "effect_not_found",
        "message": "no effect with key 'k'",
        "key": "k",
    }


def test_payload_conflict_carries_both_digests() -> None:
    stored, offered = "a" * 64, "b" * 64
    exc = PayloadConflict("order-42/charge", stored, offered)
    assert (exc.key, exc.stored_digest, exc.offered_digest) == ("order-42/charge", stored, offered)
    assert exc.fields == {
        "key": "order-42/charge",
        "stored_digest": stored,
        "offered_digest": offered,
    }
    message = str(exc)
    assert "'order-42/charge'" in message
    assert stored[:12] in message and offered[:12] in message
    assert "nothing was changed" in message
    assert exc.as_dict()["code"] == "payload_conflict"


NOT_FOUND = [EffectNotFound, ReceiptNotFound, InboundNotFound, ReplyNotFound, RunNotFound]


@pytest.mark.parametrize("cls", NOT_FOUND)
def test_not_found_errors_are_key_errors_with_plain_messages(cls: type[OncewireError]) -> None:
    exc = cls("no such key 'x'")
    assert isinstance(exc, KeyError)
    assert str(exc) == "no such key 'x'"  # not KeyError's repr, which would add quotes
    assert str(cls()) == (cls.__doc__ or "").strip().splitlines()[0]
    with pytest.raises(KeyError):
        raise exc


def test_not_found_errors_share_one_base_and_run_not_found_is_a_run_error() -> None:
    bases = {next(b for b in cls.__mro__ if b.__name__ == "_NotFound") for cls in NOT_FOUND}
    assert len(bases) == 1
    assert issubclass(RunNotFound, RunError)
    assert RunNotFound("no run 'r'").as_dict() == {
        "code": "run_not_found",
        "message": "no run 'r'",
    }


def test_hierarchy_groups_related_failures() -> None:
    assert issubclass(StoreBusy, StorageError)
    assert issubclass(SchemaError, StorageError)
    assert issubclass(CrashPointUnknown, ConfigurationError)
    assert issubclass(ConfigurationError, ValueError)
    with pytest.raises(OncewireError):
        raise SchemaError("catch them all by the root")
