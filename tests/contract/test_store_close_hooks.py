"""Store contract: what runs on a store in threads of its own is stopped before it closes.

``Store.on_close(hook)`` runs ``hook()`` when ``close()`` begins, while every connection is still
open: a background thread (a heartbeat, a node's dispatcher) stops there instead of having its
connection closed under a running statement, which can crash the process.
"""

from __future__ import annotations

import threading

from oncewire.storage import Store

from .conftest import Arrange


def test_a_close_hook_runs_before_the_connections_close(store: Store, arrange: Arrange) -> None:
    arrange.add("k")
    seen: list[object] = []
    stop = threading.Event()
    reads: list[int] = []

    def background() -> None:  # reads the store on its own connection until told to stop
        while not stop.wait(0.001):
            reads.append(len(store.list_effects()))

    thread = threading.Thread(target=background, daemon=True)
    thread.start()

    def hook() -> None:
        stop.set()
        thread.join(10)
        seen.append(store.get_effect("k"))  # the connections are still open here

    store.on_close(hook)
    while not reads:
        threading.Event().wait(0.001)
    store.close()
    assert not thread.is_alive()
    assert len(seen) == 1 and seen[0] is not None
    assert set(reads) == {1}


def test_a_hook_taken_back_does_not_run(store: Store) -> None:
    calls: list[str] = []
    remove = store.on_close(lambda: calls.append("removed"))
    store.on_close(lambda: calls.append("kept"))
    remove()
    store.close()
    assert calls == ["kept"]


def test_a_failing_hook_does_not_keep_the_store_open(store: Store) -> None:
    calls: list[str] = []

    def fails() -> None:
        raise RuntimeError("a hook that fails")

    store.on_close(fails)
    store.on_close(lambda: calls.append("after"))
    store.close()
    assert calls == ["after"]
    assert store.closed
