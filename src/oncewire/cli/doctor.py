"""``oncewire doctor``: check a store and say what to fix."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import click

from oncewire.cli.common import db_option, emit, json_option
from oncewire.core.errors import OncewireError
from oncewire.storage import open_store
from oncewire.storage.base import Store
from oncewire.storage.records import EffectState

__all__ = ["Check", "command", "diagnose"]

SKEW_WARN_SECONDS = 1.0
SKEW_FAIL_SECONDS = 5.0


@dataclass
class Check:
    name: str
    status: str  # ok, warn, fail
    detail: str
    fix: str = ""


def _latest_schema(dialect: str) -> int:
    if dialect == "postgresql":
        from oncewire.storage.postgres.connection import migrations
    else:
        from oncewire.storage.sqlite.connection import migrations
    return migrations()[-1][0]


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


def diagnose(url: str, now: float | None = None) -> list[Check]:
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
        now = time.time() if now is None else now
        counts = store.count_effects()
        checks.append(
            Check(
                "effects",
                "ok",
                ", ".join(f"{state}={counts[state]}" for state in EffectState if counts[state])
                or "no effects",
            )
        )
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
        if counts[EffectState.DEAD]:
            checks.append(
                Check(
                    "dead",
                    "warn",
                    f"{counts[EffectState.DEAD]} dead effect(s)",
                    "inspect: oncewire effects list --state dead; then retry or leave them",
                )
            )
    finally:
        store.close()
    return checks


@click.command("doctor")
@db_option
@json_option
def command(db: str, as_json: bool) -> None:
    """Check the store: reachable, schema current, durable settings, clock skew, stuck work."""
    checks = diagnose(db)
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
