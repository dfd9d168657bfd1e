"""``oncewire dispatch``: a long-lived dispatcher with the user's sinks.

``--app module:attribute`` names the sinks the way uvicorn and celery name an application: the
attribute is a mapping of effect kind to sink, or a callable returning one. With ``--workers N``
the command supervises N dispatcher processes, and starts a worker that dies unexpectedly again
after a delay that doubles with each failure in a row (it says so, with the exit code and the
delay).

The first SIGTERM or SIGINT stops claiming, logs the attempts it waits for, and waits at most
``--grace`` seconds for them; attempts still running then stay claimed, for recovery (the next
dispatcher sees this process dead and redelivers them flagged), and the exit status is 3. A
second signal leaves at once. Each attempt is logged (INFO, logger ``oncewire.dispatch``).

Every ``--status-every`` seconds (and once more when it stops) a worker logs one status line:
what it settled since it started (done, retried, rejected, dead, redelivered) and what the
store holds for its kinds now (in flight, waiting, the oldest waiting one's age), read with
two small queries.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import click

from oncewire.cli import logformat
from oncewire.cli.common import adopt_option, configure_logging, db_option
from oncewire.core.errors import ConfigurationError
from oncewire.dispatch.sinkspec import inspect_sinks

__all__ = ["command", "load_sinks"]

log = logging.getLogger("oncewire.cli.dispatch")


_SUPERVISOR_ENV = "ONCEWIRE_SUPERVISOR_PID"
EXIT_LEFT_CLAIMED = 3  # stopped with attempts still running: their claims await recovery
_RESTART_FIRST_SECONDS = 0.5
_RESTART_MAX_SECONDS = 30.0
_RESTART_RESET_AFTER_SECONDS = 60.0  # a worker that ran this long starts its backoff afresh


def _configure_logging() -> None:
    # ISO 8601 times with the zone, as every command prints them.
    configure_logging(logging.INFO, "%(asctime)s %(levelname)s %(name)s: %(message)s")


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
    try:
        inspect_sinks(target)  # the dispatcher's own checks, before anything runs
    except ConfigurationError as exc:
        raise ConfigurationError(f"--app {spec!r}: {exc}") from None
    return dict(target)


def _run_one(
    db: str,
    app: str,
    sinks: dict[str, Any],
    concurrency: int,
    batch_size: int,
    lease_seconds: float,
    poll_seconds: float,
    until_idle: bool,
    attempt_timeout: float | None,
    grace: float,
    status_every: float = 0.0,
    storage_patience: float = 60.0,
    adopt: bool = False,
) -> int:
    from oncewire.dispatch import Dispatcher
    from oncewire.ledger import Ledger

    _configure_logging()
    if logformat.current() != "json":  # the dump is plain text: not inside a JSON-lines stderr
        # SIGUSR1 writes every thread's stack to stderr: where a worker that does not stop is
        # stuck (the supervisor asks before it kills one that outlived its grace).
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    with Ledger(db, adopt=adopt) as ledger:
        dispatcher = Dispatcher(
            ledger,
            sinks,
            batch_size=batch_size,
            concurrency=concurrency,
            lease_seconds=lease_seconds,
            poll_seconds=poll_seconds,
            attempt_timeout=attempt_timeout,
            grace_seconds=grace,
            storage_patience_seconds=storage_patience,
        )
        kinds = ", ".join(sorted(sinks))
        if logformat.current() == "json":  # stderr holds JSON lines only
            log.info(
                "dispatching %s from %s as %s",
                kinds,
                app,
                dispatcher.owner,
                extra={"kinds": sorted(sinks), "app": app, "owner": dispatcher.owner},
            )
        else:
            click.echo(f"dispatching {kinds} from {app} as {dispatcher.owner}", err=True)
        _follow_supervisor(dispatcher)
        stopped = threading.Event()
        if status_every > 0:
            threading.Thread(
                target=_report_status,
                args=(dispatcher, status_every, stopped),
                name="oncewire-status",
                daemon=True,
            ).start()
        try:
            stats = dispatcher.run(until_idle=until_idle)
        finally:
            stopped.set()
        if status_every > 0:
            _say_status(dispatcher, final=True)
    click.echo(json.dumps({"pid": os.getpid(), "stats": stats.as_dict()}))
    return EXIT_LEFT_CLAIMED if stats.abandoned else 0


def _patience(seconds: float) -> float:
    """NaN passes click's range check; refuse it before a store is opened."""
    from oncewire.dispatch.outage import check_patience

    try:
        return check_patience(seconds)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from None


