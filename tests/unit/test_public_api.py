"""The public API: a curated top level, one object per public name, and no class without words.

``import oncewire`` holds what a first program types; the rest lives in its subpackage, every
exception in ``oncewire.errors`` and the test helpers in ``oncewire.testing``. A name that left
the top level (or was renamed) says where it lives now instead of a bare AttributeError.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import oncewire
import oncewire.errors
import oncewire.testing
from oncewire.core import errors as core_errors

# What a user types in the first hour; anything else is one import further away.
FIRST_HOUR = {
    "Ledger",
    "LedgerTransaction",
    # the outbox
    "Attempt",
    "Done",
    "NotSent",
    "MaybeSent",
    "Rejected",
    "EffectOutcome",
    "Effect",
    "EffectState",
    "Dispatcher",
    "RetryPolicy",
    "DispatchStats",
    # the receiver
    "Receipts",
    "ReceiptResult",
    "ReceiptsSink",
    "SubprocessSink",
    # chat
    "ReplyEngine",
    "Platform",
    "PlatformProfile",
    "SendRequest",
    "Inbound",
    "Reply",
    # runs
    "Run",
    "RunEvent",
    # the errors a caller catches
    "OncewireError",
    "PayloadConflict",
    "StaleFence",
    "StorageError",
    "ConfigurationError",
    "InvalidState",
    "__version__",
}

# The top level before 0.1.0 curated it: each name is still there or says where it went.
FORMER_TOP_LEVEL = (  # noqa: SIM905  # one string reads as the list it was
    "DISCORD_LIKE NON_EDITABLE TELEGRAM_LIKE Acked Admission Ambiguous Attempt BranchBusy "
    "Clock ConfigurationError Delivery DispatchStats Dispatcher Done Effect EffectNotFound "
    "EffectState Effects HistoryHidden HistoryTampered Inbound InboundNotFound InboundStatus "
    "Inbox InvalidPayload InvalidState KindConflict Ledger LedgerTransaction ManualClock "
    "MaybeSent NotSent OncewireError Outcome PayloadConflict Platform PlatformProfile Receipt "
    "ReceiptNotFound ReceiptResult Receipts ReceiptsSink ReconcileReport Refused Rejected "
    "RejectedPermanently Replies Reply ReplyConflict ReplyEngine ReplyNotFound ReplyState "
    "RetryPolicy RevertBarrierHeld Run RunConflict RunError RunEvent RunNotFound RunStatus "
    "Runs RunsView SchemaError SendRequest SideEffectClass StaleFence StatementError "
    "StorageError StoreBusy StoreUnreachable StoreUnusable SubprocessSink SystemClock "
    "TransitionRefused Verdict Verification __version__ canonical_json digest "
    "this_process_owner"
).split()


def _packages() -> list[ModuleType]:
    """oncewire, oncewire.errors and every subpackage that declares __all__ (oncewire.testing
    among them)."""
    found = [oncewire, oncewire.errors]
    for info in pkgutil.walk_packages(oncewire.__path__, "oncewire."):
        if info.ispkg:
            package = importlib.import_module(info.name)
            if hasattr(package, "__all__"):
                found.append(package)
    return found


PACKAGES = _packages()


def _exported() -> list[tuple[str, str, object]]:
    return [(p.__name__, name, getattr(p, name)) for p in PACKAGES for name in p.__all__]


def _resolve(dotted: str) -> object:
    """The object a dotted path such as ``oncewire.errors.StoreBusy`` names."""
    module_name, _, attribute = dotted.rpartition(".")
    return getattr(importlib.import_module(module_name), attribute)


def _where(message_target: str) -> str:
    return message_target.split(" ", 1)[0]  # "oncewire.EffectOutcome (a run's ...)"


def test_the_top_level_is_what_a_first_program_types() -> None:
    assert set(oncewire.__all__) == FIRST_HOUR
    assert len(oncewire.__all__) == len(FIRST_HOUR)  # no name listed twice


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_name_in_all_is_bound(package: ModuleType) -> None:
    unbound = [name for name in package.__all__ if not hasattr(package, name)]
    assert unbound == [], f"{package.__name__}.__all__ names what it does not bind"


def test_one_public_name_means_one_object_in_every_package() -> None:
    meanings: dict[str, dict[int, list[str]]] = {}
    for package, name, obj in _exported():
        meanings.setdefault(name, {}).setdefault(id(obj), []).append(package)
    clashes = {name: list(by_id.values()) for name, by_id in meanings.items() if len(by_id) > 1}
    assert clashes == {}, "one name binds different objects in different packages"


def _own_docstring(cls: type) -> str | None:
    doc = cls.__dict__.get("__doc__")
    if not isinstance(doc, str) or not doc.strip():
        return None
    if dataclasses.is_dataclass(cls) and doc.startswith(f"{cls.__name__}("):
        return None  # the signature dataclass writes when a class has no docstring
    if issubclass(cls, enum.Enum) and doc in ("An enumeration.", enum.Enum.__doc__):
        return None
    return doc


def test_every_exported_class_has_a_docstring_of_its_own() -> None:
    missing = sorted(
        {
            f"{obj.__module__}.{obj.__qualname__}"
            for _, _, obj in _exported()
            if inspect.isclass(obj) and _own_docstring(obj) is None
        }
    )
    assert missing == []


def test_the_docstring_check_sees_what_dataclass_and_enum_generate() -> None:
    @dataclasses.dataclass
    class Bare:
        x: int

    class Colour(enum.Enum):
        RED = 1

    class Said:
        """Said."""

    assert (_own_docstring(Bare), _own_docstring(Colour), _own_docstring(Said)) == (
        None,
        None,
        "Said.",
    )


def test_oncewire_errors_holds_every_exception_and_its_docstring_lists_them() -> None:
    classes = {
        name
        for name, obj in vars(core_errors).items()
        if inspect.isclass(obj)
        and issubclass(obj, core_errors.OncewireError)
        and not name.startswith("_")
    }
    assert set(oncewire.errors.__all__) == classes
    doc = oncewire.errors.__doc__ or ""
    assert [name for name in sorted(classes) if f" {name}" not in doc] == []
    for name in classes:
        assert getattr(oncewire.errors, name) is getattr(core_errors, name)


def test_oncewire_testing_offers_the_manual_clock_and_the_fake_platform() -> None:
    from oncewire.core.clock import ManualClock
    from oncewire.testing.fake_platform import ChatView, FakePlatform, Fault

    assert oncewire.testing.ManualClock is ManualClock
    assert oncewire.testing.FakePlatform is FakePlatform
    assert oncewire.testing.Fault is Fault
    assert oncewire.testing.ChatView is ChatView


@pytest.mark.parametrize("name", sorted(oncewire._MOVED))
def test_a_name_that_left_the_top_level_says_where_it_lives(name: str) -> None:
    where = oncewire._MOVED[name]
    with pytest.raises(AttributeError, match=rf"oncewire\.{name} is not at the top level") as e:
        getattr(oncewire, name)
    assert where in str(e.value)
    assert e.value.name == name
    moved = _resolve(where)  # raises if the new home does not bind it
    assert getattr(moved, "__name__", name) == name
    assert not hasattr(oncewire, name)


@pytest.mark.parametrize("name", sorted(oncewire._RENAMED))
def test_a_renamed_name_says_its_new_name(name: str) -> None:
    target = oncewire._RENAMED[name]
    with pytest.raises(AttributeError, match=rf"oncewire\.{name} was renamed: use ") as e:
        getattr(oncewire, name)
    assert target in str(e.value)
    home, _, new_name = _where(target).rpartition(".")
    renamed = _resolve(f"{home}.{new_name}")  # raises if the new name is not bound there
    assert getattr(renamed, "__name__", new_name) == new_name
    assert not hasattr(importlib.import_module(home), name)  # no alias under the old name


def test_every_former_top_level_name_is_still_there_or_says_where_it_went() -> None:
    lost = [
        name
        for name in FORMER_TOP_LEVEL
        if name not in oncewire.__all__ and name not in oncewire._MOVED | oncewire._RENAMED
    ]
    assert lost == []
    assert set(oncewire.__all__).isdisjoint(oncewire._MOVED.keys() | oncewire._RENAMED.keys())


def test_an_unknown_name_is_a_plain_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"^module 'oncewire' has no attribute 'Ledgr'$"):
        oncewire.Ledgr  # noqa: B018
    assert not hasattr(oncewire, "Ledgr")


def test_from_import_of_a_subpackage_still_works_beside_the_hook() -> None:
    from oncewire import runs, testing

    assert runs.Runs is importlib.import_module("oncewire.runs").Runs
    assert testing is oncewire.testing
