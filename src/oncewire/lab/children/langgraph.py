"""The langgraph suite's child process: ``python -m oncewire.lab.children.langgraph run ...``.

A scenario has two stores (:class:`Stores`), SQLite files in its folder or PostgreSQL schemas
(``--caller URL --downstream URL``): the *caller* is the ledger, holding the tool calls'
effects and, in the durable mode, the graph's checkpoints and its run (an
:class:`~oncewire.langgraph.OncewireSaver` on the same store, :func:`checkpointer`); the
*downstream* store is the receiver (``tickets``, ``tool_attempts`` and receipts). The plain
mode checkpoints with LangGraph's own ``SqliteSaver`` in ``checkpoints.sqlite`` of the folder.
The durable saver journals each ``put`` and ``put_writes`` as it begins and as it returns
(:class:`Journal`), so that the lab can tell which call a kill interrupted (:func:`unfinished`).

``run`` runs the graph of :func:`build_graph` for one thread until it is done. The durable mode
goes through :func:`~oncewire.langgraph.durable_invoke`, so the run's input is recorded before
its first node runs: a later start resumes a run whose process died
(:func:`~oncewire.langgraph.pending_runs`, :func:`~oncewire.langgraph.resume_run`), even one
killed before its first checkpoint. The plain mode invokes the graph from its input on the
first start and from its last checkpoint on every later one. ``--ready FILE`` is written once
the child has imported everything and built its graph, just before the run starts. It prints
one JSON object (``work_seconds``: from ready to done).

The graph is an agent with a scripted model (no network): its first answer calls
``open_ticket`` twice and ``add`` once, its second ``open_ticket`` once more, its third is
text. ``--mode durable`` runs the tools in a :class:`~oncewire.langgraph.DurableToolNode`;
each ``open_ticket`` writes its ticket through ``Receipts.run_once`` keyed by
``current_attempt().key``. ``--mode plain`` runs them in LangGraph's own ``ToolNode`` and
writes the ticket directly: nothing there can tell a second run of a call from the first.
Every tool attempt is logged in ``tool_attempts`` (tool call id, attempt number, redelivery
flag, pid) before the tool acts, in a transaction of its own.

``serve`` is the suite's warm parent (:func:`oncewire.lab.forking.serve`): it imports LangGraph,
both savers and oncewire once, then forks a child per start, which runs ``main``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from oncewire.core import crash

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.graph.state import CompiledStateGraph

    from oncewire.ledger import Ledger
    from oncewire.receipts import Receipts

__all__ = [
    "SCRIPT",
    "THREAD",
    "Journal",
    "Stores",
    "build_graph",
    "checkpointer",
    "final_messages",
    "main",
    "read_final",
    "unfinished",
]

MODULE = "oncewire.lab.children.langgraph"
THREAD = "lab-thread-1"
JOURNAL = "saver.journal"
QUESTION = "Two tickets, one sum, then a follow-up."

# The help desk's answer takes a moment: a kill from outside lands inside a tool more often.
TICKET_LATENCY_SECONDS = 0.1
TICKET_WRITTEN = crash.register(
    "lab.langgraph.ticket_written",
    "the lab's open_ticket tool committed its ticket in the receiver; it has not returned",
)

BEFORE_FIRST_CHECKPOINT = crash.register(
    "lab.langgraph.before_first_checkpoint",
    "durable_invoke recorded the run; the graph's first checkpoint (its input) is not stored",
)

# The scripted model: its n-th answer (n counts the AI messages so far).
SCRIPT: list[dict[str, Any]] = [
    {
        "id": "ai-1",
        "content": "",
        "tool_calls": [
            {"id": "call-1", "name": "open_ticket", "args": {"title": "printer on fire"}},
            {"id": "call-2", "name": "open_ticket", "args": {"title": "coffee machine empty"}},
            {"id": "call-3", "name": "add", "args": {"a": 2, "b": 3}},
        ],
    },
    {
        "id": "ai-2",
        "content": "",
        "tool_calls": [
            {"id": "call-4", "name": "open_ticket", "args": {"title": "follow up on both"}},
        ],
    },
    {"id": "ai-3", "content": "Opened three tickets; 2 + 3 = 5.", "tool_calls": []},
]
TOOL_CALLS = [call for answer in SCRIPT for call in answer["tool_calls"]]
TICKET_CALLS = [call["id"] for call in TOOL_CALLS if call["name"] == "open_ticket"]


class Journal:
    """The saver's journal (``saver.journal`` in the scenario folder): one JSON line as each
    ``put`` / ``put_writes`` begins and as it returns, with the process's pid, written with one
    ``write`` of an append-only file (in the kernel's hands at once: a SIGKILL loses none)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def note(self, event: str, what: dict[str, Any]) -> None:
        line = json.dumps({"event": event, "pid": os.getpid(), **what}, sort_keys=True) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def unfinished(folder: Path, pid: int, op: str) -> list[dict[str, Any]]:
    """The saver calls ``op`` (``put`` or ``writes``) that process ``pid`` began and never
    returned from, read from the scenario's journal."""
    path = folder / JOURNAL
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    open_calls: list[dict[str, Any]] = []
    for line in lines:
        note = json.loads(line)
        if note["pid"] != pid or note["op"] != op:
            continue
        what = {k: v for k, v in note.items() if k not in ("event", "pid")}
        if note["event"] == "begin":
            open_calls.append(what)
        elif what in open_calls:
            open_calls.remove(what)
    return open_calls


@dataclass(frozen=True)
class Stores:
    """One scenario's folder and its two stores (a SQLite path or a PostgreSQL URL each)."""

    folder: Path
    caller: str
    downstream: str

    @classmethod
    def in_folder(cls, folder: Path) -> Stores:
        return cls(folder, str(folder / "caller.sqlite"), str(folder / "downstream.sqlite"))

    @property
    def dialect(self) -> str:
        return "postgresql" if self.caller.startswith(("postgresql:", "postgres:")) else "sqlite"

    def args(self) -> list[str]:
        return [
            "--folder",
            str(self.folder),
            "--caller",
            self.caller,
            "--downstream",
            self.downstream,
        ]


def checkpointer(
    stores: Stores, mode: str, ledger: Ledger | None = None
) -> BaseCheckpointSaver[Any]:
    """The graph's checkpointer: in the durable mode an ``OncewireSaver`` on the caller's
    store (``ledger`` when given), in the plain mode LangGraph's own ``SqliteSaver`` on
    ``checkpoints.sqlite``. The one place to change when a scenario moves to another saver."""
    if mode == "durable":
        from oncewire.langgraph.saver import OncewireSaver
        from oncewire.ledger import Ledger

        journal = Journal(stores.folder / JOURNAL)

        class LabSaver(OncewireSaver):
            """The saver, with a crash point before a thread's first checkpoint, journalling
            each put and put_writes as it begins and as it returns."""

            def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
                if metadata.get("source") == "input":
                    BEFORE_FIRST_CHECKPOINT.hit()
                what = {"op": "put", "checkpoint_id": checkpoint["id"]}
                journal.note("begin", what)
                answer = super().put(config, checkpoint, metadata, new_versions)
                journal.note("end", what)
                return answer

            def put_writes(
                self, config: Any, writes: Any, task_id: str, task_path: str = ""
            ) -> None:
                conf = config.get("configurable") or {}
                what = {
                    "op": "writes",
                    "checkpoint_id": str(conf.get("checkpoint_id")),
                    "task_id": task_id,
                }
                journal.note("begin", what)
                super().put_writes(config, writes, task_id, task_path)
                journal.note("end", what)

        return LabSaver(ledger if ledger is not None else Ledger(stores.caller))
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = stores.folder / "checkpoints.sqlite"
    return SqliteSaver(sqlite3.connect(str(path), check_same_thread=False))


def initialise(stores: Stores) -> None:
    """The receiver's tables (its receipts come with ``Receipts``) and an empty ledger."""
    from oncewire.ledger import Ledger
    from oncewire.receipts import Receipts

    with Ledger(stores.caller):
        pass
    serial = "BIGSERIAL" if stores.dialect == "postgresql" else "INTEGER"
    with (
        Receipts(stores.downstream, retention_seconds=None) as receipts,
        receipts.store.transaction() as tx,
    ):
        tx.execute(
            f"CREATE TABLE tickets (id {serial} PRIMARY KEY, tool_call_id TEXT NOT NULL, "
            "title TEXT NOT NULL, redelivery INTEGER NOT NULL, pid INTEGER NOT NULL)"
        )
        tx.execute(
            f"CREATE TABLE tool_attempts (id {serial} PRIMARY KEY, tool_call_id TEXT NOT NULL, "
            "tool TEXT NOT NULL, number INTEGER NOT NULL, redelivery INTEGER NOT NULL, "
            "pid INTEGER NOT NULL)"
        )


def _model(state: Any) -> dict[str, Any]:
    from langchain_core.messages import AIMessage

    answered = sum(1 for message in state["messages"] if isinstance(message, AIMessage))
    answer = SCRIPT[min(answered, len(SCRIPT) - 1)]
    return {"messages": [AIMessage(**answer)]}


def _tools(receipts: Receipts, durable: bool) -> list[Any]:
    from langchain_core.tools import InjectedToolCallId, tool

    from oncewire.dispatch.attempt import current_attempt

    def log_attempt(tool_call_id: str, name: str) -> tuple[str, bool]:
        """(the key the receiver deduplicates by, whether this attempt is a redelivery)."""
        number, redelivery, key = 1, False, tool_call_id
        if durable:
            attempt = current_attempt()
            number, redelivery, key = attempt.number, attempt.redelivery, attempt.key
        with receipts.store.transaction() as tx:
            tx.execute(
                "INSERT INTO tool_attempts (tool_call_id, tool, number, redelivery, pid) "
                "VALUES (:call, :tool, :number, :redelivery, :pid)",
                {
                    "call": tool_call_id,
                    "tool": name,
                    "number": number,
                    "redelivery": int(redelivery),
                    "pid": os.getpid(),
                },
            )
        return key, redelivery

    def insert(tx: Any, tool_call_id: str, title: str, redelivery: bool) -> dict[str, Any]:
        # The answer names the call, not the row id: the tools of one message run side by
        # side, so ids come in any order, and the lab compares the final state with a run's.
        tx.execute(
            "INSERT INTO tickets (tool_call_id, title, redelivery, pid) "
            "VALUES (:call, :title, :redelivery, :pid)",
            {
                "call": tool_call_id,
                "title": title,
                "redelivery": int(redelivery),
                "pid": os.getpid(),
            },
        )
        return {"ticket": tool_call_id, "title": title}

    # The annotations as objects, not the strings this module's annotations are: LangChain
    # reads them to find the injected call id, and the names are local to this function.
    call_id = Annotated[str, InjectedToolCallId]

    def open_ticket(title: str, tool_call_id: str) -> str:
        """Open a ticket in the help desk."""
        key, redelivery = log_attempt(tool_call_id, "open_ticket")
        if durable:
            answer = receipts.run_once(
                key, {"title": title}, lambda tx: insert(tx, tool_call_id, title, redelivery)
            ).result
        else:
            with receipts.store.transaction() as tx:
                answer = insert(tx, tool_call_id, title, redelivery)
        TICKET_WRITTEN.hit()
        time.sleep(TICKET_LATENCY_SECONDS)
        return json.dumps(answer, sort_keys=True)

    def add(a: int, b: int, tool_call_id: str) -> int:
        """Add two numbers."""
        log_attempt(tool_call_id, "add")
        return a + b

    open_ticket.__annotations__ = {"title": str, "tool_call_id": call_id, "return": str}
    add.__annotations__ = {"a": int, "b": int, "tool_call_id": call_id, "return": int}
    return [tool(open_ticket), tool(add)]


@contextmanager
def build_graph(stores: Stores, mode: str) -> Iterator[CompiledStateGraph[Any, Any, Any, Any]]:
    """The agent graph of one scenario, ``mode`` ``durable`` or ``plain``, with its stores
    open for as long as the block runs."""
    from langgraph.prebuilt import ToolNode

    from oncewire.ledger import Ledger
    from oncewire.receipts import Receipts

    durable = mode == "durable"
    with ExitStack() as stack:
        receipts = stack.enter_context(Receipts(stores.downstream, retention_seconds=None))
        ledger = stack.enter_context(Ledger(stores.caller)) if durable else None
        tools = _tools(receipts, durable)
        node: Any
        if ledger is not None:
            from oncewire.dispatch.retry import RetryPolicy
            from oncewire.langgraph.tools import DurableToolNode

            node = DurableToolNode(
                tools, ledger=ledger, retry=RetryPolicy(base_seconds=0.02, cap_seconds=0.25)
            )
            stack.callback(node.close)
        else:
            node = ToolNode(tools)
        saver = checkpointer(stores, mode, ledger)
        if not durable:
            stack.callback(saver.conn.close)  # type: ignore[attr-defined]
        yield _graph(node, saver)


def _graph(node: Any, saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition

    graph = StateGraph(MessagesState)
    graph.add_node("model", _model)
    graph.add_node("tools", node)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=saver)


def final_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """A thread's messages as what they say, without the ids LangGraph assigns at random."""
    shown = []
    for message in messages:
        item: dict[str, Any] = {"type": message.type, "content": message.content}
        for name in ("tool_call_id", "name", "status"):
            if getattr(message, name, None) is not None:
                item[name] = getattr(message, name)
        calls = getattr(message, "tool_calls", None)
        if calls:
            item["tool_calls"] = [(c["id"], c["name"], c["args"]) for c in calls]
        shown.append(item)
    return shown


def _run_durable(app: Any, config: Any) -> str:
    """Start the thread's run, or resume it when its process died; how it went on."""
    from langchain_core.messages import HumanMessage

    from oncewire.langgraph.saver_runs import durable_invoke, pending_runs, resume_run

    saver = app.checkpointer
    if any(run.thread_id == THREAD for run in pending_runs(saver)):
        resume_run(app, THREAD)
        return "resumed"
    recorded = saver.store.lg_get_run(THREAD)
    if recorded is not None:  # a run that ended; its process was killed after
        if recorded.state != "done":
            raise RuntimeError(f"the run of {THREAD} ended {recorded.state}: {recorded.error}")
        return "already done"
    durable_invoke(app, {"messages": [HumanMessage(QUESTION)]}, config)
    return "started"


def _run_plain(app: Any, config: Any) -> str:
    from langchain_core.messages import HumanMessage

    started = bool(app.get_state(config).values)
    # Resume from the last checkpoint whatever it says: after a crash, a step whose writes
    # were saved shows no ``next`` although the steps after it have not run.
    app.invoke(None if started else {"messages": [HumanMessage(QUESTION)]}, config)
    return "resumed" if started else "started"


def run(stores: Stores, mode: str, ready: Path | None = None) -> dict[str, Any]:
    config: Any = {"configurable": {"thread_id": THREAD}}
    with build_graph(stores, mode) as app:
        if ready is not None:
            ready.write_text(str(os.getpid()), encoding="utf-8")
        began = time.monotonic()
        how = _run_durable(app, config) if mode == "durable" else _run_plain(app, config)
        work = time.monotonic() - began
        state = app.get_state(config)
    return {
        "pid": os.getpid(),
        "run": how,
        "resumed": how != "started",
        "done": not state.tasks,
        "messages": len(state.values.get("messages", [])),
        "work_seconds": round(work, 4),
    }


def read_final(stores: Stores, mode: str) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The thread's messages and what is left to run, read from its last checkpoint."""
    with build_graph(stores, mode) as app:
        state = app.get_state({"configurable": {"thread_id": THREAD}})
        return final_messages(state.values.get("messages", [])), tuple(t.name for t in state.tasks)


def _arm_points() -> None:
    """Import what declares the points the suite arms, and refuse an unknown one."""
    import oncewire.dispatch.dispatcher
    import oncewire.effects.outbox
    import oncewire.langgraph.saver
    import oncewire.langgraph.saver_runs
    import oncewire.langgraph.tools
    import oncewire.receipts  # noqa: F401  (they declare the points the suite arms)

    crash.check_armed()


def _warm() -> None:
    """What every forked child would import: LangGraph, both savers, oncewire's adapters."""
    import langgraph.checkpoint.sqlite
    import langgraph.graph
    import langgraph.prebuilt  # noqa: F401  (the imports each child is spared)

    import oncewire.langgraph
    import oncewire.ledger  # noqa: F401

    _arm_points()


def main(argv: list[str] | None = None) -> int:
    if (argv if argv is not None else sys.argv[1:])[:1] == ["serve"]:
        from oncewire.lab.forking import serve

        return serve(main, _warm)
    parser = argparse.ArgumentParser(prog=MODULE)
    parser.add_argument("role", choices=["init", "run"])
    parser.add_argument("--folder", required=True, type=Path)
    parser.add_argument("--caller", help="the ledger's store (default: caller.sqlite there)")
    parser.add_argument("--downstream", help="the receiver (default: downstream.sqlite there)")
    parser.add_argument("--mode", choices=["durable", "plain"], default="durable")
    parser.add_argument("--ready", type=Path, help="written once the graph is built")
    args = parser.parse_args(argv)
    default = Stores.in_folder(args.folder)
    stores = Stores(
        args.folder, args.caller or default.caller, args.downstream or default.downstream
    )
    if crash.armed():
        _arm_points()
    if args.role == "init":
        initialise(stores)
        answer: dict[str, Any] = {"initialised": str(args.folder)}
    else:
        answer = run(stores, args.mode, args.ready)
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