def _say_status(dispatcher: Any, *, final: bool = False) -> None:
    from oncewire.dispatch.reporting import read_status

    status = read_status(
        dispatcher.stats, dispatcher.ledger.store, dispatcher.kinds, dispatcher.clock.now()
    )
    who = f" [pid {os.getpid()}]" if os.environ.get(_SUPERVISOR_ENV) else ""
    log.info(
        "%s%s: %s",
        "final status" if final else "status",
        who,
        status.line(),
        extra={"status": "final" if final else "periodic", "pid": os.getpid(), **status.fields()},
    )


def _report_status(dispatcher: Any, every: float, stopped: threading.Event) -> None:
    """A status line every ``every`` seconds until the dispatcher stops."""
    while not stopped.wait(every):
        _say_status(dispatcher)


def _follow_supervisor(dispatcher: Any) -> None:
    """A supervised worker whose supervisor died stops, as if it had been told to."""
    supervisor = os.environ.get(_SUPERVISOR_ENV)
    if not supervisor:
        return

    def watch() -> None:
        while os.getppid() == int(supervisor):
            time.sleep(1.0)
        log.warning("the supervisor (pid %s) is gone: stopping", supervisor)
        dispatcher.stop()

    threading.Thread(target=watch, name="oncewire-supervisor-watch", daemon=True).start()


