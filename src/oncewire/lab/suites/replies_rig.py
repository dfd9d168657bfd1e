"""The replies rig: an application around the reply engine and the journaled fake platforms.

Used by the ``replies`` lab suite, its child process (:mod:`oncewire.lab.children.replies`)
and the tests. The "application" admits an inbound message, answers it with a scripted text
(streamed or not) and writes the answer to its own ``transcript`` table in the same transaction
as the reply record. Every reply is framed by a header and a footer, so the oracle can find its
copies on screen and tell complete ones from partial ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oncewire import Ledger, LedgerTransaction, Platform, PlatformProfile, ReplyEngine
from oncewire.core.clock import Clock
from oncewire.inbound import Admission, InboundState
from oncewire.replies import DISCORD_LIKE, NON_EDITABLE, TELEGRAM_LIKE, DeliveryPass, ReplyState
from oncewire.storage import Store, open_store
from oncewire.storage.sqlite import SQLiteStore
from oncewire.testing.fake_platform import ChatView, FakePlatform, Fault

__all__ = [
    "BOT",
    "LONG_BODY",
    "PROFILES",
    "Rig",
    "check_reply",
    "deltas",
    "footer",
    "header",
    "persisted",
    "reply_text",
    "snapshot",
]

PROFILES: dict[str, PlatformProfile] = {
    "fk_tg": TELEGRAM_LIKE,
    "fk_dc": DISCORD_LIKE,
    "fk_ne": NON_EDITABLE,
}
BOT = "bot"
LONG_BODY = " ".join(f"word{i:04d}" for i in range(900))  # ~8.1k chars: over both caps
EXPECTATIONS = ("exact", "one_copy", "marked_dupes")


def _open(db: str, synchronous: str) -> Store:
    if db.startswith(("postgresql://", "postgres://")):
        return open_store(db)
    return SQLiteStore(db, synchronous=synchronous)


def persisted(ledger: Ledger, inbound_id: int) -> list[str]:
    """The application's transcript rows for one inbound message."""
    with ledger.transaction() as tx:
        rows = tx.execute(
            "SELECT text FROM transcript WHERE inbound_id = :id", {"id": inbound_id}
        ).fetchall()
    return [row[0] for row in rows]


def header(aid: str) -> str:
    return f"<<{aid}>>"


def footer(aid: str) -> str:
    return f"<</{aid}>>"


def reply_text(aid: str, body: str) -> str:
    return f"{header(aid)} {body} {footer(aid)}"


