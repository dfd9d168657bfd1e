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
- with ``--deep``, every run's hash chain and every LangGraph thread's checkpoint chain (a
  keyed store needs ``ONCEWIRE_RUNS_KEY``).

A store writers refuse (SQLite reports it corrupt, or it is read-only) is opened read-only, so
that the checks that can still run do; a check whose rows cannot be read fails with the error
instead of ending the command; when even the schema cannot be read, the integrity check runs on
the file alone. Each open failure's fix names its cause.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import click

from oncewire.cli.common import db_option, emit, json_option, read_only_option, when
from oncewire.core.errors import OncewireError, StoreUnusable
from oncewire.runs.keys import KEY_ENV
from oncewire.storage import Store, file_integrity, latest_schema_version, open_store
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


def _write_check(store: Store, refused: StoreUnusable | None) -> Check | None:
    """The write check of a store doctor opened read-only (None: it probes writes itself)."""
    if not store.read_only:
        return None
    if refused is None:
        return Check("write", "warn", "not probed: opened with --read-only (nothing is written)")
    if refused.fields.get("reason") == "corrupt":
        return Check(
            "write",
            "fail",
            "oncewire will not write into it: it fails PRAGMA quick_check (see integrity)",
            "restore from a backup (or .recover the SQLite file); writers refuse it until then",
        )
    cause = refused.fields.get("cause") or str(refused)
    return Check(
        "write",
        "fail",
        f"writes are refused: {cause}",
        "remount the file system read-write, or give this user write access to the file and "
        "its directory (or work on a copy in a writable place); until then readers and doctor "
        "open it read-only",
    )


def _storage_checks(store: Store, refused: StoreUnusable | None = None) -> list[Check]:
    found = store.inspect()
    checks = []
    write = _write_check(store, refused)
    if write is not None:
        checks.append(write)
    elif found.write is WriteProbe.OK:
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


def _langgraph_threads(store: Store, runs_key: bytes | None) -> Check:
    """Every LangGraph thread's checkpoint chain, verified whole (no LangGraph needed)."""
    from oncewire.langgraph.chain import verify_thread

    threads = store.lg_thread_ids()
    try:
        verdicts = [verify_thread(store, thread_id, runs_key) for thread_id in threads]
    except OncewireError as exc:  # a key that does not fit a thread's chain: nothing judged
        return Check(
            "langgraph",
            "fail",
            f"not verified: {exc}",
            f"set {KEY_ENV} (or --key-env NAME) to the key the threads were written with",
        )
    bad = [v for v in verdicts if not v.ok]
    if not bad:
        return Check("langgraph", "ok", f"{len(verdicts)} LangGraph thread(s) verified")
    detail = f"{len(bad)} of {len(verdicts)} LangGraph thread(s) fail verification: " + _listed(
        [f"{v.thread_id} ({v.reason})" for v in bad]
    )
    return Check(
        "langgraph",
        "fail",
        detail,
        "the saver refuses to read these threads; restore them from a backup or delete them",
    )


_OPEN_FIXES = {
    "corrupt": "restore from a backup (or .recover the SQLite file): SQLite cannot read it",
    "not_a_database": "--db names a file that is not a SQLite database: check the path",
    "read_only": "remount the file system read-write or give this user write access; "
    "--read-only reads it as it is",
    "cannot_open": "check --db, and that this user may read the file and its directory",
}
_OPEN_FIX = "check --db / ONCEWIRE_DB and that it exists"


def _open_failed(url: str, exc: OncewireError) -> list[Check]:
    reason = exc.fields.get("reason")
    checks = [Check("open", "fail", str(exc), _OPEN_FIXES.get(str(reason), _OPEN_FIX))]
    if reason == "corrupt" and not url.startswith(("postgresql://", "postgres://")):
        check, problems = file_integrity(url)
        if problems:
            checks.append(
                Check(
                    "integrity",
                    "fail",
                    f"{check}: {_listed(list(problems))}",
                    "restore from a backup (or .recover the SQLite file) before writing to it",
                )
            )
    return checks


def _open(url: str, read_only: bool) -> tuple[Store | None, StoreUnusable | None, list[Check]]:
    """The store (None: it cannot be opened), why a writer may not open it, and the checks
    that say so. A store writers refuse (corrupt, read-only) is opened read-only instead, so
    that every check that can still run does."""
    try:
        return open_store(url, create=False, read_only=read_only), None, []
    except StoreUnusable as exc:
        if read_only or exc.fields.get("reason") not in ("corrupt", "read_only"):
            return None, None, _open_failed(url, exc)
        refused = exc
    except OncewireError as exc:
        return None, None, _open_failed(url, exc)
    try:
        return open_store(url, create=False, read_only=True), refused, []
    except OncewireError:
        return None, None, _open_failed(url, refused)


def _section(checks: list[Check], name: str, run: Callable[[], list[Check]]) -> None:
    """The checks ``run`` makes, or one failing check when the store could not answer."""
    try:
        checks.extend(run())
    except OncewireError as exc:
        checks.append(
            Check(name, "fail", f"could not be read: {exc}", "see the checks above (integrity)")
        )


def diagnose(
    url: str,
    now: float | None = None,
    *,
    sinks: Mapping[str, Any] | None = None,
    deep: bool = False,
    runs_key: bytes | None = None,
    read_only: bool = False,
) -> list[Check]:
    checks: list[Check] = []
    store, refused, failed = _open(url, read_only)
    if store is None:
        return failed
    try:
        health = store.health()
        where = health.get("path") or f"{health.get('database')} ({health.get('schema')})"
        version = health.get("sqlite_version") or health.get("server_version")
        opened = f"{health['backend']} {version} at {where}"
        if store.read_only:
            opened += ", read-only" + (" (a snapshot)" if store.snapshot else "")
        checks.append(Check("open", "ok", opened))
        latest = latest_schema_version(store.dialect)
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
        _section(checks, "integrity", lambda: _storage_checks(store, refused))
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
        moment = time.time() if now is None else now
        _section(checks, "effects", lambda: _effect_checks(store, moment, sinks))
        if deep:
            _section(checks, "runs", lambda: [_runs(store, runs_key)])
            _section(checks, "langgraph", lambda: [_langgraph_threads(store, runs_key)])
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
@click.option(
    "--deep",
    is_flag=True,
    help="Also verify every run's and every LangGraph thread's hash chain (reads them all).",
)
@click.option(
    "--key-env",
    default=KEY_ENV,
    show_default=True,
    metavar="NAME",
    help="Environment variable holding the runs chain's HMAC key, for --deep (unset: no key).",
)
@read_only_option
@json_option
def command(
    db: str, app: str | None, deep: bool, key_env: str, read_only: bool, as_json: bool
) -> None:
    """Check the store: access, integrity, schema, settings, clock skew and work that waits.

    A store that writers refuse (corrupt, read-only) is opened read-only, so that every check
    that can still run does; --read-only opens any store so (writes are then not probed).
    """
    from oncewire.cli.dispatch import load_sinks

    sinks = load_sinks(app) if app else None  # a bad --app is one error line, as in dispatch
    key = os.environ.get(key_env)
    checks = diagnose(
        db,
        sinks=sinks,
        deep=deep,
        runs_key=key.encode() if key else None,
        read_only=read_only,
    )
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
