"""Every Python example in README.md and docs/ that uses a transaction runs as shown, on SQLite
and on PostgreSQL.

Each example is cut out of the Markdown and run as its own process in a fresh directory. On
PostgreSQL each database an example names (``"app.db"``, ``"payments.db"``, ``"chat.db"``, or
the ``postgresql://`` URL it shows) becomes a fresh schema of the test server; nothing else in
the example changes, so its SQL is the portable ``:name`` style or it fails here. What the
example stored is read back with plain drivers, around oncewire.

``test_every_transaction_example_is_run`` keeps the list honest: a new example with a
transaction in any page fails it until a test here (or the one named) runs it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support import tables
from tests.support.docs import code_blocks
from tests.support.pg import migrated_schema, server_url

ROOT = Path(__file__).resolve().parents[2]

# The examples, by page and first line; each is run by the test that uses the constant.
README_API = ("README.md", 'import oncewire\n\nledger = oncewire.Ledger("app.db")')
README_RECEIVER = ("README.md", 'receipts = oncewire.Receipts("payments.db")')
RECEIVER = ("docs/receivers.md", 'import oncewire\n\nreceipts = oncewire.Receipts("payments.db")')
SINK_HEAD = 'import oncewire\n\nledger = oncewire.Ledger("app.db")\n'
SINK_HEAD += 'receipts = oncewire.Receipts("payments.db")'
RECEIPT_RESULT = ("docs/receivers.md", SINK_HEAD + "   # and charge_card")
RECEIPTS_SINK = ("docs/receivers.md", SINK_HEAD + "\n\n\ndef work(")
ASYNC_FIRST = ("docs/asyncio.md", "import asyncio\nfrom oncewire.aio import AsyncLedger\n")
ASYNC_ACCEPT_IN = ("docs/asyncio.md", "import asyncio\n\nimport psycopg\n")
ASYNC_RECEIPTS = ("docs/asyncio.md", "import asyncio\n\nfrom oncewire.aio import AsyncReceipts")
ASYNC_RECEIPTS_SINK = ("docs/asyncio.md", "import oncewire\nfrom oncewire.aio import AsyncReceipts")
OTEL = ("docs/observability.md", "import oncewire, oncewire.otel\n")
POSTGRES_TX = ("docs/postgres.md", 'import oncewire\n\nledger = oncewire.Ledger("postgresql://')
POSTGRES_ACCEPT_IN = ("docs/postgres.md", "import psycopg\n\nwith psycopg.connect(")
REPLIES_COMMIT = (
    "docs/replies.md",
    "import oncewire\nfrom oncewire.replies import TELEGRAM_LIKE\n\n",
)
RUNS_REVIEW = ("docs/runs.md", "import hashlib\n")
RUNS_TURN = ("docs/runs.md", "from oncewire.replies import TELEGRAM_LIKE\nfrom oncewire.runs")
TOOLS = ("docs/tools.md", "import threading\n\nimport oncewire\nfrom oncewire import toolcalls")
RUN_HERE = [
    README_API,
    README_RECEIVER,
    RECEIVER,
    RECEIPT_RESULT,
    RECEIPTS_SINK,
    ASYNC_FIRST,
    ASYNC_ACCEPT_IN,
    ASYNC_RECEIPTS,
    ASYNC_RECEIPTS_SINK,
    OTEL,
    POSTGRES_TX,
    POSTGRES_ACCEPT_IN,
    REPLIES_COMMIT,
    RUNS_REVIEW,
    RUNS_TURN,
    TOOLS,
]
# Run elsewhere, against a real server: the test that does is named.
RUN_ELSEWHERE = {
    ("docs/agents.md", "import asyncio\n\nfrom agents import Agent"): (
        "tests/agents/test_docs.py",
        "def test_the_documented_example_runs_as_shown(",
    ),
    ("docs/http.md", "import uuid\n\nimport oncewire\nfrom oncewire.asgi"): (
        "tests/integration/test_asgi_idempotency.py",
        "def test_the_documented_recipe_runs_as_shown(",
    ),
    ("docs/langgraph.md", "import sqlite3\n\nfrom langchain_core"): (
        "tests/langgraph/test_docs.py",
        "def test_the_documented_example_runs_as_shown(",
    ),
    ("docs/mcp.md", "import anyio\nfrom mcp import Client\n"): (
        "tests/mcp_once/test_docs.py",
        "def test_the_documented_example_runs_as_shown(",
    ),
    ("docs/mcp.md", "# pay.py: an MCP tool server (the SDK's MCPServer on stdio)\n"): (
        "tests/mcp/test_proxy_docs.py",
        "def test_the_proxy_example_runs_as_shown(",
    ),
    ("docs/langgraph.md", 'saver.claim("order-42")'): (
        "tests/langgraph/test_docs.py",
        "def test_the_documented_joined_write_commits_with_the_callers_rows(",
    ),
}
# Not run, and the page says so.
NOT_RUN = {
    ("docs/tools.md", "import json\n\nfrom langchain_core"): "LangGraph is not a dependency",
    ("docs/agents.md", "# The same clerk with a real model"): "a real model needs a key",
}
USES_A_TRANSACTION = re.compile(
    r"transaction\(|\.execute\(|run_once|run_many|accept_in|ReceiptsSink|\.write\("
)

# The README's charge sink calls the reader's payment provider; this stands in for it.
PAYMENTS = """
class _Response:
    status, id, retry_after = 200, "ch_1", None

