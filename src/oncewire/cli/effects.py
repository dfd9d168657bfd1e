"""``oncewire effects``: the outbox."""

from __future__ import annotations

import datetime as dt

import click

from oncewire.cli.common import db_option, emit, json_option, table, yes_option
from oncewire.core.canonical import loads
from oncewire.effects import EffectState, Ledger

__all__ = ["group"]


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


@click.group("effects")
def group() -> None:
    """Accepted intents: list, show, accept, cancel, retry."""


@group.command("list")
@db_option
@click.option(
    "--state",
    type=click.Choice([s.value for s in EffectState]),
    multiple=True,
    help="Only effects in this state (repeatable).",
)
@click.option("--kind", help="Only effects of this kind.")
@click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=100,
    show_default=True,
    help="Show at most this many.",
)
@json_option
def list_effects(
    db: str, state: tuple[str, ...], kind: str | None, limit: int, as_json: bool
) -> None:
    """List effects, oldest first."""
    ledger = Ledger(db, create=False)
    effects = ledger.effects.list(list(state) or None, kind=kind, limit=limit)
    if as_json:
        emit([e.as_dict() for e in effects])
        return
    table(
        ["key", "kind", "state", "attempts", "updated", "last_error"],
        [
            (
                e.key,
                e.kind,
                e.state,
                f"{e.attempts}/{e.max_attempts}",
                _when(e.updated_at),
                e.last_error,
            )
            for e in effects
        ],
    )


@group.command("show")
@db_option
@click.argument("key")
@json_option
def show(db: str, key: str, as_json: bool) -> None:
    """Show one effect in full."""
    effect = Ledger(db, create=False).effects.get(key)
    data = effect.as_dict()
    if as_json:
        emit(data)
        return
    for name, value in data.items():
        if name in ("not_before", "deadline", "lease_expires_at", "created_at", "updated_at"):
            value = _when(value)
        click.echo(f"{name:>16}: {value}")


@group.command("accept")
@db_option
@click.argument("key")
@click.argument("kind")
@click.argument("payload")
@click.option("--max-attempts", type=click.IntRange(1), default=10, show_default=True)
@click.option("--delay", "delay_seconds", type=click.FloatRange(0), default=0.0, help="Seconds.")
@click.option("--deadline", "deadline_seconds", type=click.FloatRange(0), help="Seconds from now.")
@json_option
def accept(
    db: str,
    key: str,
    kind: str,
    payload: str,
    max_attempts: int,
    delay_seconds: float,
    deadline_seconds: float | None,
    as_json: bool,
) -> None:
    """Accept an effect: KEY KIND PAYLOAD_JSON (the same key and payload again is a no-op)."""
    value = loads(payload)  # refuses malformed JSON and NaN before anything is opened
    effect = Ledger(db).accept(
        key,
        kind,
        value,
        max_attempts=max_attempts,
        delay_seconds=delay_seconds,
        deadline_seconds=deadline_seconds,
    )
    if as_json:
        emit(effect.as_dict())
    else:
        click.echo(f"{effect.key}: {effect.state}")


@group.command("cancel")
@db_option
@click.argument("key")
@click.option("--reason", default="cancelled by operator", show_default=True)
@yes_option
def cancel(db: str, key: str, reason: str, yes: bool) -> None:
    """Cancel a non-terminal effect (an attempt in flight may still land)."""
    ledger = Ledger(db, create=False)
    effect = ledger.effects.get(key)
    if not yes:
        click.confirm(f"Cancel {effect.key} ({effect.state})?", abort=True)
    effect = ledger.effects.cancel(key, reason)
    click.echo(f"{effect.key}: {effect.state}")


@group.command("retry")
@db_option
@click.argument("key")
@yes_option
def retry(db: str, key: str, yes: bool) -> None:
    """Send a dead, rejected or cancelled effect back to pending with fresh attempts."""
    ledger = Ledger(db, create=False)
    effect = ledger.effects.get(key)
    if not yes:
        click.confirm(f"Retry {effect.key} ({effect.state}: {effect.last_error})?", abort=True)
    effect = ledger.effects.retry(key)
    click.echo(f"{effect.key}: {effect.state}")
