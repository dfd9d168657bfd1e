"""``oncewire doctor``: check a store and say what to fix.

Each check is ``ok``, ``warn`` or ``fail`` with a one-line fix; any ``fail`` makes the command
exit 1. The checks only read: the write probe begins a write transaction and rolls it back.

- open, schema version, write access, the backend's integrity check (``PRAGMA quick_check`` on
  SQLite, invalid indexes on PostgreSQL), and the schema's tables, indexes, triggers (and
  functions) against the packaged ``schema.sql``;
- durability settings (SQLite) and clock skew (PostgreSQL);
- work that waits: effects per kind that are pending or uncertain, with the oldest one's age.
  With ``--app`` (the sinks a dispatcher would load) a kind that no sink handles is named: its
  effects would wait forever without a word. Claims past their lease, dead and rejected effects;
- with ``--deep``, every run's hash chain (a keyed store needs ``ONCEWIRE_RUNS_KEY``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import click

from oncewire.cli.common import db_option, emit, json_option, when
from oncewire.core.errors import OncewireError
from oncewire.runs.keys import KEY_ENV
from oncewire.storage import Store, open_store
from oncewire.storage.inspection import WriteProbe
from oncewire.storage.records import EffectState

__all__ = ["Check", "command", "diagnose"]

SKEW_WARN_SECONDS = 1.0
SKEW_FAIL_SECONDS = 5.0
LISTED = 5  # names shown in one detail line before "and N more"


@dataclass
class Check:
    name: str
    status: str  # ok, warn, fail
    detail: str
    fix: str = ""


def _latest_schema(dialect: str) -> int:
    if dialect == "postgresql":
        from oncewire.storage.postgres.driver import migrations
    else:
        from oncewire.storage.sqlite.driver import migrations
    return migrations()[-1][0]


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:LISTED])
    return shown + (f" and {len(items) - LISTED} more" if len(items) > LISTED else "")


def age(seconds: float) -> str:
    """A duration as a person reads it: 45s, 12m 5s, 3h 20m, 2d 4h; ? from a time that is no
    date (NaN or infinite)."""
    if not -math.inf < seconds < math.inf:
        return "?"
    seconds = max(0, int(seconds))
    for unit, size, sub_unit, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} {seconds % size // sub_size}{sub_unit}"
    if seconds >= 60:
        return f"{seconds // 60}m {seconds % 60}s"
    return f"{seconds}s"


def _clock(store: Store, health: dict[str, Any]) -> Check | None:
    if health.get("server_time") is None:
        return None
    before = time.time()
    server = store.health()["server_time"]
    after = time.time()
    skew = float(server) - (before + after) / 2
    detail = f"server clock is {skew:+.3f}s from this host (round trip {after - before:.3f}s)"
    if abs(skew) >= SKEW_FAIL_SECONDS:
        return Check("clock", "fail", detail, "sync this host's clock (NTP): leases compare times")
    if abs(skew) >= SKEW_WARN_SECONDS:
        return Check("clock", "warn", detail, "sync clocks (NTP); keep skew well under a lease")
    return Check("clock", "ok", detail)


def _storage_checks(store: Store) -> list[Check]:
    found = store.inspect()
    checks = []
    if found.write is WriteProbe.OK:
        checks.append(Check("write", "ok", "a write transaction began and was rolled back"))
    elif found.write is WriteProbe.BUSY:
        checks.append(
            Check(
                "write",
                "warn",
                f"could not tell: {found.write_error}",
                "another writer held the lock throughout; run doctor again",
            )
        )
    else:
        checks.append(
            Check(
                "write",
                "fail",
                f"writes are refused: {found.write_error}",
                "give this user write access to the database (file, directory or role); "
                "accept and dispatch cannot record anything",
            )
        )
    if found.integrity is not None:
        checks.append(
            Check("integrity", "ok", f"{found.integrity_check}: ok")
            if not found.integrity
            else Check(
                "integrity",
                "fail",
                f"{found.integrity_check}: {_listed(list(found.integrity))}",
                "restore from a backup (or .recover the SQLite file) before writing to it",
            )
        )
    missing = [d for d in found.differences if d.problem != "extra"]
    extra = [d for d in found.differences if d.problem == "extra"]
    if missing:
        checks.append(
            Check(
                "objects",
                "fail",
                _listed([d.describe() for d in missing]),
                "something changed oncewire's schema: recreate these objects from oncewire's "
                f"{store.dialect} schema.sql (or restore a backup); the database no longer "
                "holds every invariant oncewire relies on",
            )
        )
    if extra:
        checks.append(
            Check(
                "extra objects",
                "warn",
                _listed([d.describe() for d in extra]),
                "objects oncewire does not create, on its tables: drop them unless you know "
                "what they do",
            )
        )
    if not found.differences:
        checks.append(
            Check("objects", "ok", f"{found.objects} tables, indexes and triggers as schema.sql")
        )
    return checks


def _waiting(store: Store, now: float, sinks: Mapping[str, Any] | None) -> Check:
    waiting = store.waiting_kinds()
    if not waiting:
        return Check("waiting", "ok", "no effect is pending or uncertain")
    parts = [
        f"{kind}={count} (oldest {age(now - oldest)}, since {when(oldest)})"
        for kind, (count, oldest) in sorted(waiting.items())
    ]
    detail = "pending or uncertain: " + _listed(parts)
    if sinks is None:
        return Check(
            "waiting",
            "ok",
            detail + "; without --app doctor cannot tell which kinds have a sink (give it the "
            "dispatcher's --app module:attribute to check)",
        )
    orphans = sorted(kind for kind in waiting if kind not in sinks)
    if orphans:
        return Check(
            "waiting",
            "warn",
            f"no sink for {_listed(orphans)} in --app; "
            + _listed([f"{kind}={waiting[kind][0]}" for kind in orphans])
            + " effect(s) will wait until one is added",
            "add a sink for each of these kinds to the dispatcher's app, or cancel the effects "
            "(oncewire effects cancel KEY)",
        )
    return Check("waiting", "ok", detail + "; every kind has a sink in --app")


def _effect_checks(store: Store, now: float, sinks: Mapping[str, Any] | None) -> list[Check]:
    counts = store.count_effects()
    checks = [
        Check(
            "effects",
            "ok",
            ", ".join(f"{state}={counts[state]}" for state in EffectState if counts[state])
            or "no effects",
        ),
        _waiting(store, now, sinks),
    ]
    stale = [
        e
        for e in store.list_effects(states=[EffectState.CLAIMED], limit=10_000)
        if e.lease_expires_at is not None and e.lease_expires_at < now
    ]
    if stale:
        checks.append(
            Check(
                "leases",
                "warn",
                f"{len(stale)} claim(s) past their lease (oldest {stale[0].key!r})",
                "start a dispatcher (oncewire dispatch): it releases them as uncertain",
            )
        )
    for state, what in ((EffectState.DEAD, "dead"), (EffectState.REJECTED, "rejected")):
        if counts[state]:
            checks.append(
                Check(
                    what,
                    "warn",
                    f"{counts[state]} {what} effect(s)",
                    f"inspect: oncewire effects list --state {what}; then retry or leave them",
                )
            )
    return checks


def _runs(store: Store, runs_key: bytes | None) -> Check:
    from oncewire.ledger import Ledger

    try:
        results = Ledger(store, runs_key=runs_key).runs.verify()
    except OncewireError as exc:  # a key that does not fit the store's chains: nothing judged
        return Check(
            "runs",
            "fail",
            f"not verified: {exc}",
            f"set {KEY_ENV} (or --key-env NAME) to the key the runs were written with",
        )
    bad = [r for r in results if not r.ok]
    if not bad:
        return Check("runs", "ok", f"{len(results)} run history(ies) verified")
    detail = f"{len(bad)} of {len(results)} run(s) fail verification: " + _listed(
        [f"{r.run_id} at event {r.first_bad_seq} ({r.reason})" for r in bad]
    )
    fix = "inspect with oncewire runs show RUN_ID; a failed history is never rewritten"
    if runs_key is None:
        fix = f"if this store's chains are keyed, set {KEY_ENV} and run again; otherwise {fix}"
    return Check("runs", "fail", detail, fix)


def diagnose(
    url: str,
    now: float | None = None,
    *,
    sinks: Mapping[str, Any] | None = None,
    deep: bool = False,
    runs_key: bytes | None = None,
) -> list[Check]:
    checks: list[Check] = []
    try:
        store = open_store(url, create=False)
    except OncewireError as exc:
        return [Check("open", "fail", str(exc), "check --db / ONCEWIRE_DB and that it exists")]
    try:
        health = store.health()
        where = health.get("path") or f"{health.get('database')} ({health.get('schema')})"
        version = health.get("sqlite_version") or health.get("server_version")
        checks.append(Check("open", "ok", f"{health['backend']} {version} at {where}"))
        latest = _latest_schema(store.dialect)
        current = int(health["schema_version"])
        checks.append(
            Check("schema", "ok", f"schema version {current}")
            if current == latest
            else Check(
                "schema",
                "fail",
                f"schema version {current}, this oncewire expects {latest}",
                "upgrade oncewire" if current > latest else "open it once with oncewire",
            )
        )
        checks.extend(_storage_checks(store))
        if store.dialect == "sqlite":
            journal, sync = health["journal_mode"], health["synchronous"]
            checks.append(
                Check("durability", "ok", f"journal_mode={journal}, synchronous={sync}")
                if journal == "wal" and sync in ("FULL", "EXTRA")
                else Check(
                    "durability",
                    "warn",
                    f"journal_mode={journal}, synchronous={sync}",
                    "oncewire opens with WAL and synchronous=FULL; check other writers",
                )
            )
        clock = _clock(store, health)
        if clock:
            checks.append(clock)
        checks.extend(_effect_checks(store, time.time() if now is None else now, sinks))
        if deep:
            checks.append(_runs(store, runs_key))
    finally:
        store.close()
    return checks


@click.command("doctor")
@db_option
@click.option(
    "--app",
    envvar="ONCEWIRE_APP",
    show_envvar=True,
    metavar="MODULE:ATTRIBUTE",
    help="The dispatcher's sinks (as `oncewire dispatch --app`): name waiting kinds none handles.",
)
@click.option("--deep", is_flag=True, help="Also verify every run's hash chain (reads them all).")
@click.option(
    "--key-env",
    default=KEY_ENV,
    show_default=True,
    metavar="NAME",
    help="Environment variable holding the runs chain's HMAC key, for --deep (unset: no key).",
)
@json_option
def command(db: str, app: str | None, deep: bool, key_env: str, as_json: bool) -> None:
    """Check the store: access, integrity, schema, settings, clock skew and work that waits."""
    from oncewire.cli.dispatch import load_sinks

    sinks = load_sinks(app) if app else None  # a bad --app is one error line, as in dispatch
    key = os.environ.get(key_env)
    checks = diagnose(db, sinks=sinks, deep=deep, runs_key=key.encode() if key else None)
    if as_json:
        emit([asdict(c) for c in checks])
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
        for check in checks:
            click.echo(f"[{marks[check.status]}] {check.name}: {check.detail}")
            if check.fix:
                click.echo(f"       fix: {check.fix}")
    if any(c.status == "fail" for c in checks):
        raise click.exceptions.Exit(1)