class payments:
    @staticmethod
    def charge(payload, idempotency_key):
        assert idempotency_key == "order-42/charge"
        return _Response()

    @staticmethod
    def refund(payload, idempotency_key):
        return {"refunded": payload["amount"], "key": idempotency_key}
"""

# docs/tools.md's model client, conversation and turn: a model response asking for two tools.
MODEL = """
import json
from types import SimpleNamespace

class _Message:
    role = "assistant"
    tool_calls = [
        {"id": "call_w", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "call_r", "function": {"name": "refund", "arguments": '{"amount": 500}'}},
    ]

    def model_dump_json(self):
        return json.dumps({"role": self.role, "tool_calls": self.tool_calls})

class client:
    class chat:
        class completions:
            @staticmethod
            def create(**request):
                return SimpleNamespace(choices=[SimpleNamespace(message=_Message())])

messages, tools, turn = [{"role": "user", "content": "Oslo's weather; refund 500"}], [], "turn-1"
"""


def python_blocks(page: str) -> list[str]:
    return code_blocks(page)


def block(example: tuple[str, str]) -> str:
    page, first = example
    found = [b for b in python_blocks(page) if b.startswith(first)]
    assert len(found) == 1, f"{page}: one python block starting {first!r}, found {len(found)}"
    return found[0]


class Databases:
    """Where an example's databases are: SQLite files in its directory, or PostgreSQL schemas."""

    def __init__(self, backend: str, folder: Path, stack: ExitStack) -> None:
        self.backend, self.folder, self._stack = backend, folder, stack
        self._urls: dict[str, str] = {}

    @property
    def postgres(self) -> bool:
        return self.backend == "postgresql"

    def url(self, name: str) -> str:
        if not self.postgres:
            return name
        if name not in self._urls:
            self._urls[name] = self._stack.enter_context(migrated_schema(server_url(), "docs"))
        return self._urls[name]

    def code(self, example: str) -> str:
        """The example with each database it names pointed at this backend's."""
        pg_urls = re.findall(r'"(postgresql://app@db\.internal[^"]*)"', example)
        for found in pg_urls:
            example = example.replace(f'"{found}"', repr(self.url("app.db")))
        for name in ("app.db", "payments.db", "chat.db"):
            example = example.replace(f'"{name}"', repr(self.url(name)))
        return example

    def run(self, *parts: str) -> list[str]:
        code = self.code("\n".join(parts))
        ran = subprocess.run(
            [sys.executable, "-c", code],
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, ran.stderr
        return ran.stdout.splitlines()

    def rows(self, name: str, sql: str) -> list[tuple[Any, ...]]:
        return tables.rows(self.url(name) if self.postgres else str(self.folder / name), sql)


@pytest.fixture(params=["sqlite", "postgresql"])
def dbs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Databases]:
    with ExitStack() as stack:
        yield Databases(str(request.param), tmp_path, stack)


