"""``oncewire receipts``: the receiver's records."""

from __future__ import annotations

import click

from oncewire.cli.common import (
    db_option,
    emit,
    json_option,
    json_text,
    open_reader,
    read_only_option,
    stamped,
    table,
    yes_option,
)
from oncewire.receipts import Receipts

__all__ = ["group"]


@click.group("receipts")
def group() -> None:
    """A receiver's receipts: list, show, purge."""


@group.command("list")
@db_option
@click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=100,
    show_default=True,
    help="Show at most this many.",
)
@click.option("--after", "after_key", default="", help="Start after this key (paging).")
@json_option
@read_only_option
def list_receipts(db: str, limit: int, after_key: str, as_json: bool, read_only: bool) -> None:
    """List receipts by key."""
    with Receipts(open_reader(db, read_only)) as store:
        receipts = store.list(limit=limit, after_key=after_key)
    if as_json:
        emit([stamped(r.as_dict()) for r in receipts])
        return
    table(
        ["key", "digest", "result"],
        [(r.key, r.digest[:12], r.result_json) for r in receipts],
    )


@group.command("show")
@db_option
@click.argument("key")
@json_option
@read_only_option
def show(db: str, key: str, as_json: bool, read_only: bool) -> None:
    """Show one receipt."""
    with Receipts(open_reader(db, read_only)) as receipts:
        data = stamped(receipts.get(key).as_dict())
    if as_json:
        emit(data)
        return
    for name, value in data.items():
        if name in ("payload", "result"):
            value = json_text(value)
        click.echo(f"{name:>10}: {'' if value is None else value}")


@group.command("purge")
@db_option
@yes_option
def purge(db: str, yes: bool) -> None:
    """Delete receipts whose retention window has ended (their keys become new work again)."""
    with Receipts(db, create=False) as receipts:
        if not yes:
            click.confirm("Delete every receipt past its retention window?", abort=True)
        click.echo(f"purged {receipts.purge()} receipt(s)")
