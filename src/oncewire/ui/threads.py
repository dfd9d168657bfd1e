"""The LangGraph pages: threads stored by :class:`~oncewire.langgraph.OncewireSaver`, each
verified as ``oncewire doctor --deep`` verifies it (:mod:`oncewire.langgraph.chain`, which needs
no LangGraph), a page of threads at a time.

Verification fails closed: a thread is shown as verified only when its whole chain and every
row held; a broken history, a key that does not fit its chain and a verification that could
not finish are all shown as not verified, with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from oncewire.core.errors import CheckpointTampered, ConfigurationError, OncewireError
from oncewire.langgraph import chain
from oncewire.ledger import Ledger
from oncewire.storage.langgraph import (
    ChainEntry,
    CheckpointRow,
    ThreadHead,
    ThreadSummary,
    WriteRow,
    lease_name,
)
from oncewire.ui.guard import Refusal
from oncewire.ui.views import when

__all__ = ["CHECKPOINTS_SHOWN", "THREADS_PAGE", "thread_detail", "threads_page"]

log = logging.getLogger("oncewire.ui")

THREADS_PAGE = 20  # threads a page: each one is read whole to be verified
CHECKPOINTS_SHOWN = 500  # a thread's newest checkpoints listed on its page (all are verified)


def _verdict(
    thread_id: str,
    rows: tuple[ThreadHead | None, list[ChainEntry], list[CheckpointRow], list[WriteRow]],
    key: bytes | None,
) -> dict[str, Any]:
    """``ok`` True only when the thread verified; otherwise the reason, as a sentence."""
    try:
        verdict = chain.judge_thread(thread_id, *rows, key)
    except ConfigurationError as exc:  # a key that does not fit: nothing judged, not fine
        return {"ok": False, "text": f"not verified: {exc} [{exc.code}]"}
    except OncewireError:
        raise  # the store's trouble: the page says so
    except Exception as exc:  # a history verification could not read through is no good one
        log.exception("verifying LangGraph thread %r failed", thread_id)
        return {"ok": False, "text": f"not verified: {type(exc).__name__}: {exc}"}
    if verdict.ok:
        return {
            "ok": True,
            "text": f"verified: {verdict.entries} chain entries, "
            f"{verdict.checkpoints} checkpoint(s), {verdict.writes} write(s)",
        }
    return {"ok": False, "text": f"broken: {verdict.reason} [{CheckpointTampered.code}]"}


def _lease(owner: str | None, fence: int | None, expires: float | None, now: float) -> str:
    if fence is None:
        return "never held"
    if owner is None:
        return f"released (fence {fence})"
    state = "held" if expires is not None and expires > now else "expired"
    return f"{owner} (fence {fence}, {state}, until {when(expires)})"


def _summary(s: ThreadSummary, verdict: dict[str, Any], now: float) -> dict[str, Any]:
    return {
        "thread_id": s.head.thread_id,
        "head_checkpoint": s.head_checkpoint or "",
        "head_seq": s.head.head_seq,
        "chain": s.head.chain,
        "checkpoints": s.checkpoints,
        "lease": _lease(s.owner, s.fence, s.lease_expires_at, now),
        "updated": when(s.updated_at),
        "verdict": verdict,
    }


def threads_page(ledger: Ledger, after: str) -> dict[str, Any]:
    """One page of threads by id, each verified whole (only this page's threads are read)."""
    now = ledger.clock.now()
    store, key = ledger.store, ledger.runs.key
    found = store.lg_thread_page(after=after, limit=THREADS_PAGE + 1)
    more, found = len(found) > THREADS_PAGE, found[:THREADS_PAGE]
    rows = []
    for s in found:
        thread_id = s.head.thread_id
        rows.append(_summary(s, _verdict(thread_id, store.lg_thread(thread_id), key), now))
    return {
        "rows": rows,
        "next_after": found[-1].head.thread_id if more and found else None,
        "after": after,
        "page_size": THREADS_PAGE,
    }


def _row_checks(
    head: ThreadHead | None,
    checkpoints: Sequence[CheckpointRow],
    writes: Sequence[WriteRow],
    key: bytes | None,
) -> tuple[set[tuple[str, str]], str]:
    """The checkpoints ``(ns, id)`` whose row, or one of whose writes, does not match its chain
    entry; and why none could be checked ("" when they were)."""
    if head is None:
        return set(), "the thread has no chain head"
    try:
        use = chain.chain_key(head, key)
    except ConfigurationError as exc:
        return set(), str(exc)
    bad: set[tuple[str, str]] = set()
    for row in checkpoints:
        try:
            chain.check_checkpoint(row, use)
        except CheckpointTampered:
            bad.add((row.checkpoint_ns, row.checkpoint_id))
    for write in writes:
        try:
            chain.check_write(head.thread_id, write, use)
        except CheckpointTampered:
            bad.add((write.checkpoint_ns, write.checkpoint_id))
    return bad, ""


def thread_detail(ledger: Ledger, thread_id: str) -> dict[str, Any]:
    """A thread verified, with its head, lease, recorded run and checkpoints (newest first),
    all read at one moment of the store."""
    now = ledger.clock.now()
    store, key = ledger.store, ledger.runs.key
    rows = store.lg_thread(thread_id)
    head, entries, checkpoints, writes = rows
    if head is None and not (entries or checkpoints or writes):
        raise Refusal(404, f"no LangGraph thread {thread_id!r} in this store")
    verdict = _verdict(thread_id, rows, key)
    bad, unchecked = _row_checks(head, checkpoints, writes, key)
    lease = store.get_lease(lease_name(thread_id))
    run = store.lg_get_run(thread_id)
    writes_of: dict[tuple[str, str], int] = {}
    for w in writes:
        writes_of[(w.checkpoint_ns, w.checkpoint_id)] = (
            writes_of.get((w.checkpoint_ns, w.checkpoint_id), 0) + 1
        )
    newest = sorted(checkpoints, key=lambda c: c.seq, reverse=True)
    return {
        "thread_id": thread_id,
        "verdict": verdict,
        "head": head,
        "entries": len(entries),
        "lease": "never held"
        if lease is None
        else _lease(lease.owner, lease.fence, lease.expires_at, now),
        "run": None
        if run is None
        else {
            "state": run.state,
            "graph": run.graph or "",
            "owner": run.owner,
            "attempts": run.attempts,
            "error": run.error or "",
            "started": when(run.started_at),
            "updated": when(run.updated_at),
        },
        "unchecked": unchecked,
        "total": len(checkpoints),
        "shown": len(newest[:CHECKPOINTS_SHOWN]),
        "checkpoints": [
            {
                "seq": c.seq,
                "ns": c.checkpoint_ns,
                "id": c.checkpoint_id,
                "parent": c.parent_checkpoint_id or "",
                "type": c.type,
                "bytes": len(c.checkpoint),
                "writes": writes_of.get((c.checkpoint_ns, c.checkpoint_id), 0),
                "check": "not checked"
                if unchecked
                else ("does not match" if (c.checkpoint_ns, c.checkpoint_id) in bad else "matches"),
            }
            for c in newest[:CHECKPOINTS_SHOWN]
        ],
    }
