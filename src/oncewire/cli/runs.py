"""``oncewire runs``: the run ledger."""

from __future__ import annotations

import os

import click

from oncewire.cli.common import (
    db_option,
    emit,
    json_option,
    open_reader,
    read_only_option,
    stamped,
    table,
    when,
    yes_option,
)
from oncewire.ledger import Ledger
from oncewire.runs.keys import KEY_ENV

__all__ = ["group"]


def _when(ts: float | None) -> str:
    return when(ts) or ""  # ISO 8601 with the zone, as every command prints times


def key_option(fn: click.decorators.FC) -> click.decorators.FC:
    return click.option(
        "--key-env",
        default=KEY_ENV,
        show_default=True,
        metavar="NAME",
        help="Environment variable holding the chain's HMAC key (unset: no key).",
    )(fn)


def _open(db: str, key_env: str, read_only: bool | None = None) -> Ledger:
    """The run ledger; ``read_only`` not None: a reader's (see ``open_reader``)."""
    key = os.environ.get(key_env)
    runs_key = key.encode() if key else None
    if read_only is None:
        return Ledger(db, create=False, runs_key=runs_key)
    return Ledger(open_reader(db, read_only), runs_key=runs_key)


@click.group("runs")
def group() -> None:
    """Run ledgers: list, show, verify, reconcile, adopt-key, reports."""


