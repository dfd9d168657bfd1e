"""A thread whose stored history was changed around oncewire is refused, never half-read: an
edited checkpoint blob, an edited write value, an edited chain hash, a deleted chain entry, or
a blob that no longer deserialises makes get_tuple and list raise the typed error (a fresh
saver, as another process would be, verifies the whole chain first)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from oncewire.core.errors import CheckpointTampered, CheckpointUnreadable
from oncewire.langgraph import OncewireSaver
from oncewire.ledger import Ledger
from tests.langgraph.conftest import Raw
from tests.langgraph.test_saver_graph import graph, run_graph

CONFIG = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


_OPEN: list[Ledger] = []


@pytest.fixture(autouse=True)
def _close_ledgers() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _fresh(db_url: str) -> OncewireSaver:
    """A new saver on a new ledger, as another process would open it."""
    ledger = Ledger(db_url)
    _OPEN.append(ledger)
    return OncewireSaver(ledger)


def _newest(raw: Raw) -> tuple[str, int]:
    cid, seq = raw.query(
        "SELECT checkpoint_id, seq FROM oncewire_lg_checkpoints WHERE thread_id = 't' "
        "ORDER BY checkpoint_id DESC LIMIT 1"
    )[0]
    return str(cid), int(seq)


def _flip(value: bytes) -> bytes:
    return bytes([value[0] ^ 0x01]) + bytes(value[1:])


def _flip_newest(raw: Raw, column: str) -> None:
    """Flip a bit of ``column`` (a blob) of the thread's newest checkpoint row."""
    cid, _ = _newest(raw)
    (blob,) = raw.query(
        f"SELECT {column} FROM oncewire_lg_checkpoints WHERE thread_id = 't' AND checkpoint_id = ?",
        (cid,),
    )[0]
    raw.execute(
        f"UPDATE oncewire_lg_checkpoints SET {column} = ? WHERE thread_id = 't' AND "
        "checkpoint_id = ?",
        (_flip(bytes(blob)), cid),
    )


def _edit_blob(raw: Raw) -> None:
    _flip_newest(raw, "checkpoint")


def _edit_hash(raw: Raw) -> None:
    raw.execute(
        "UPDATE oncewire_lg_chain SET hash = ? WHERE thread_id = 't' AND seq = 2", ("0" * 64,)
    )


def _drop_entry(raw: Raw) -> None:
    raw.execute("DELETE FROM oncewire_lg_chain WHERE thread_id = 't' AND seq = 2")


def _edit_write(raw: Raw) -> None:
    task, idx, value = raw.query(
        "SELECT task_id, idx, value FROM oncewire_lg_writes WHERE thread_id = 't' "
        "ORDER BY seq DESC LIMIT 1"
    )[0]
    raw.execute(
        "UPDATE oncewire_lg_writes SET value = ? WHERE thread_id = 't' AND task_id = ? AND idx = ?",
        (_flip(bytes(value)), task, idx),
    )


@pytest.mark.parametrize(
    "tamper", [_edit_blob, _edit_hash, _drop_entry], ids=["blob", "hash", "deleted-entry"]
)
def test_a_tampered_thread_is_refused_by_get_tuple_and_list(
    db_url: str, raw: Raw, tamper: Callable[[Raw], None]
) -> None:
    run_graph(db_url, "t")
    assert _fresh(db_url).get_tuple(CONFIG) is not None  # intact before
    tamper(raw)
    saver = _fresh(db_url)
    with pytest.raises(CheckpointTampered) as caught:
        saver.get_tuple(CONFIG)
    assert caught.value.code in ("checkpoint_tampered", "checkpoint_unreadable")
    with pytest.raises(CheckpointTampered):
        list(_fresh(db_url).list(CONFIG))


