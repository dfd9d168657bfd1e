"""Store contract: the model responses of durable OpenAI Agents SDK runs."""

from __future__ import annotations

import pytest

from oncewire.core.errors import OncewireError
from oncewire.storage import Store
from oncewire.storage.agents import AgentStep

from .conftest import T0, RawDatabase


def record(
    store: Store, run_key: str, step: int, response: str = '{"r":1}', digest: str = "a" * 64
) -> tuple[AgentStep, bool]:
    with store.transaction() as tx:
        return store.agent_record_step_in_tx(
            tx, run_key=run_key, step=step, request_digest=digest, response_json=response, now=T0
        )


def test_a_recorded_step_is_read_back_as_it_was_written(store: Store, raw: RawDatabase) -> None:
    stored, created = record(store, "run-1", 0, '{"output":[]}')
    assert created
    assert stored == AgentStep("run-1", 0, "a" * 64, '{"output":[]}', T0)
    assert store.agent_list_steps("run-1") == [stored]
    assert raw.query("SELECT run_key, step, response FROM oncewire_agent_steps") == [
        ("run-1", 0, '{"output":[]}')
    ]


def test_a_step_recorded_again_keeps_the_first_response(store: Store, raw: RawDatabase) -> None:
    record(store, "run-1", 0, '{"first":true}', "a" * 64)
    stored, created = record(store, "run-1", 0, '{"second":true}', "b" * 64)
    assert not created
    assert stored.response_json == '{"first":true}'
    assert stored.request_digest == "a" * 64
    assert raw.count("oncewire_agent_steps") == 1


def test_steps_are_listed_in_order_and_per_run(store: Store) -> None:
    for step in (2, 0, 1):
        record(store, "run-1", step, f'{{"s":{step}}}')
    record(store, "run-2", 0)
    assert [s.step for s in store.agent_list_steps("run-1")] == [0, 1, 2]
    assert [s.run_key for s in store.agent_list_steps("run-2")] == ["run-2"]
    assert store.agent_list_steps("run-3") == []


def test_a_step_recorded_in_a_transaction_that_fails_is_not_kept(store: Store) -> None:
    with pytest.raises(RuntimeError), store.transaction() as tx:
        store.agent_record_step_in_tx(
            tx, run_key="run-1", step=0, request_digest="a" * 64, response_json="{}", now=T0
        )
        raise RuntimeError("the caller's own write failed")
    assert store.agent_list_steps("run-1") == []


def test_a_negative_step_is_refused_by_the_database(store: Store) -> None:
    with pytest.raises(OncewireError):
        record(store, "run-1", -1)
