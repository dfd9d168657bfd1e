"""Two MCP tool servers on stdio, built with the ``mcp`` SDK, for the lab and the tests.

``python -m oncewire.lab.children.mcp_servers ROLE ...``:

tickets  an oncewire-aware server: its ``create_ticket`` runs each call once per key
         (``oncewire.mcp.once`` over ``Receipts``) and writes one row of the lab's ``tickets``
         table in the receipt's transaction; ``list_tickets`` is read-only. It declares
         ``io.oncewire/deduplicates``. The store is ``--store`` or ``ONCEWIRE_MCP_STORE`` (a
         SQLite path or a PostgreSQL URL); ``--async`` makes ``create_ticket`` an ``async def``
         tool; ``--side-log PATH`` makes the body append a line (key, redelivery, pid) to a
         file *outside* the transaction before it writes, so a test sees every run of the body,
         committed or not.
log      a plain server (no oncewire): its ``create_ticket`` appends one JSON line (key,
         redelivery, arguments, pid) to ``--log`` or ``ONCEWIRE_MCP_LOG``, fsynced, every time
         it is called. It deduplicates nothing and declares nothing.

Unlike the other children, these print nothing of their own on stdout: stdout is the MCP
transport. A process started with a crash point armed (``ONCEWIRE_CRASH``, the receipts'
points for ``tickets``) dies there, as any lab child does.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from oncewire.core import crash

if TYPE_CHECKING:
    from oncewire.receipts.service import Receipts

MODULE = "oncewire.lab.children.mcp_servers"
ENV_STORE = "ONCEWIRE_MCP_STORE"
ENV_LOG = "ONCEWIRE_MCP_LOG"
TOOL = "create_ticket"
# The modules that register the points a run of ``tickets`` may arm.
POINT_MODULES = ("oncewire.receipts",)

_TICKETS_DDL = (
    "CREATE TABLE IF NOT EXISTS tickets (id {serial} PRIMARY KEY, operation_id TEXT NOT NULL, "
    "payload TEXT NOT NULL, attempt INTEGER NOT NULL, redelivery INTEGER NOT NULL, "
    "service_pid INTEGER NOT NULL)"
)  # the lab's downstream table (oncewire.lab.fixtures.initialise), made here when absent
_INSERT = (
    "INSERT INTO tickets (operation_id, payload, attempt, redelivery, service_pid) "
    "VALUES (:key, :payload, 0, :redelivery, :pid) RETURNING id"
)  # attempt 0: a server does not know the caller's attempt number


def _side_log(path: str | None, record: dict[str, Any]) -> None:
    if path is None:
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps(record, sort_keys=True) + "\n")
        log.flush()
        os.fsync(log.fileno())


def tickets_server(
    store: str | Receipts, *, use_async: bool = False, side_log: str | None = None
) -> Any:
    """The oncewire-aware server (an ``MCPServer``), its tools writing to ``store`` (a URL, or
    ``Receipts`` the caller opened and closes)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    from oncewire.core.canonical import canonical_json
    from oncewire.mcp import current_call, declare_deduplicates, once
    from oncewire.receipts.service import Receipts

    receipts = Receipts(store, retention_seconds=None) if isinstance(store, str) else store
    serial = "BIGSERIAL" if receipts.store.dialect == "postgresql" else "INTEGER"
    with receipts.store.transaction() as tx:
        tx.execute(_TICKETS_DDL.format(serial=serial))
    server: MCPServer[Any] = MCPServer("oncewire-lab-tickets")

    def ticket_row() -> dict[str, Any]:
        call = current_call()
        _side_log(side_log, {"key": call.key, "redelivery": call.redelivery, "pid": os.getpid()})
        return {
            "key": call.key,
            "payload": canonical_json(call.payload),
            "redelivery": int(call.redelivery),
            "pid": os.getpid(),
        }

    if use_async:

        @server.tool(name=TOOL)
        @once(receipts, required=True)
        async def create_ticket_async(
            title: str, project: str = "demo-agent", priority: str = "normal"
        ) -> dict[str, int]:
            """Create a ticket (once per idempotency key)."""
            row = (await current_call().tx.execute(_INSERT, ticket_row())).fetchone()
            return {"ticket_id": int(row[0])}

    else:

        @server.tool(name=TOOL)
        @once(receipts, required=True)
        def create_ticket(
            title: str, project: str = "demo-agent", priority: str = "normal"
        ) -> dict[str, int]:
            """Create a ticket (once per idempotency key)."""
            row = current_call().tx.execute(_INSERT, ticket_row()).fetchone()
            return {"ticket_id": int(row[0])}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def list_tickets() -> list[dict[str, Any]]:
        """Every ticket, oldest first."""
        with receipts.store.transaction() as tx:
            rows = tx.execute(
                "SELECT id, operation_id, redelivery FROM tickets ORDER BY id"
            ).fetchall()
        return [{"id": r[0], "key": r[1], "redelivery": bool(r[2])} for r in rows]

    declare_deduplicates(server)
    return server


def log_server(log: str) -> Any:
    """The plain server (an ``MCPServer``): every call appends a line to ``log``."""
    from mcp.server.mcpserver import Context, MCPServer

    from oncewire.mcp.protocol import IDEMPOTENCY_KEY, REDELIVERY

    server: MCPServer[Any] = MCPServer("oncewire-lab-log")

    def create_ticket(
        title: str, ctx: Context, project: str = "demo-agent", priority: str = "normal"
    ) -> str:
        """Create a ticket (appends a line to the log on every call)."""
        meta = ctx.request_context.meta or {}
        record = {
            "key": meta.get(IDEMPOTENCY_KEY),
            "redelivery": meta.get(REDELIVERY) is True,
            "arguments": {"title": title, "project": project, "priority": priority},
            "pid": os.getpid(),
        }
        _side_log(log, record)
        return f"ticket logged by {os.getpid()}"

    # Context is imported here, not at the top (the module must import without mcp), so the
    # SDK cannot evaluate the string annotation from the module's globals: hand it the class.
    create_ticket.__annotations__["ctx"] = Context
    server.tool(name=TOOL)(create_ticket)
    return server


def _required(value: str | None, flag: str, env: str) -> str:
    if not value:
        raise SystemExit(f"{MODULE}: give {flag} or set {env}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("role", choices=["tickets", "log"])
    parser.add_argument("--store", default=os.environ.get(ENV_STORE), help=f"or {ENV_STORE}")
    parser.add_argument("--log", default=os.environ.get(ENV_LOG), help=f"or {ENV_LOG}")
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--side-log", default=None)
    args = parser.parse_args(argv)
    if crash.armed():
        for module in POINT_MODULES:
            importlib.import_module(module)
    crash.check_armed()
    if args.role == "tickets":
        store = _required(args.store, "--store", ENV_STORE)
        server = tickets_server(store, use_async=args.use_async, side_log=args.side_log)
    else:
        server = log_server(_required(args.log, "--log", ENV_LOG))
    server.run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
