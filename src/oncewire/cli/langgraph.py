"""``oncewire langgraph``: LangGraph runs whose process died mid-run, listed and resumed.

LangGraph is imported only inside these commands: without the ``langgraph`` extra each answers
with the one line that names it (``MissingExtra``), and the rest of the command line works.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import click

from oncewire.cli.common import db_option, emit, json_option, stamped, table, when, yes_option
from oncewire.core.errors import ConfigurationError
from oncewire.core.extras import require
from oncewire.runs.keys import KEY_ENV

__all__ = ["group"]


def _ledger(db: str) -> Any:
    from oncewire.ledger import Ledger

    key = os.environ.get(KEY_ENV)
    return Ledger(db, create=False, runs_key=key.encode() if key else None)


def _load_graph(ref: str, saver: Any) -> Any:
    """``module:attr``: a StateGraph (compiled here with ``saver``) or a compiled graph (its
    checkpointer replaced by ``saver``)."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"--graph takes module:attribute, not {ref!r}")
    try:
        value: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"--graph {ref}: {exc}") from exc
    if hasattr(value, "compile"):
        return value.compile(checkpointer=saver)
    if hasattr(value, "checkpointer") and hasattr(value, "copy"):
        return value.copy(update={"checkpointer": saver})
    raise ConfigurationError(f"--graph {ref} is neither a StateGraph nor a compiled graph")


@click.group("langgraph")
def group() -> None:
    """LangGraph runs (the langgraph extra): pending, resume."""


@group.command("pending")
@db_option
@json_option
def pending(db: str, as_json: bool) -> None:
    """List runs accepted by durable_invoke whose owning process died (or whose lease ran
    out) before they finished."""
    require("langgraph", "oncewire langgraph pending")
    from oncewire.langgraph.saver import OncewireSaver
    from oncewire.langgraph.saver_runs import pending_runs

    with _ledger(db) as ledger:
        found = pending_runs(OncewireSaver(ledger))
    if as_json:
        emit([stamped(p.as_dict()) for p in found])
        return
    if not found:
        click.echo("no pending LangGraph runs")
        return
    table(
        ["thread_id", "why", "owner", "attempts", "graph", "started_at"],
        [
            [p.thread_id, p.why, p.owner, p.attempts, p.graph or "", when(p.started_at) or ""]
            for p in found
        ],
    )


@group.command("resume")
@db_option
@click.option(
    "--graph",
    "graph_ref",
    metavar="MODULE:ATTRIBUTE",
    help="The graph to resume with (a StateGraph or a compiled graph); default: the one the "
    "run recorded (durable_invoke's graph_ref).",
)
@click.option("--all", "every", is_flag=True, help="Resume every pending run.")
@click.argument("thread_ids", nargs=-1)
@yes_option
def resume(
    db: str, graph_ref: str | None, every: bool, thread_ids: tuple[str, ...], yes: bool
) -> None:
    """Take over pending runs and finish them, each from its latest checkpoint (or from its
    recorded input when it died before its first checkpoint)."""
    require("langgraph", "oncewire langgraph resume")
    from oncewire.langgraph.saver import OncewireSaver
    from oncewire.langgraph.saver_runs import pending_runs, resume_run

    if not every and not thread_ids:
        raise click.UsageError("name the threads to resume, or --all")
    with _ledger(db) as ledger:
        saver = OncewireSaver(ledger)
        runs = {p.thread_id: p for p in pending_runs(saver)}
        chosen = sorted(runs) if every else list(thread_ids)
        for thread_id in chosen:
            if thread_id not in runs:
                raise ConfigurationError(f"thread {thread_id!r} has no pending run")
        if chosen and not yes:
            click.confirm(f"resume {len(chosen)} run(s)?", abort=True)
        for thread_id in chosen:
            ref = graph_ref or runs[thread_id].graph
            if not ref:
                raise ConfigurationError(
                    f"thread {thread_id!r}: the run recorded no graph; pass --graph module:attr"
                )
            resume_run(_load_graph(ref, saver), thread_id)
            click.echo(f"resumed {thread_id}: done")
