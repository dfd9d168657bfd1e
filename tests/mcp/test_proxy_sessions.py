"""Proxies that share one store: each performs only the calls its own client sent it, with its
own server, even when the servers have the same ``serverInfo.name`` (so the same effect kinds).

Every proxy here is a real child process with a real SDK server as its own child; each server
writes the calls it really got to a log of its own (``UPSTREAM_LOG``), and the store is read
directly. A call a proxy accepted and never performed (it died) is performed by the proxy the
client retries it through with its key, and by no other."""

from __future__ import annotations

from pathlib import Path

import anyio
from mcp import ClientSession

from oncewire import Ledger
from tests.mcp.conftest import SQLITE_BY_DEFAULT, Raw, calls_logged, proxied

KEY = "io.oncewire/idempotency-key"


def text(result: object) -> str:
    return " ".join(getattr(c, "text", "") for c in getattr(result, "content", []))


def test_two_proxies_on_one_store_each_perform_only_their_own_calls(
    db_url: str, raw: Raw, tmp_path: Path
) -> None:
    logs = {"a": tmp_path / "server-a.log", "b": tmp_path / "server-b.log"}

    async def calls(session: ClientSession, side: str) -> None:
        async def one(n: int) -> None:
            meta = {KEY: f"{side}-{n}"} if n % 3 else None  # every third without a key
            result = await session.call_tool("charge", {"amount": n, "note": side}, meta=meta)
            assert text(result) == f"charged {n}"

        async with anyio.create_task_group() as tg:
            for n in range(12):
                tg.start_soon(one, n)

    async def scenario() -> None:
        async with (
            proxied(db_url, logs["a"]) as a,
            proxied(db_url, logs["b"]) as b,
        ):
            for session in (a, b):
                assert session.initialize_result is not None
                assert session.initialize_result.server_info.name == "pay"
            async with anyio.create_task_group() as tg:
                tg.start_soon(calls, a, "a")
                tg.start_soon(calls, b, "b")

    anyio.run(scenario)
    effects = raw.effects()
    assert len(effects) == 24
    assert {(e["kind"], e["state"]) for e in effects} == {("mcp.pay.charge", "done")}
    for side, log in logs.items():
        logged = calls_logged(log)
        assert len({c["pid"] for c in logged}) == 1  # one server
        assert sorted(c["arguments"]["amount"] for c in logged) == list(range(12))
        strangers = [c for c in logged if c["arguments"]["note"] != side]
        assert strangers == [], f"server {side} performed another proxy's calls"
    pids = {calls_logged(log)[0]["pid"] for log in logs.values()}
    assert len(pids) == 2


@SQLITE_BY_DEFAULT
def test_a_call_nobody_waits_for_is_left_alone_until_its_key_is_retried(
    db_url: str, raw: Raw, tmp_path: Path
) -> None:
    """An effect of the proxy's kind that no client of this proxy sent (here accepted straight
    into the store, as a proxy that died after its accept leaves one) is not performed by a
    proxy serving other calls of that kind; a retry with its key performs it, once."""
    with Ledger(db_url) as ledger:
        payload = {"tool": "charge", "arguments": {"amount": 9}}
        ledger.effects.accept_alone("orphan-1", "mcp.pay.charge", payload, max_attempts=1)
    log = tmp_path / "server.log"

    async def scenario() -> None:
        async with proxied(db_url, log) as session:
            for n in range(3):
                result = await session.call_tool("charge", {"amount": n}, meta={KEY: f"own-{n}"})
                assert text(result) == f"charged {n}"
        # Claims go by not_before, then id: a proxy that claimed what it does not wait for would
        # have taken the older orphan no later than its own first call.
        [orphan] = [e for e in raw.effects() if e["key"] == "orphan-1"]
        assert (orphan["state"], orphan["attempts"]) == ("pending", 0)
        assert [c["key"] for c in calls_logged(log)] == ["own-0", "own-1", "own-2"]
        async with proxied(db_url, log) as session:
            retried = await session.call_tool("charge", {"amount": 9}, meta={KEY: "orphan-1"})
            assert text(retried) == "charged 9"

    anyio.run(scenario)
    assert [c["key"] for c in calls_logged(log)] == ["own-0", "own-1", "own-2", "orphan-1"]
    [orphan] = [e for e in raw.effects() if e["key"] == "orphan-1"]
    assert (orphan["state"], orphan["attempts"]) == ("done", 1)
