"""Run the dashboard: bind the socket first (a clear error if the port is taken, and ``--port
0`` picks a free one and says which), then serve it with uvicorn until interrupted."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

from oncewire.core.extras import refusal

try:
    import uvicorn
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("ui", "oncewire ui", exc) from exc

from oncewire.core.errors import ConfigurationError
from oncewire.ledger import Ledger
from oncewire.ui import labview, period
from oncewire.ui.app import create_app
from oncewire.ui.guard import Guard, Refusal, check_binding

__all__ = ["load_evidence", "serve"]


def load_evidence(paths: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    """Read each evidence file now, so a bad one is refused before the server starts."""
    found = []
    for path in paths:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"cannot read {path}: {exc.strerror or exc}") from exc
        try:
            found.append((path.name, labview.parse(raw, str(path))))
        except Refusal as refusal:
            raise ConfigurationError(refusal.message) from None
    return found


def _label(ledger: Ledger) -> str:
    # A SQLite store is its file; a PostgreSQL URL may carry a password, so it is not shown.
    return ledger.store.label if ledger.store.dialect == "sqlite" else "PostgreSQL"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(
    db: str,
    *,
    host: str,
    port: int,
    token: str | None,
    allow_actions: bool,
    runs_key: bytes | None,
    evidence: list[Path],
    refresh_seconds: float = period.DEFAULT_SECONDS,
) -> None:
    """Serve until SIGINT/SIGTERM. Prints one JSON line on stdout once listening."""
    period.check(refresh_seconds)
    check_binding(host, token)
    loaded = load_evidence(evidence)
    ledger = Ledger(db, create=False, runs_key=runs_key)
    try:
        sock = _bind(host, port)
        bound = sock.getsockname()[1]
        guard = Guard(token=token, allow_actions=allow_actions)
        app = create_app(
            ledger,
            guard,
            db_label=_label(ledger),
            evidence=loaded,
            refresh_seconds=refresh_seconds,
        )
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{bound}/"
        print(
            json.dumps(
                {"listening": url, "port": bound, "actions": allow_actions, "token": bool(token)}
            ),
            flush=True,
        )
        print(
            f"oncewire ui: serving {url} ({'actions allowed' if allow_actions else 'read-only'}"
            + ("; open it with ?token=..." if token else "")
            + "); Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        ledger.close()