@group.command("list")
@db_option
@click.option("--scope", help="Only runs of this scope.")
@click.option("--status", multiple=True, help="Only runs the store says are in this status.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@json_option
@key_option
@read_only_option
def list_runs(
    db: str,
    scope: str | None,
    status: tuple[str, ...],
    limit: int,
    as_json: bool,
    key_env: str,
    read_only: bool,
) -> None:
    """List runs as stored (run `verify` before relying on one)."""
    with _open(db, key_env, read_only) as ledger:
        rows = ledger.runs.list(scope=scope, status=list(status), limit=limit)
    if as_json:
        emit(
            [
                stamped(
                    {
                        "run_id": r.run_id,
                        "scope": r.scope,
                        "branch": r.branch,
                        "status": r.status,
                        "terminal_reason": r.terminal_reason,
                        "owner": r.owner,
                        "lease_expires_at": r.lease_expires_at,
                        "events": r.head_seq,
                        "abandoned": r.abandoned_at is not None,
                        "updated_at": r.updated_at,
                    }
                )
                for r in rows
            ]
        )
        return
    table(
        ["run", "scope", "branch", "status", "reason", "events", "owner", "updated"],
        [
            (
                r.run_id,
                r.scope,
                r.branch,
                r.status + (" (abandoned)" if r.abandoned_at is not None else ""),
                r.terminal_reason or r.abandon_reason,
                r.head_seq,
                r.owner,
                _when(r.updated_at),
            )
            for r in rows
        ],
    )


@group.command("show")
@db_option
@click.argument("run_id")
@json_option
@key_option
@read_only_option
def show(db: str, run_id: str, as_json: bool, key_env: str, read_only: bool) -> None:
    """Show one run, verified, with its events."""
    with _open(db, key_env, read_only) as ledger, ledger.runs.snapshot():  # one moment of the store
        run = ledger.runs.get(run_id)
        events = ledger.runs.events(run_id)
        verification = ledger.runs.verify(run_id)[0]
        phases = ledger.runs.phases(run_id)
    if as_json:
        emit(
            {
                "run": stamped(run.as_dict()),
                "verification": verification.as_dict(),
                "phases": [stamped(p) for p in phases],
                "events": [stamped(e.as_dict()) for e in events],
            }
        )
        return
    click.echo(
        f"run {run.run_id}: {run.status}"
        + (f" ({run.terminal_reason})" if run.terminal_reason else "")
    )
    if run.claimed_status is not None:
        click.echo(f"  the store claims {run.claimed_status}; its history failed verification")
    click.echo(f"  scope {run.scope}  branch {run.branch}  workflow {run.workflow}")
    click.echo(f"  owner {run.owner}  fence {run.fence}  lease until {_when(run.lease_expires_at)}")
    if run.abandoned_at is not None:
        click.echo(f"  abandoned {_when(run.abandoned_at)} ({run.abandon_reason})")
    mark = "ok" if verification.ok else f"FAILED at event {verification.first_bad_seq}"
    click.echo(
        f"  verification: {mark}" + (f": {verification.reason}" if verification.reason else "")
    )
    table(
        ["seq", "cursor", "type", "key", "at", "hash"],
        [(e.seq, e.cursor, e.type, e.key, _when(e.at), e.hash[:16]) for e in events],
    )


@group.command("verify")
@db_option
@click.argument("run_id", required=False)
@json_option
@key_option
@read_only_option
def verify(db: str, run_id: str | None, as_json: bool, key_env: str, read_only: bool) -> None:
    """Verify one run's history, or every run's; exit 1 naming the first bad event."""
    with _open(db, key_env, read_only) as ledger:
        results = ledger.runs.verify(run_id)
    bad = [r for r in results if not r.ok]
    if as_json:
        emit({"ok": not bad, "runs": [r.as_dict() for r in results]})
    else:
        for result in bad:
            click.echo(
                f"{result.run_id}: FAILED at event {result.first_bad_seq}: {result.reason} "
                f"(the store claims {result.claimed_status})"
            )
        click.echo(f"{len(results) - len(bad)} of {len(results)} run(s) verified")
    if bad and as_json:
        raise click.exceptions.Exit(1)
    if bad:
        first = bad[0]
        raise click.ClickException(
            f"run {first.run_id} failed verification at event {first.first_bad_seq}"
        )


@group.command("reconcile")
@db_option
@click.option("--owner", required=True, help="Who takes over the expired runs (recorded).")
@yes_option
@json_option
@key_option
def reconcile(db: str, owner: str, yes: bool, as_json: bool, key_env: str) -> None:
    """Close runs whose lease expired and settle orphaned deliveries (exit 1 if one failed)."""
    if not yes:
        click.confirm("Reconcile every run whose lease expired?", abort=True)
    with _open(db, key_env) as ledger:
        reports = ledger.runs.reconcile(owner=owner)
    if as_json:
        emit([stamped(r.as_dict()) for r in reports])
    else:
        table(
            ["subject", "id", "outcome", "status", "reason", "error"],
            [(r.subject, r.subject_id, r.outcome, r.status, r.reason, r.error) for r in reports],
        )
        click.echo(f"{len(reports)} reconciled")
    failed = [r for r in reports if r.error]
    if failed:
        raise click.ClickException(f"{len(failed)} could not be reconciled (see the reports)")


@group.command("adopt-key")
@db_option
@yes_option
@json_option
@key_option
def adopt_key(db: str, yes: bool, as_json: bool, key_env: str) -> None:
    """Give a keyless store the key: pin its keyless runs under it (new runs are keyed)."""
    if not os.environ.get(key_env):
        raise click.ClickException(f"set {key_env} to the key to adopt")
    if not yes:
        click.confirm("Pin every keyless run under this key?", abort=True)
    with _open(db, key_env) as ledger:
        pinned = ledger.runs.adopt_key()
    if as_json:
        emit({"pinned": pinned})
    else:
        click.echo(f"{len(pinned)} keyless run(s) pinned under the key")


@group.command("reports")
@db_option
@click.option("--subject", "subject_id", help="Only reports about this run or delivery.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@json_option
@read_only_option
def reports(db: str, subject_id: str | None, limit: int, as_json: bool, read_only: bool) -> None:
    """What reconciliation did to each run and delivery, newest first."""
    with Ledger(open_reader(db, read_only)) as ledger:
        rows = ledger.runs.reports(limit=limit, subject_id=subject_id)
    if as_json:
        emit(
            [
                stamped(
                    {
                        "pass_id": r.pass_id,
                        "subject": r.subject,
                        "subject_id": r.subject_id,
                        "run_id": r.run_id,
                        "owner": r.owner,
                        "outcome": r.outcome,
                        "status": r.status,
                        "reason": r.reason,
                        "error": r.error,
                        "created_at": r.created_at,
                    }
                )
                for r in rows
            ]
        )
        return
    table(
        ["when", "subject", "id", "outcome", "status", "reason", "owner", "error"],
        [
            (
                _when(r.created_at),
                r.subject,
                r.subject_id,
                r.outcome,
                r.status,
                r.reason,
                r.owner,
                r.error,
            )
            for r in rows
        ],
    )
