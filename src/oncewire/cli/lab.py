"""``oncewire lab``: the crash lab."""

from __future__ import annotations

import click

__all__ = ["command"]


@click.command("lab")
def command() -> None:
    """Run the crash lab."""
    raise click.ClickException("the lab is not built yet")