def deltas(text: str, mode: str) -> list[str]:
    """``one``: the whole text in one delta; ``two``: two bursts (a long reply's first burst
    already overflows every cap); ``many``: about ten deltas."""
    if mode == "one":
        return [text]
    if mode == "two":
        half = len(text) // 2 + 1
        return [text[:half], text[half:]]
    size = max(1, len(text) // 10)
    return [text[i : i + size] for i in range(0, len(text), size)]


class Rig:
    """An application database, the three fake platforms and an engine, in one folder."""

    def __init__(
        self,
        folder: Path,
        *,
        clock: Clock | None = None,
        faults: Sequence[Fault] = (),
        synchronous: str = "FULL",
        db: str | None = None,
        inline_wait_max_seconds: float = 5.0,
        edit_interval_seconds: float = 0.0,
        remote: Mapping[str, Platform] | None = None,
    ) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(_open(db or str(folder / "app.db"), synchronous), clock=clock)
        remote = dict(remote or {})  # adapters of fakes running as their own processes
        self.platforms = {
            name: FakePlatform(folder / f"{name}.jsonl", profile, name=name, faults=faults)
            for name, profile in PROFILES.items()
            if name not in remote
        }
        self.engine = ReplyEngine(
            self.ledger,
            {**self.platforms, **remote},
            inline_wait_max_seconds=inline_wait_max_seconds,
            edit_interval_seconds=edit_interval_seconds,
        )
        with self.ledger.transaction() as tx:
            tx.execute(
                "CREATE TABLE IF NOT EXISTS transcript ("
                " inbound_id BIGINT PRIMARY KEY, text TEXT NOT NULL)"
            )

    def close(self) -> None:
        for platform in self.platforms.values():
            platform.close()
        self.ledger.close()

    def __enter__(self) -> Rig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the application ---------------------------------------------------------------------
    def admit(self, platform: str, chat: str, message_id: str, thread: str = "") -> Admission:
        return self.ledger.inbound.admit(
            platform, BOT, chat, message_id, {"text": f"question {message_id}"}, thread=thread
        )

    def _persist(self, tx: LedgerTransaction, inbound_id: int, text: str) -> None:
        tx.execute(
            "INSERT INTO transcript (inbound_id, text) VALUES (:id, :text)",
            {"id": inbound_id, "text": text},
        )

    def answer(self, inbound_id: int, text: str, mode: str = "off") -> DeliveryPass:
        """Answer: ``off`` commits then delivers; ``one``/``two``/``many`` stream first."""

        def persist(tx: LedgerTransaction, final: str) -> None:
            self._persist(tx, inbound_id, final)

        if mode == "off":
            return self.engine.answer(inbound_id, text, on_commit=persist)
        return self.engine.stream(inbound_id, deltas(text, mode), on_commit=persist)

    def settle(self, *, max_rounds: int = 50) -> None:
        """Run scheduled deliveries, moving a manual clock forward to each one."""
        for _ in range(max_rounds):
            due = self.engine.next_due()
            if due is None:
                return
            now = self.ledger.clock.now()
            if due > now:
                self.ledger.clock.sleep(due - now)
            self.engine.run_due()

    # -- reading the truth -------------------------------------------------------------------
    def view(self) -> ChatView:
        return ChatView(sorted(self.folder.glob("*.jsonl")))

    def transcript(self, inbound_id: int) -> list[str]:
        with self.ledger.transaction() as tx:
            rows = tx.execute(
                "SELECT text FROM transcript WHERE inbound_id = :id", {"id": inbound_id}
            ).fetchall()
        return [row[0] for row in rows]

    def check(
        self, platform: str, chat: str, aid: str, inbound_id: int, expect: str = "exact"
    ) -> list[str]:
        return check_reply(self.folder, self.ledger, platform, chat, aid, inbound_id, expect)


def check_reply(
    folder: Path,
    ledger: Ledger,
    platform: str,
    chat: str,
    aid: str,
    inbound_id: int,
    expect: str = "exact",
) -> list[str]:
    """The invariants, read from the journals and the database (not from the engine):

    * the answer is persisted exactly once, and the reply record is delivered;
    * there is a complete visible copy, and every complete copy equals the persisted text;
    * ``exact``: exactly one copy, unmarked, nothing else from it on screen;
      ``one_copy``: exactly one complete copy (marked only if a send may have landed);
      ``marked_dupes``: at most one unmarked copy, every other copy or fragment marked;
    * no unmarked partial copy is left visible.
    """
    if expect not in EXPECTATIONS:
        raise ValueError(f"unknown expectation {expect!r}")
    failures: list[str] = []
    view = ChatView(sorted(folder.glob("*.jsonl")))
    copies, others = view.copies(platform, chat, header(aid), footer(aid), PROFILES[platform])
    with ledger.transaction() as tx:
        persisted = [
            row[0]
            for row in tx.execute(
                "SELECT text FROM transcript WHERE inbound_id = :id", {"id": inbound_id}
            ).fetchall()
        ]
    reply = ledger.replies.for_inbound(inbound_id)
    inbound = ledger.inbound.get(inbound_id)
    context = _context(view, platform, chat)
    if len(persisted) != 1:
        return [f"answer persisted {len(persisted)} times{context}"]
    want = persisted[0]
    if reply is None or reply.state is not ReplyState.DELIVERED:
        failures.append(f"reply record is {reply and reply.state}, not delivered{context}")
    if reply is not None and reply.final_text != want:
        failures.append("the committed final text differs from the persisted answer")
    if inbound.status is not InboundState.DELIVERED:
        failures.append(f"inbound is {inbound.status}, not delivered")
    complete = [c for c in copies if c.complete]
    partial = [c for c in copies if not c.complete]
    unmarked = [c for c in complete if not c.marked]
    if not complete:
        failures.append(f"no complete visible reply{context}")
    for copy in complete:
        if copy.text != want:
            failures.append(f"visible text != committed text ({len(copy.text)} vs {len(want)})")
    if [c for c in partial if not c.marked]:
        failures.append(f"an unmarked partial copy is left visible{context}")
    if expect == "exact":
        if len(complete) != 1 or unmarked != complete or partial or others:
            failures.append(
                f"expected exactly one unmarked reply: {len(unmarked)} unmarked, "
                f"{len(complete) - len(unmarked)} marked, {len(partial)} partial, "
                f"{len(others)} other{context}"
            )
    elif expect == "one_copy":
        if len(complete) != 1 or partial or others:
            failures.append(f"expected exactly one complete copy, saw {len(complete)}{context}")
    else:
        marked_others = [m for m in others if PROFILES[platform].strip_marker(m.text)[1]]
        if len(unmarked) > 1 or len(marked_others) != len(others):
            failures.append(f"an unmarked duplicate: {len(unmarked)} unmarked copies{context}")
    return failures


def _context(view: ChatView, platform: str, chat: str) -> str:
    lines = [
        f"\n  [{m.message_id} edits={m.edits}] {m.text[:60]!r}...{m.text[-30:]!r}"
        for m in view.visible(platform, chat)
    ]
    return "".join(lines)


def snapshot(ledger: Ledger) -> dict[str, Any]:
    """Every inbound, reply and wire operation, for the lab's evidence."""
    out: dict[str, Any] = {"inbound": [], "replies": []}
    for inbound in ledger.inbound.list(limit=10_000):
        out["inbound"].append(inbound.as_dict())
    for reply in ledger.replies.list(limit=10_000):
        item = reply.as_dict()
        item["ops"] = [op.as_dict() for op in ledger.replies.ops(reply.id)]
        out["replies"].append(item)
    return out