def _supervise(argv: list[str], workers: int, grace: float) -> int:
    _configure_logging()
    signals: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        signals.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    command = [sys.executable, "-m", "oncewire", "dispatch", *argv, "--workers", "1"]
    env = {**os.environ, _SUPERVISOR_ENV: str(os.getpid())}

    def spawn() -> subprocess.Popen[bytes]:
        # A process group of its own: a Ctrl-C in the terminal reaches the supervisor only,
        # which passes it on once (two signals would make a worker leave at once).
        return subprocess.Popen(command, env=env, process_group=0)

    children = {i: spawn() for i in range(workers)}
    started = dict.fromkeys(children, time.monotonic())
    failures = dict.fromkeys(children, 0)  # failures in a row, per slot
    restart_at: dict[int, float] = {}  # slot -> when its next worker starts
    pids = [child.pid for child in children.values()]
    if logformat.current() == "json":  # stderr holds JSON lines only
        log.info("supervising %d workers: %s", workers, pids, extra={"pids": pids})
    else:
        click.echo(f"supervising {workers} workers: {' '.join(map(str, pids))}", err=True)
    while not signals:
        time.sleep(0.1)
        now = time.monotonic()
        for slot, when in list(restart_at.items()):
            if now >= when and not signals:
                del restart_at[slot]
                children[slot] = spawn()
                started[slot] = time.monotonic()
        for slot, child in list(children.items()):
            if slot in restart_at:
                continue
            code = child.poll()
            if code is None or signals:
                continue
            if code == 0 and "--until-idle" in argv:
                children.pop(slot)
                continue
            if now - started[slot] >= _RESTART_RESET_AFTER_SECONDS:
                failures[slot] = 0
            failures[slot] += 1
            delay = min(_RESTART_MAX_SECONDS, _RESTART_FIRST_SECONDS * 2 ** (failures[slot] - 1))
            log.warning(
                "worker %d exited with code %d; starting another in %.1fs (failure %d in a row)",
                child.pid,
                code,
                delay,
                failures[slot],
            )
            restart_at[slot] = now + delay
        if not children:
            return 0
    # Stopping: each worker waits out its own grace period; a second signal is passed on
    # (the workers leave at once).
    live = [c for slot, c in children.items() if slot not in restart_at and c.poll() is None]
    log.warning("signal %d: stopping %d worker(s) (grace %gs)", signals[0], len(live), grace)
    for child in live:
        child.send_signal(signal.SIGTERM)
    forwarded = 1
    deadline = time.monotonic() + grace + 10.0
    while any(c.poll() is None for c in live):
        if len(signals) > forwarded:
            forwarded = len(signals)
            for child in live:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
        if time.monotonic() > deadline:
            stuck = [child for child in live if child.poll() is None]
            for child in stuck:
                log.warning(
                    "worker %d did not stop within %gs: its stacks (SIGUSR1), then SIGKILL",
                    child.pid,
                    grace + 10.0,
                )
                child.send_signal(signal.SIGUSR1)
                # One dump at a time: the workers share this stderr, and two written at once
                # interleave line by line into something no one can read.
                time.sleep(0.5)
            time.sleep(0.5)
            for child in stuck:
                child.kill()
                child.wait()  # reaped here: the next round does not find it stuck again
        time.sleep(0.05)
    failed = sum(child.wait() not in (0, -signal.SIGTERM) for child in live)
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
@click.option(
    "--attempt-timeout",
    envvar="ONCEWIRE_ATTEMPT_TIMEOUT",
    show_envvar=True,
    type=click.FloatRange(0.001),
    default=None,
    metavar="SECONDS",
    help="Give up on a sink call after this long: recorded uncertain (a later attempt is a "
    "flagged redelivery). Default: no limit.",
)
@click.option(
    "--grace",
    envvar="ONCEWIRE_GRACE",
    show_envvar=True,
    type=click.FloatRange(0.0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="On SIGTERM/SIGINT, how long to wait for the attempts in flight; those still running "
    "then are left claimed for recovery. A second signal exits at once.",
)
@click.option(
    "--status-every",
    envvar="ONCEWIRE_STATUS_EVERY",
    show_envvar=True,
    type=click.FloatRange(0.0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Log a status line this often (done, retried, rejected, dead and redelivered since "
    "start; in flight, waiting and the oldest waiting one's age in the store), and once at "
    "exit. 0: never.",
)
@click.option(
    "--storage-patience",
    envvar="ONCEWIRE_STORAGE_PATIENCE",
    show_envvar=True,
    type=click.FloatRange(0.0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="While the store is unreachable, a worker keeps its unrecorded outcomes and retries "
    "with backoff; after this long it exits non-zero (its supervisor starts another). "
    "'inf': never give up.",
    callback=lambda ctx, param, value: _patience(value),
)
@click.option("--until-idle", is_flag=True, help="Drain what is due, then exit.")
@adopt_option
@logformat.log_format_option
def command(
    db: str,
    app: str,
    workers: int,
    concurrency: int,
    batch_size: int,
    lease_seconds: float,
    poll_seconds: float,
    attempt_timeout: float | None,
    grace: float,
    status_every: float,
    storage_patience: float,
    until_idle: bool,
    adopt: bool,
) -> None:
    """Run dispatchers: claim due effects, call the app's sinks, record their outcomes."""
    if workers == 1:
        # Fails fast, with one clear line, before anything runs; resolved once (an app that
        # is a factory builds its sinks once).
        sinks = load_sinks(app)
        code = _run_one(
            db,
            app,
            sinks,
            concurrency,
            batch_size,
            lease_seconds,
            poll_seconds,
            until_idle,
            attempt_timeout,
            grace,
            status_every,
            storage_patience,
            adopt,
        )
        if code:
            raise click.exceptions.Exit(code)
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
    argv += ["--grace", str(grace), "--log-format", logformat.current()]
    argv += ["--status-every", str(status_every), "--storage-patience", str(storage_patience)]
    if attempt_timeout is not None:
        argv += ["--attempt-timeout", str(attempt_timeout)]
    if until_idle:
        argv.append("--until-idle")
    if adopt:
        argv.append("--adopt")
    code = _supervise(argv, workers, grace)
    # The app was imported here only to check it; whatever it started at import (a thread the
    # interpreter would wait for at exit, an atexit hook) serves nothing in the supervisor and
    # must not keep it from reporting its workers' exit.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
