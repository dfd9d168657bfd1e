"""Which key chains a run, and what a ledger opened with some key may say about it.

A run records its chain's algorithm (``chain``: ``sha256`` or ``hmac-sha256``) and, when keyed,
the key's fingerprint (``key_id``: an HMAC of a fixed label under the key, never the key). A
ledger whose key does not fit a run's history has nothing truthful to say about it: that is a
:class:`ConfigurationError` naming ``ONCEWIRE_RUNS_KEY``, raised before any verdict, never a
``failed / safety_boundary`` verdict (which would call a healthy run tampered).

A keyless store gains a key for new runs only. ``runs.adopt_key()`` (``oncewire runs
adopt-key``) pins each keyless run at its head, the pin MACed with the key, once the keyless
runs are all finished or released; a ledger opened with that key then verifies those runs with
the keyless algorithm and checks their pins, so nobody without the key can add a keyless run or
re-hash one.
"""

from __future__ import annotations

import hmac

from oncewire.core.errors import ConfigurationError, TransitionRefused
from oncewire.storage import RunStore
from oncewire.storage.runs import KeyPinRow, RunRow

__all__ = ["KEY_ENV", "adopt_key", "chain_key", "key_id", "pin_mac", "pin_problem"]

KEY_ENV = "ONCEWIRE_RUNS_KEY"
_KEY_ID_LABEL = b"oncewire.runs/key-id/1"
_PIN_LABEL = "oncewire.runs/key-pin/1"


def key_id(key: bytes | None) -> str | None:
    """The key's fingerprint: an HMAC of a fixed label (the key cannot be recovered from it)."""
    if not key:
        return None
    return hmac.digest(key, _KEY_ID_LABEL, "sha256").hex()[:32]


def pin_mac(key: bytes, run_id: str, head_seq: int, head_hash: str) -> str:
    material = f"{_PIN_LABEL}\x1f{run_id}\x1f{head_seq}\x1f{head_hash}".encode()
    return hmac.digest(key, material, "sha256").hex()


def chain_key(row: RunRow, key: bytes | None, pin: KeyPinRow | None) -> bytes | None:
    """The key to verify ``row``'s chain with (None: the keyless algorithm).

    Raises :class:`ConfigurationError` when this ledger's key does not fit the run: a keyed run
    read without a key or with another key, a keyless run read with a key that was not adopted
    over it.
    """
    mine = key_id(key)
    if row.chain == "hmac-sha256":
        if not key:
            raise ConfigurationError(
                f"run {row.run_id!r} is chained with HMAC-SHA256"
                + (f" under key {row.key_id}" if row.key_id else "")
                + f": open the ledger with its key (runs_key=..., {KEY_ENV} for the CLI); "
                "nothing was judged",
                run_id=row.run_id,
                chain=row.chain,
                key_id=row.key_id,
                env=KEY_ENV,
            )
        if row.key_id is not None and row.key_id != mine:
            raise ConfigurationError(
                f"run {row.run_id!r} is chained under another key (key id {row.key_id}) than "
                f"this ledger's (key id {mine}): set {KEY_ENV} to the key it was written with; "
                "nothing was judged",
                run_id=row.run_id,
                chain=row.chain,
                key_id=row.key_id,
                env=KEY_ENV,
            )
        return key
    if row.chain == "sha256" and key:
        if pin is None:
            raise ConfigurationError(
                f"run {row.run_id!r} is chained without a key (sha256) but this ledger has one "
                f"({KEY_ENV}): verify it with {KEY_ENV} unset, or adopt the key over the "
                "store's keyless runs (oncewire runs adopt-key); nothing was judged",
                run_id=row.run_id,
                chain=row.chain,
                env=KEY_ENV,
            )
        if pin.key_id != mine:
            raise ConfigurationError(
                f"run {row.run_id!r} is keyless, pinned under another key (key id "
                f"{pin.key_id}) than this ledger's (key id {mine}): set {KEY_ENV} to that key; "
                "nothing was judged",
                run_id=row.run_id,
                chain=row.chain,
                key_id=pin.key_id,
                env=KEY_ENV,
            )
        return None
    return key if row.chain != "sha256" else None


def pin_problem(key: bytes, row: RunRow, pin: KeyPinRow) -> str | None:
    """Why a keyless run's pin does not hold (None when it does)."""
    if not hmac.compare_digest(pin.mac, pin_mac(key, pin.run_id, pin.head_seq, pin.head_hash)):
        return "its key pin does not verify under this ledger's key"
    if (row.head_seq, row.head_hash) != (pin.head_seq, pin.head_hash):
        return "its head is not the one pinned when the key was adopted"
    return None


def adopt_key(store: RunStore, key: bytes | None, *, now: float) -> list[str]:
    """Pin every keyless run of ``store`` under ``key``, in one transaction; returns the
    run ids pinned (none when there is nothing left to pin).

    Raises :class:`TransitionRefused` while a keyless run is still active (finish or
    reconcile it with the key unset first: a keyed ledger cannot extend a keyless chain) and
    :class:`ConfigurationError` without a key. Pinning writes no event and changes no
    history; a pinned run that failed verification keeps failing it.
    """
    if not key:
        raise ConfigurationError(f"adopting a key needs one: runs_key=..., or {KEY_ENV}")
    fingerprint = key_id(key)
    assert fingerprint is not None
    with store.transaction() as tx:
        rows = store.unpinned_keyless_runs_in_tx(tx)
        active = [row.run_id for row in rows if row.active]
        if active:
            raise TransitionRefused(
                f"keyless runs {active[:5]} are still active: finish or reconcile them with "
                f"{KEY_ENV} unset before adopting a key; nothing was pinned",
                run_ids=active,
            )
        store.insert_key_pins_in_tx(
            tx,
            [
                KeyPinRow(
                    row.run_id,
                    fingerprint,
                    row.head_seq,
                    row.head_hash,
                    pin_mac(key, row.run_id, row.head_seq, row.head_hash),
                    now,
                )
                for row in rows
            ],
        )
    return [row.run_id for row in rows]
