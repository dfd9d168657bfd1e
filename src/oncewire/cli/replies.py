"""``oncewire inbound`` and ``oncewire replies``: chat messages admitted and replies delivered."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click

from oncewire.cli.common import (
    db_option,
    emit,
    json_option,
    open_reader,
    read_only_option,
    stamped,
    table,
)
from oncewire.ledger import Ledger
from oncewire.storage.replies import InboundState, ReplyState

__all__ = ["inbound_group", "replies_group"]


@contextmanager
def _ledger(db: str, read_only: bool) -> Iterator[Ledger]:
    with Ledger(open_reader(db, read_only)) as ledger:
        yield ledger


@click.group("inbound")
def inbound_group() -> None:
    """Inbound chat messages, admitted once: list, show."""


@inbound_group.command("list")
@db_option
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([s.value for s in InboundState]),
    help="Only these statuses (repeatable).",
)
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.option("--after", "after_id", type=click.IntRange(0), default=0, help="Start after this id.")
@json_option
@read_only_option
def list_inbound(
    db: str, statuses: tuple[str, ...], limit: int, after_id: int, as_json: bool, read_only: bool
) -> None:
    """List inbound messages by id."""
    with _ledger(db, read_only) as ledger:
        rows = ledger.inbound.list(list(statuses) or None, limit=limit, after_id=after_id)
    if as_json:
        emit([row.as_dict() for row in rows])
        return
    table(
        ["id", "platform", "chat", "thread", "message", "status", "deliveries", "starts"],
        [
            (
                r.id,
                r.platform,
                r.chat,
                r.thread,
                r.platform_message_id,
                r.status,
                r.deliveries,
                r.attempts,
            )
            for r in rows
        ],
    )


@inbound_group.command("show")
@db_option
@click.argument("inbound_id", type=int)
@json_option
@read_only_option
def show_inbound(db: str, inbound_id: int, as_json: bool, read_only: bool) -> None:
    """Show one inbound message and its reply."""
    with _ledger(db, read_only) as ledger:
        data = ledger.inbound.get(inbound_id).as_dict()
        reply = ledger.replies.for_inbound(inbound_id)
        data["reply"] = None if reply is None else reply.id
    if as_json:
        emit(data)
        return
    for name, value in data.items():
        click.echo(f"{name:>20}: {value}")


@click.group("replies")
def replies_group() -> None:
    """Reply records and their wire operations: list, show, counts."""


@replies_group.command("list")
@db_option
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in ReplyState]),
    help="Only these states (repeatable).",
)
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.option("--after", "after_id", type=click.IntRange(0), default=0, help="Start after this id.")
@json_option
@read_only_option
def list_replies(
    db: str, states: tuple[str, ...], limit: int, after_id: int, as_json: bool, read_only: bool
) -> None:
    """List replies by id."""
    with _ledger(db, read_only) as ledger:
        rows = ledger.replies.list(list(states) or None, limit=limit, after_id=after_id)
    if as_json:
        emit([stamped(row.as_dict()) for row in rows])
        return
    table(
        ["id", "inbound", "platform", "chat", "state", "chunks", "marked", "attempts", "error"],
        [
            (
                r.id,
                r.inbound_id,
                r.request.platform,
                r.request.chat,
                r.state,
                len(r.plan),
                "yes" if r.marked else "",
                r.attempts,
                r.last_error,
            )
            for r in rows
        ],
    )


@replies_group.command("show")
@db_option
@click.argument("reply_id", type=int)
@json_option
@read_only_option
def show_reply(db: str, reply_id: int, as_json: bool, read_only: bool) -> None:
    """Show one reply with every wire operation it owns."""
    with _ledger(db, read_only) as ledger:
        reply = ledger.replies.get(reply_id)
        data = stamped(reply.as_dict())
        ops = [op.as_dict() for op in ledger.replies.ops(reply_id)]
    if as_json:
        emit({**data, "ops": ops})
        return
    for name, value in data.items():
        if name != "final_text":
            click.echo(f"{name:>14}: {value}")
    table(
        ["seq", "slot", "kind", "state", "marked", "message", "error"],
        [
            (
                o["seq"],
                o["slot"],
                o["kind"],
                o["state"],
                "yes" if o["marked"] else "",
                o["message_id"],
                o["error"],
            )
            for o in ops
        ],
    )


@replies_group.command("counts")
@db_option
@json_option
@read_only_option
def counts(db: str, as_json: bool, read_only: bool) -> None:
    """Replies by state."""
    with _ledger(db, read_only) as ledger:
        found = {str(state): n for state, n in ledger.replies.counts().items()}
    if as_json:
        emit(found)
        return
    table(["state", "replies"], sorted(found.items()))
