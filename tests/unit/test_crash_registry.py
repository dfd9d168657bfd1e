"""The crash point registry and the arming syntax (the killing itself is tested with real
child processes in tests/integration/test_crash_points_kill.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import oncewire.dispatch
import oncewire.effects
import oncewire.mcp.proxy_calls
import oncewire.receipts
import oncewire.storage.verbs.langgraph  # noqa: F401  (imported for the points they register)
from oncewire.core import crash
from oncewire.core.errors import CrashPointUnknown


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Points registered by a test vanish after it, so the lab's matrix never sees them."""
    monkeypatch.setattr(crash, "_REGISTRY", dict(crash._REGISTRY))
    monkeypatch.delenv(crash.ENV_POINTS, raising=False)
    monkeypatch.delenv(crash.ENV_TOKEN, raising=False)
    yield


def test_register_is_idempotent() -> None:
    first = crash.register("unit.point", "first description")
    again = crash.register("unit.point", "another description")
    assert again is first
    assert again.description == "first description"
    assert list(crash.registry()).count("unit.point") == 1


def test_registry_is_sorted_and_a_copy() -> None:
    crash.register("unit.zz", "z")
    crash.register("unit.aa", "a")
    names = list(crash.registry())
    assert names == sorted(names)
    crash.registry().pop("unit.aa")
    assert "unit.aa" in crash.registry()


def test_production_code_registers_its_windows() -> None:
    names = set(crash.registry())
    assert {
        "effects.accept_before_commit",
        "dispatch.after_claim",
        "dispatch.after_sink_before_record",
        "dispatch.after_record",
        "receipts.after_work_before_commit",
        "receipts.after_commit_before_reply",
        "langgraph.put_before_commit",
        "langgraph.put_after_commit",
        "langgraph.writes_before_commit",
        "langgraph.writes_after_commit",
        "mcp.proxy.after_accept",
        "mcp.proxy.before_forward",
        "mcp.proxy.after_forward",
        "mcp.proxy.after_settled",
    } <= names
    for name, point in crash.registry().items():
        assert "." in name and point.description, name


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", {}),
        ("a", {"a": 1}),
        ("a,b@3", {"a": 1, "b": 3}),
        (" a , ,b@2, ", {"a": 1, "b": 2}),
        ("dispatch.after_claim@10", {"dispatch.after_claim": 10}),
    ],
)
def test_armed_parses_the_environment(
    monkeypatch: pytest.MonkeyPatch, spec: str, expected: dict[str, int]
) -> None:
    monkeypatch.setenv(crash.ENV_POINTS, spec)
    assert crash.armed() == expected


def test_nothing_is_armed_without_the_variable() -> None:
    assert crash.armed() == {}
    crash.check_armed()  # and nothing to complain about


def test_check_armed_accepts_registered_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        crash.ENV_POINTS, "dispatch.after_claim,receipts.after_commit_before_reply@2"
    )
    crash.check_armed()
    assert crash.armed() == {
        "dispatch.after_claim": 1,
        "receipts.after_commit_before_reply": 2,
    }


def test_check_armed_flags_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(crash.ENV_POINTS, "dispatch.after_claim,zz.typo@2,aa.typo")
    with pytest.raises(CrashPointUnknown) as caught:
        crash.check_armed()
    assert "aa.typo, zz.typo" in str(caught.value)
    assert "dispatch.after_claim" not in str(caught.value)


def test_an_unarmed_point_is_a_no_op() -> None:
    point = crash.register("unit.unarmed", "never armed")
    for _ in range(3):
        point.hit()
    assert point.hits == 0  # unarmed points do not even count


def test_a_malformed_hit_count_is_named_by_check_armed_not_an_import_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(crash.ENV_POINTS, "dispatch.after_claim@x,dispatch.after_record@0")
    assert crash.armed() == {"dispatch.after_claim@x": 1, "dispatch.after_record@0": 1}