def test_a_write_edited_in_place_is_refused(db_url: str, raw: Raw) -> None:
    saver = _fresh(db_url)
    stored = saver.put(
        CONFIG,
        {
            "v": 4,
            "id": "1f000000-0000-6000-8000-000000000001",
            "ts": "",
            "channel_values": {},
            "channel_versions": {},
            "versions_seen": {},
            "updated_channels": None,
        },
        {"source": "input", "step": -1, "parents": {}},
        {},
    )
    saver.put_writes(stored, [("x", "hello")], "task-1", "~__pregel_pull, a")
    assert saver.get_tuple(stored).pending_writes == [("task-1", "x", "hello")]  # type: ignore[union-attr]
    _edit_write(raw)
    with pytest.raises(CheckpointTampered):
        _fresh(db_url).get_tuple(stored)
    with pytest.raises(CheckpointTampered):
        saver.get_tuple(stored)  # the saver that wrote it, too: every row is checked


def _edit_metadata(raw: Raw) -> None:
    _flip_newest(raw, "metadata")


def _edit_newest_material(raw: Raw) -> None:
    _, seq = _newest(raw)
    raw.execute(
        "UPDATE oncewire_lg_chain SET material = replace(material, '\"k\"', ' \"k\"') "
        "WHERE thread_id = 't' AND seq = ?",
        (seq,),
    )


@pytest.mark.parametrize(
    "tamper",
    [_edit_blob, _edit_metadata, _edit_newest_material, _edit_write],
    ids=["blob", "metadata", "entry-material", "write"],
)
def test_a_saver_that_read_the_rows_intact_refuses_them_edited(
    db_url: str, raw: Raw, tamper: Callable[[Raw], None]
) -> None:
    """A saver keeps the chain entries it verified and compares an entry read again with them
    instead of hashing it: what it read intact and was edited since is still refused, by the
    same saver, on get_tuple and on list."""
    reader = _fresh(db_url)
    graph().compile(checkpointer=reader).invoke({"log": []}, CONFIG)
    newest = reader.get_tuple(CONFIG)
    assert newest is not None
    reader.put_writes(newest.config, [("x", "hello")], "task-9", "~__pregel_pull, z")
    for _ in range(2):  # the second read compares the entries with those the first verified
        again = reader.get_tuple(CONFIG)
        assert again is not None and again.pending_writes == [("task-9", "x", "hello")]
    tamper(raw)
    with pytest.raises(CheckpointTampered):
        reader.get_tuple(CONFIG)
    with pytest.raises(CheckpointTampered):
        list(reader.list(CONFIG))


def test_a_blob_that_does_not_deserialise_is_refused(db_url: str, raw: Raw) -> None:
    """The tamperer recomputed every digest and hash (no key): the chain holds, the bytes do
    not deserialise, and the read fails closed with CheckpointUnreadable."""
    from oncewire.langgraph import chain
    from oncewire.storage.langgraph import blob_digest

    run_graph(db_url, "t")
    cid, seq = _newest(raw)
    garbage = b"\xc1 not msgpack"
    (type_,) = raw.query(
        "SELECT type FROM oncewire_lg_checkpoints WHERE thread_id = 't' AND checkpoint_id = ?",
        (cid,),
    )[0]
    raw.execute(
        "UPDATE oncewire_lg_checkpoints SET checkpoint = ? WHERE thread_id = 't' AND "
        "checkpoint_id = ?",
        (garbage, cid),
    )
    # Re-hash from the edited entry to the head, as someone without a key could.
    rows = raw.query(
        "SELECT seq, kind, material, prev_hash FROM oncewire_lg_chain WHERE thread_id = 't' "
        "AND seq >= ? ORDER BY seq",
        (seq,),
    )
    import json

    prev = rows[0][3]
    for s, kind, material, _ in rows:
        if s == seq:
            m = json.loads(material)
            m["blob"] = blob_digest(type_, garbage)
            material = json.dumps(m, sort_keys=True, separators=(",", ":"))
        h = chain.entry_hash(None, "t", s, kind, prev, material)
        raw.execute(
            "UPDATE oncewire_lg_chain SET material = ?, prev_hash = ?, hash = ? "
            "WHERE thread_id = 't' AND seq = ?",
            (material, prev, h, s),
        )
        prev = h
    raw.execute("UPDATE oncewire_lg_threads SET head_hash = ? WHERE thread_id = 't'", (prev,))
    with pytest.raises(CheckpointUnreadable) as caught:
        _fresh(db_url).get_tuple(CONFIG)
    assert caught.value.code == "checkpoint_unreadable"