def test_every_transaction_example_is_run() -> None:
    pages = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
    known = [*RUN_HERE, *RUN_ELSEWHERE, *NOT_RUN]
    for page in pages:
        for code in python_blocks(page):
            if USES_A_TRANSACTION.search(code):
                assert any(p == page and code.startswith(f) for p, f in known), (
                    f"{page}: no test runs the example starting {code[:60]!r}"
                )
    for example in known:
        block(example)  # each still exists, once
    for test_file, test in RUN_ELSEWHERE.values():
        assert test in (ROOT / test_file).read_text(encoding="utf-8")


def test_the_readme_api_and_receiver_examples_run(dbs: Databases) -> None:
    out = dbs.run(PAYMENTS, block(README_API), block(README_RECEIVER))
    assert out == ["done", "ch_42 False"]
    assert dbs.rows("app.db", "SELECT id, total FROM orders") == [(42, 1999)]
    assert dbs.rows("app.db", "SELECT key, state, result FROM oncewire_effects") == [
        ("order-42/charge", "done", '{"charge":"ch_1"}')
    ]
    assert dbs.rows("payments.db", "SELECT id, cents FROM charges") == [("ch_42", 1999)]
    assert dbs.rows("payments.db", "SELECT key, result FROM oncewire_receipts") == [
        ("order-42/charge", '"ch_42"')
    ]


def test_the_receiver_example_runs_and_replays(dbs: Databases) -> None:
    code = block(RECEIVER)
    assert dbs.run(code) == ["{'charge': 'ch_42'} False", "{'charge': 'ch_42'} True"]
    # A second run of the whole program: the receipt replays, no second charge.
    assert dbs.run(code) == ["{'charge': 'ch_42'} True", "{'charge': 'ch_42'} True"]
    assert dbs.rows("payments.db", "SELECT id, cents FROM charges") == [("ch_42", 1999)]
    assert dbs.rows("payments.db", "SELECT key FROM oncewire_receipts") == [("order-42/charge",)]


def test_a_sink_returning_run_onces_result_runs(dbs: Databases) -> None:
    """The receiver's example runs first; the sink then finds its receipt and replays it."""
    receiver = block(RECEIVER)
    dbs.run(receiver)
    work = re.search(r"^def charge_card\(tx\):\n(?:(?:    .*)?\n)+", receiver, flags=re.M)
    assert work is not None
    assert dbs.run(work.group(0), block(RECEIPT_RESULT)) == ["{'charge': 'ch_42'}"]
    assert dbs.rows("payments.db", "SELECT id, cents FROM charges") == [("ch_42", 1999)]
    assert dbs.rows("app.db", "SELECT key, state, result FROM oncewire_effects") == [
        ("order-42/charge", "done", '{"charge":"ch_42"}')
    ]
    (error,) = dbs.rows("app.db", "SELECT error FROM oncewire_attempts")
    assert str(error[0]).startswith("replayed")


def test_the_receipts_sink_example_runs(dbs: Databases) -> None:
    assert dbs.run(block(RECEIPTS_SINK)) == ["done"]
    assert dbs.rows("payments.db", "SELECT id, cents FROM charges") == [("order-7/charge", 700)]
    assert dbs.rows("payments.db", "SELECT key FROM oncewire_receipts") == [("order-7/charge",)]
    assert dbs.rows("app.db", "SELECT key, state, result FROM oncewire_effects") == [
        ("order-7/charge", "done", '{"charge":"order-7/charge"}')
    ]


def test_the_asyncio_examples_run(dbs: Databases) -> None:
    assert dbs.run(block(ASYNC_FIRST)) == ["pending"]
    assert dbs.rows("app.db", "SELECT id, total FROM orders") == [(42, 1999)]
    assert dbs.rows("app.db", "SELECT key, state FROM oncewire_effects") == [
        ("order-42/charge", "pending")
    ]
    assert dbs.run(block(ASYNC_RECEIPTS)) == ["ch_42 False"]
    assert dbs.run(block(ASYNC_RECEIPTS)) == ["ch_42 True"]
    dbs.run(block(ASYNC_RECEIPTS_SINK))
    assert sorted(dbs.rows("payments.db", "SELECT id, cents FROM charges")) == [
        ("ch_42", 1999),
        ("order-43/charge", 500),
    ]
    assert sorted(dbs.rows("payments.db", "SELECT key FROM oncewire_receipts")) == [
        ("order-42/charge",),
        ("order-43/charge",),
    ]
    # The sink also charged the first example's pending effect: its receipt replayed, once.
    assert sorted(dbs.rows("app.db", "SELECT key, state, result FROM oncewire_effects")) == [
        ("order-42/charge", "done", '{"charge":"ch_42"}'),
        ("order-43/charge", "done", '{"charge":"order-43/charge"}'),
    ]


