"""``oncewire dispatch``: a long-lived dispatcher with the user's sinks.

``--app module:attribute`` names the sinks the way uvicorn and celery name an application: the
attribute is a mapping of effect kind to sink, or a callable returning one. With ``--workers N``
the command supervises N dispatcher processes; SIGTERM or SIGINT stops them all gracefully
(each finishes and records the attempts in flight), and a worker that dies unexpectedly is
started again.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

import click

from oncewire.cli.common import db_option
from oncewire.core.errors import ConfigurationError

__all__ = ["command", "load_sinks"]

log = logging.getLogger("oncewire.cli.dispatch")


def load_sinks(spec: str) -> dict[str, Any]:
    """Resolve ``module:attribute`` to a mapping of kind -> sink."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"--app {spec!r} must look like module:attribute")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"--app {spec!r}: cannot import {module_name}: {exc}") from exc
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigurationError(f"--app {spec!r}: {module_name} has no {attribute}") from None
    if callable(target) and not isinstance(target, Mapping):
        target = target()
    if not isinstance(target, Mapping) or not target:
        raise ConfigurationError(f"--app {spec!r} must name a non-empty mapping of kind -> sink")
    for kind, sink in target.items():
        if not isinstance(kind, str) or not callable(sink):
            raise ConfigurationError(f"--app {spec!r}: {kind!r} does not map to a callable sink")
    return dict(target)


def _run_one(
    db: str,
    app: str,
    concurrency: int,
    batch_size: int,
    lease_seconds: float,
    poll_seconds: float,
    until_idle: bool,
) -> None:
    from oncewire.dispatch import Dispatcher
    from oncewire.effects import Ledger

    sinks = load_sinks(app)
    with Ledger(db) as ledger:
        dispatcher = Dispatcher(
            ledger,
            sinks,
            batch_size=batch_size,
            concurrency=concurrency,
            lease_seconds=lease_seconds,
            poll_seconds=poll_seconds,
        )
        click.echo(
            f"dispatching {', '.join(sorted(sinks))} from {app} as {dispatcher.owner}", err=True
        )
        stats = dispatcher.run(until_idle=until_idle)
    click.echo(json.dumps({"pid": os.getpid(), "stats": stats.as_dict()}))


def _supervise(argv: list[str], workers: int) -> int:
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    command = [sys.executable, "-m", "oncewire", "dispatch", *argv, "--workers", "1"]
    children = {i: subprocess.Popen(command) for i in range(workers)}
    restarts = 0
    click.echo(
        f"supervising {workers} workers: {' '.join(str(c.pid) for c in children.values())}",
        err=True,
    )
    while not stopping:
        time.sleep(0.2)
        for slot, child in list(children.items()):
            code = child.poll()
            if code is None or stopping:
                continue
            if code == 0 and "--until-idle" in argv:
                children.pop(slot)
                continue
            restarts += 1
            click.echo(f"worker {child.pid} exited with {code}; starting another", err=True)
            time.sleep(min(5.0, 0.2 * restarts))
            children[slot] = subprocess.Popen(command)
        if not children:
            return 0
    for child in children.values():
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    failed = 0
    for child in children.values():
        failed += child.wait() not in (0, -signal.SIGTERM)
    return 1 if failed else 0


@click.command("dispatch")
@db_option
@click.option(
    "--app",
    envvar="ONCEWIRE_APP",
    show_envvar=True,
    required=True,
    metavar="MODULE:ATTRIBUTE",
    help="A mapping of effect kind -> sink (or a callable returning one).",
)
@click.option(
    "--workers",
    envvar="ONCEWIRE_WORKERS",
    show_envvar=True,
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Dispatcher processes to run and supervise.",
)
@click.option(
    "--concurrency",
    envvar="ONCEWIRE_CONCURRENCY",
    show_envvar=True,
    type=click.IntRange(1, 1024),
    default=1,
    show_default=True,
    help="Sink calls in flight per worker (threads).",
)
@click.option(
    "--batch-size",
    envvar="ONCEWIRE_BATCH_SIZE",
    show_envvar=True,
    type=click.IntRange(1, 10_000),
    default=32,
    show_default=True,
    help="Effects claimed per transaction.",
)
@click.option(
    "--lease-seconds",
    envvar="ONCEWIRE_LEASE_SECONDS",
    show_envvar=True,
    type=click.FloatRange(0.1),
    default=30.0,
    show_default=True,
    help="How long a claim lasts without renewal; another host takes over after it.",
)
@click.option(
    "--poll-seconds",
    envvar="ONCEWIRE_POLL_SECONDS",
    show_envvar=True,
    type=click.FloatRange(0.001),
    default=0.5,
    show_default=True,
    help="Longest idle wait (PostgreSQL wakes workers at once with LISTEN/NOTIFY).",
)
@click.option("--until-idle", is_flag=True, help="Drain what is due, then exit.")
def command(
    db: str,
    app: str,
    workers: int,
    concurrency: int,
    batch_size: int,
    lease_seconds: float,
    poll_seconds: float,
    until_idle: bool,
) -> None:
    """Run dispatchers: claim due effects, call the app's sinks, record their outcomes."""
    if workers == 1:
        load_sinks(app)  # fail fast, with one clear line, before anything runs
        _run_one(db, app, concurrency, batch_size, lease_seconds, poll_seconds, until_idle)
        return
    load_sinks(app)
    argv = [
        "--db",
        db,
        "--app",
        app,
        "--concurrency",
        str(concurrency),
        "--batch-size",
        str(batch_size),
        "--lease-seconds",
        str(lease_seconds),
        "--poll-seconds",
        str(poll_seconds),
    ]
    if until_idle:
        argv.append("--until-idle")
    code = _supervise(argv, workers)
    if code:
        raise click.exceptions.Exit(code)
