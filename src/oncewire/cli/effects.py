"""``oncewire effects``: the outbox.

``list`` shows the newest effects first, a page at a time: ``--limit`` effects, then a closing
line ``showing N of M`` and, when there are more, the ``--after ID`` that continues with the next
(older) page. The cursor is the id of the last effect printed, so a page never repeats or skips an
effect when new ones arrive meanwhile (they are newer, and on the first page).
"""

from __future__ import annotations

from typing import Any

import click

from oncewire.cli.common import (
    adopt_option,
    db_option,
    emit,
    json_option,
    json_text,
    open_reader,
    read_json_argument,
    read_only_option,
    stamped,
    table,
    when,
    yes_option,
)
from oncewire.effects import EffectState
from oncewire.effects.outbox import check_accept
from oncewire.ledger import Ledger

__all__ = ["group"]

DEFAULT_LIMIT = 50


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
    default=DEFAULT_LIMIT,
    show_default=True,
    help="Show at most this many.",
)
@click.option(
    "--after",
    "after_id",
    type=click.IntRange(1),
    metavar="ID",
    help="Continue after the effect with this id (the last one a page printed): older ones.",
)
@json_option
@read_only_option
def list_effects(
    db: str,
    state: tuple[str, ...],
    kind: str | None,
    limit: int,
    after_id: int | None,
    as_json: bool,
    read_only: bool,
) -> None:
    """List effects, newest first, a page at a time (see --after)."""
    with Ledger(open_reader(db, read_only)) as ledger:
        # One more than the page, only to know whether a next page exists.
        effects = ledger.effects.list(
            list(state) or None, kind=kind, limit=limit + 1, newest_first=True, before_id=after_id
        )
        more, effects = len(effects) > limit, effects[:limit]
        if as_json:
            emit([stamped(e.as_dict()) for e in effects])
            return
        counts = ledger.effects.counts(kind=kind)
    total = sum(n for s, n in counts.items() if not state or s.value in state)
    table(
        [
            "id",
            "key",
            "kind",
            "state",
            "attempts",
            "recoveries",
            "created",
            "updated",
            "last_error",
        ],
        [
            (
                e.id,
                e.key,
                e.kind,
                e.state,
                f"{e.attempts}/{e.max_attempts}",
                e.recoveries,
                when(e.created_at),
                when(e.updated_at),
                e.last_error,
            )
            for e in effects
        ],
    )
    closing = f"showing {len(effects)} of {total}"
    if after_id is not None:
        closing += f" after id {after_id}"
    if more:
        closing += f" (next page: --after {effects[-1].id})"
    click.echo(closing)


def _show_text(data: dict[str, Any], attempts: list[dict[str, Any]]) -> None:
    for name, value in data.items():
        if name in ("payload", "result"):
            if data.get(f"{name}_error"):
                continue  # its error line says why there is nothing to print
            text = "" if value is None and name == "result" else json_text(value)
        elif value is None:
            text = ""
        elif isinstance(value, bool):
            text = "yes" if value else "no"
        else:
            text = str(value)
        click.echo(f"{name:>16}: {text}")
    click.echo("")
    if not attempts:
        click.echo("no attempts recorded")
        return
    table(
        ["attempt", "fence", "redelivery", "outcome", "state", "ms", "started", "error"],
        [
            (
                a["attempt"],
                a["fence"],
                "yes" if a["redelivery"] else "",
                a["outcome"],
                a["state"],
                "" if a["duration_ms"] is None else f"{a['duration_ms']:.0f}",
                a["started_at"],
                a["error"],
            )
            for a in attempts
        ],
    )


@group.command("show")
@db_option
@click.argument("key")
@json_option
@read_only_option
def show(db: str, key: str, as_json: bool, read_only: bool) -> None:
    """Show one effect in full, with its attempt history."""
    with Ledger(open_reader(db, read_only)) as ledger:
        effect = ledger.effects.get(key)
        history = ledger.effects.attempts(key)
    data = stamped(effect.as_dict())
    attempts = [stamped(a.as_dict()) for a in history]
    if as_json:
        # Nested, as `runs show` is: the effect's own "attempts" is its attempt count.
        emit({"effect": data, "attempts": attempts})
        return
    _show_text(data, attempts)


@group.command("accept")
@db_option
@click.argument("key")
@click.argument("kind")
@click.argument("payload", metavar="PAYLOAD")
@click.option("--max-attempts", type=click.IntRange(1), default=10, show_default=True)
@click.option(
    "--delay",
    "delay_seconds",
    type=click.FloatRange(0),
    default=0.0,
    help="Seconds before the first attempt (at most 366 days).",
)
@click.option(
    "--deadline",
    "deadline_seconds",
    type=click.FloatRange(0),
    help="Seconds from now (at most 366 days).",
)
@adopt_option
@json_option
def accept(
    db: str,
    key: str,
    kind: str,
    payload: str,
    max_attempts: int,
    delay_seconds: float,
    deadline_seconds: float | None,
    adopt: bool,
    as_json: bool,
) -> None:
    """Accept an effect: KEY KIND PAYLOAD, where PAYLOAD is JSON text, @file.json or - (stdin).

    The same key and payload again is a no-op. A bad key, kind or payload (a JSON object that
    names a key twice, too large) is refused before anything is opened. A new path becomes a
    store; a database holding other tables only with --adopt.
    """
    value = read_json_argument(payload)
    check_accept(
        key,
        kind,
        value,
        max_attempts=max_attempts,
        delay_seconds=delay_seconds,
        deadline_seconds=deadline_seconds,
    )
    with Ledger(db, adopt=adopt) as ledger:
        effect = ledger.accept(
            key,
            kind,
            value,
            max_attempts=max_attempts,
            delay_seconds=delay_seconds,
            deadline_seconds=deadline_seconds,
        )
    if as_json:
        emit(stamped(effect.as_dict()))
    else:
        click.echo(f"{effect.key}: {effect.state}")


@group.command("cancel")
@db_option
@click.argument("key")
@click.option("--reason", default="cancelled by operator", show_default=True)
@yes_option
def cancel(db: str, key: str, reason: str, yes: bool) -> None:
    """Cancel a non-terminal effect (an attempt in flight may still land)."""
    with Ledger(db, create=False) as ledger:
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
    with Ledger(db, create=False) as ledger:
        effect = ledger.effects.get(key)
        if not yes:
            click.confirm(f"Retry {effect.key} ({effect.state}: {effect.last_error})?", abort=True)
        effect = ledger.effects.retry(key)
    click.echo(f"{effect.key}: {effect.state}")