def test_the_asyncio_accept_in_example_runs_on_postgresql(tmp_path: Path) -> None:
    """A caller's own psycopg.AsyncConnection: PostgreSQL only (a SQLite ledger refuses it)."""
    with ExitStack() as stack:
        dbs = Databases("postgresql", tmp_path, stack)
        dbs.run(block(ASYNC_ACCEPT_IN))
        assert dbs.rows("app.db", "SELECT id, total FROM orders") == [(42, 1999)]
        assert dbs.rows("app.db", "SELECT key, state FROM oncewire_effects") == [
            ("order-42/charge", "pending")
        ]


def test_the_observability_example_runs(dbs: Databases) -> None:
    dbs.run(block(OTEL))
    assert dbs.rows("app.db", "SELECT id, total FROM orders") == [(42, 1999)]
    assert dbs.rows("app.db", "SELECT key, kind, state FROM oncewire_effects") == [
        ("charge:42", "charge", "pending")
    ]


def test_the_postgres_guides_examples_run(dbs: Databases) -> None:
    """Its ledger.transaction() example runs unchanged on SQLite too; its caller's psycopg
    connection is PostgreSQL's own."""
    first = block(POSTGRES_TX)
    if not dbs.postgres:
        dbs.run(first)
        assert dbs.rows("app.db", "SELECT id FROM orders") == [(42,)]
        return
    dbs.run(first, block(POSTGRES_ACCEPT_IN))
    assert dbs.rows("app.db", "SELECT id FROM orders ORDER BY id") == [(42,), (43,)]
    assert dbs.rows("app.db", "SELECT key, state FROM oncewire_effects ORDER BY key") == [
        ("order-42/charge", "pending"),
        ("order-43/charge", "pending"),
    ]


def test_the_replies_commit_example_runs(dbs: Databases) -> None:
    dbs.run(block(REPLIES_COMMIT))
    (inbound,) = dbs.rows("chat.db", "SELECT id FROM oncewire_inbound")
    assert dbs.rows("chat.db", "SELECT inbound, text FROM transcript") == [
        (inbound[0], "you said: ho")
    ]
    assert dbs.rows("chat.db", "SELECT inbound_id, state, final_text FROM oncewire_replies") == [
        (inbound[0], "committed", "you said: ho")
    ]


def test_the_runs_examples_run(dbs: Databases) -> None:
    out = dbs.run(block(RUNS_REVIEW), block(RUNS_TURN))
    assert out == [
        "verified [('review-1', 'issues'), ('repair-1', None), ('review-2', 'pass')]",
        "answered",
    ]
    assert dbs.rows("app.db", "SELECT run_id, status FROM oncewire_runs ORDER BY run_id") == [
        ("run-1", "verified"),
        ("turn:1", "answered"),
    ]
    assert dbs.rows(
        "app.db", "SELECT finding_id, phase_id, candidate_id, severity FROM oncewire_run_findings"
    ) == [("f-1", "review-1", "c-1", "high")]
    assert dbs.rows("app.db", "SELECT key, kind FROM oncewire_effects") == [
        ("turn/1/s1/0", "tool.terminal")
    ]
    assert dbs.rows("app.db", "SELECT state, final_text FROM oncewire_replies") == [
        ("committed", "One file: a.txt")
    ]


def test_the_tool_calls_example_runs(dbs: Databases) -> None:
    told = "print(json.dumps([m['content'] for m in messages[2:]]))"
    (out,) = dbs.run(PAYMENTS, MODEL, block(TOOLS), told)
    assert out == (
        '["{\\"city\\": \\"Oslo\\", \\"sky\\": \\"clear\\"}", '
        '"error: the tool refused the call: refunds over 100 need a human"]'
    )
    assert dbs.rows("app.db", "SELECT id FROM turns") == [("turn-1",)]
    assert dbs.rows("app.db", "SELECT key, state FROM oncewire_effects ORDER BY key") == [
        ("turn-1/call_r", "rejected"),
        ("turn-1/call_w", "done"),
    ]
