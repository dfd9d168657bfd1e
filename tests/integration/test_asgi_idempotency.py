"""IdempotencyKeyMiddleware in a Starlette app served by a real uvicorn on loopback.

The draft's five cases over real HTTP (a first request runs and is stored, a repeat replays, the
same key with another body is 422, a repeat while the first is in flight is 409, a missing key on
a route that requires one is 400), plus what is never stored (a handler that raises, a 5xx) and
two servers on one store (two processes' worth of middleware) answering the same key at once.
What happened is read from the store through a connection of the test's own: the handler's
``charges`` rows, written with the recipe (``request.state.idempotency.write``), and the
receipts; the handler counts its own runs.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from oncewire.core.errors import ConfigurationError
from oncewire.receipts import Receipts
from oncewire.storage import Transaction
from tests.conftest import wait_for
from tests.support import tables

httpx2 = pytest.importorskip("httpx2")
pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")

from starlette.applications import Starlette  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, PlainTextResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from oncewire.asgi import IdempotencyKeyMiddleware  # noqa: E402


class Backend:
    """The receiver's database, read around oncewire."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.postgres = tables.dialect_of(url) == "postgresql"

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return tables.rows(self.url, sql)

    def charges(self) -> list[tuple[Any, ...]]:
        return self.rows("SELECT idem_key, cents FROM charges ORDER BY id")

    def receipts(self) -> list[str]:
        return [row[0] for row in self.rows("SELECT key FROM oncewire_receipts ORDER BY key")]


CHARGES = {
    "sqlite": "CREATE TABLE charges (id INTEGER PRIMARY KEY, idem_key TEXT, cents INTEGER)",
    "postgresql": "CREATE TABLE charges (id SERIAL PRIMARY KEY, idem_key TEXT, cents INT)",
}


@pytest.fixture
def backend(store_url: str) -> Backend:
    Receipts(store_url).close()  # creates oncewire's tables
    tables.execute(store_url, CHARGES[tables.dialect_of(store_url)])
    return Backend(store_url)


class Handlers:
    """The app's handlers; ``runs`` counts each handler run by key."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.lock = threading.Lock()
        self.runs: list[str] = []
        self.entered = threading.Event()  # /slow: a handler is inside
        self.release = threading.Event()  # /slow: let it finish

    def _count(self, request: Request) -> int:
        with self.lock:
            self.runs.append(request.headers.get("idempotency-key", "-"))
            return len(self.runs)

    async def charge(self, request: Request) -> Response:
        number = self._count(request)  # each run answers with a number of its own
        body = await request.json()
        if request.url.path == "/slow":
            self.entered.set()
            await asyncio.to_thread(self.release.wait, 30)
        idempotency = getattr(request.state, "idempotency", None)
        if idempotency is not None:  # the recipe: the row commits with the receipt
            sql = "INSERT INTO charges (idem_key, cents) VALUES (:key, :cents)"

            def insert(tx: Transaction, key: str = idempotency.key) -> None:
                tx.execute(sql, {"key": key, "cents": body["cents"]})

            idempotency.write(insert)
        return JSONResponse(
            {"charge": number, "cents": body["cents"]},
            status_code=201,
            headers={"Location": f"/charges/{number}", "Set-Cookie": "session=secret"},
        )

    async def boom(self, request: Request) -> Response:
        self._count(request)
        raise RuntimeError("the handler failed")

    async def unavailable(self, request: Request) -> Response:
        self._count(request)
        return PlainTextResponse("down", status_code=503)

    async def read(self, request: Request) -> Response:
        self._count(request)
        return PlainTextResponse("read")


def make_app(handlers: Handlers, receipts: Receipts) -> Starlette:
    routes = [
        Route("/charges", handlers.charge, methods=["POST", "GET"]),
        Route("/slow", handlers.charge, methods=["POST"]),
        Route("/required/charges", handlers.charge, methods=["POST"]),
        Route("/boom", handlers.boom, methods=["POST"]),
        Route("/unavailable", handlers.unavailable, methods=["POST"]),
        Route("/read", handlers.read, methods=["GET", "POST"]),
    ]
    keyed = Middleware(
        IdempotencyKeyMiddleware,
        receipts=receipts,
        required=lambda scope: scope["path"].startswith("/required/"),
    )
    return Starlette(routes=routes, middleware=[keyed])


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """A real uvicorn on 127.0.0.1, in a thread; yields its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=30, what="uvicorn to listen")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def site(backend: Backend) -> Iterator[tuple[str, Handlers, Backend]]:
    handlers = Handlers(backend)
    receipts = Receipts(backend.url)
    try:
        with serve(make_app(handlers, receipts)) as base:
            yield base, handlers, backend
    finally:
        handlers.release.set()
        receipts.close()


def post(url: str, body: dict[str, Any], key: str | None = None, **headers: str) -> httpx2.Response:
    if key is not None:
        headers["Idempotency-Key"] = key
    headers.setdefault("Content-Type", "application/json")
    return httpx2.post(url, content=json.dumps(body).encode(), headers=headers, timeout=60)


def test_the_first_request_runs_and_a_repeat_replays_its_response(
    site: tuple[str, Handlers, Backend],
) -> None:
    base, handlers, backend = site
    first = post(f"{base}/charges", {"cents": 1999}, "k-1")
    again = post(f"{base}/charges", {"cents": 1999}, '"k-1"')  # the draft's quoted form
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() == {"charge": 1, "cents": 1999}
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert again.headers["location"] == first.headers["location"] == "/charges/1"
    assert "set-cookie" in first.headers and "set-cookie" not in again.headers
    assert handlers.runs == ["k-1"]
    assert backend.charges() == [("k-1", 1999)]
    assert backend.receipts() == ["k-1"]


def test_the_same_key_with_another_body_is_422_and_nothing_runs(
    site: tuple[str, Handlers, Backend],
) -> None:
    base, handlers, backend = site
    assert post(f"{base}/charges", {"cents": 1999}, "k-2").status_code == 201
    other = post(f"{base}/charges", {"cents": 5}, "k-2")
    assert other.status_code == 422
    assert other.headers["content-type"] == "application/problem+json"
    elsewhere = post(f"{base}/slow", {"cents": 1999}, "k-2")  # another path is another request
    assert elsewhere.status_code == 422
    assert handlers.runs == ["k-2"]
    assert backend.charges() == [("k-2", 1999)]


def test_a_repeat_while_the_first_is_in_flight_is_409(
    site: tuple[str, Handlers, Backend],
) -> None:
    base, handlers, backend = site
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(post, f"{base}/slow", {"cents": 1999}, "k-3")
        wait_for(handlers.entered.is_set, timeout=30, what="the first request's handler")
        repeats = [pool.submit(post, f"{base}/slow", {"cents": 1999}, "k-3") for _ in range(3)]
        other = pool.submit(post, f"{base}/slow", {"cents": 7}, "k-3")
        assert [r.result().status_code for r in repeats] == [409, 409, 409]
        assert other.result().status_code == 422
        assert backend.charges() == []  # still in flight: nothing committed
        handlers.release.set()
        assert first.result().status_code == 201
    after = post(f"{base}/slow", {"cents": 1999}, "k-3")
    assert (after.status_code, after.headers["idempotent-replayed"]) == (201, "true")
    assert handlers.runs == ["k-3"]
    assert backend.charges() == [("k-3", 1999)]


def test_a_missing_key_on_a_route_that_requires_one_is_400(
    site: tuple[str, Handlers, Backend],
) -> None:
    base, handlers, backend = site
    missing = post(f"{base}/required/charges", {"cents": 1})
    assert missing.status_code == 400
    assert "Idempotency-Key" in missing.json()["title"]
    malformed = post(f"{base}/charges", {"cents": 1}, "x" * 256)
    assert malformed.status_code == 400
    # A route that does not require one runs without it, unkeyed (and stores nothing).
    assert post(f"{base}/charges", {"cents": 2}).status_code == 201
    # Methods that are not keyed pass through even with a key.
    assert httpx2.get(f"{base}/read", headers={"Idempotency-Key": "k-4"}).text == "read"
    assert handlers.runs == ["-", "k-4"]
    assert backend.charges() == []
    assert backend.receipts() == []


def test_a_handler_that_raises_stores_nothing_and_the_key_may_be_retried(
    site: tuple[str, Handlers, Backend],
) -> None:
    base, handlers, backend = site
    assert post(f"{base}/boom", {"cents": 1}, "k-5").status_code == 500
    assert post(f"{base}/boom", {"cents": 1}, "k-5").status_code == 500
    assert post(f"{base}/unavailable", {"cents": 1}, "k-6").status_code == 503
    assert post(f"{base}/unavailable", {"cents": 1}, "k-6").status_code == 503
    assert handlers.runs == ["k-5", "k-5", "k-6", "k-6"]  # each retry ran again
    assert backend.receipts() == []


def test_a_write_that_fails_stores_no_response_and_sends_500(
    backend: Backend,
) -> None:
    receipts = Receipts(backend.url)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        def broken(tx: Transaction) -> None:
            tx.execute("INSERT INTO charges (idem_key, cents) VALUES ('k-7', 1)")
            tx.execute("INSERT INTO no_such_table VALUES (1)")

        scope["state"]["idempotency"].write(broken)
        response = PlainTextResponse("charged", status_code=201)
        await response(scope, receive, send)

    try:
        with serve(IdempotencyKeyMiddleware(app, receipts=receipts)) as base:
            answer = post(f"{base}/x", {"cents": 1}, "k-7")
    finally:
        receipts.close()
    assert answer.status_code == 500  # the handler's 201 never happened: its writes failed
    assert backend.charges() == []  # the first insert rolled back with the rest
    assert backend.receipts() == []


def test_two_servers_on_one_store_do_the_work_of_a_key_once(backend: Backend) -> None:
    """Two middleware instances (as in two worker processes) cannot see each other's flights:
    both handlers run, one commits, and the other answers with the committed response."""
    handlers = Handlers(backend)
    stores: list[Receipts] = [Receipts(backend.url), Receipts(backend.url)]
    try:
        with (
            serve(make_app(handlers, stores[0])) as one,
            serve(make_app(handlers, stores[1])) as two,
            ThreadPoolExecutor(max_workers=2) as pool,
        ):
            calls: list[Callable[[], httpx2.Response]] = [
                lambda: post(f"{one}/slow", {"cents": 300}, "k-8"),
                lambda: post(f"{two}/slow", {"cents": 300}, "k-8"),
            ]
            futures = [pool.submit(call) for call in calls]
            wait_for(lambda: len(handlers.runs) == 2, timeout=30, what="both handlers")
            handlers.release.set()
            answers = [f.result() for f in futures]
    finally:
        handlers.release.set()
        for receipts in stores:
            receipts.close()
    assert [a.status_code for a in answers] == [201, 201]
    assert answers[0].json() == answers[1].json()  # one committed response, sent to both
    assert sorted(a.headers.get("idempotent-replayed", "-") for a in answers) == ["-", "true"]
    assert backend.charges() == [("k-8", 300)]
    assert backend.receipts() == ["k-8"]


@pytest.fixture
def recipe_db(store_url: str, tmp_path: Path) -> Backend:
    """An empty receiver database for the documented recipe, which creates its own table: the
    file the recipe names on SQLite, the test's schema on PostgreSQL."""
    if tables.dialect_of(store_url) == "sqlite":
        return Backend(str(tmp_path / "payments.db"))
    return Backend(store_url)


def test_the_documented_recipe_runs_as_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recipe_db: Backend
) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "http.md").read_text("utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    recipe = next(b for b in blocks if "def create_charge" in b)
    if recipe_db.postgres:  # the same code, its database on PostgreSQL
        recipe = recipe.replace('"payments.db"', repr(recipe_db.url))
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "recipe"}
    exec(compile(recipe, "docs/http.md", "exec"), namespace)
    try:
        with serve(namespace["app"]) as base:
            first = post(f"{base}/charges", {"cents": 1999}, "order-42")
            again = post(f"{base}/charges", {"cents": 1999}, "order-42")
            keyless = post(f"{base}/charges", {"cents": 1999})
    finally:
        namespace["receipts"].close()
    assert (first.status_code, again.status_code, keyless.status_code) == (201, 201, 400)
    assert first.json() == again.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert recipe_db.rows("SELECT id, cents FROM charges") == [(first.json()["charge"], 1999)]
    assert recipe_db.receipts() == ["order-42"]


def test_a_fastapi_app_runs_a_key_once(backend: Backend) -> None:
    """The same middleware in front of FastAPI (a pydantic body, add_middleware); skipped where
    FastAPI is not installed (a dev dependency, not one of oncewire's own)."""
    fastapi = pytest.importorskip("fastapi")
    pydantic = pytest.importorskip("pydantic")

    class Charge(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        cents: int

    runs: list[int] = []
    app = fastapi.FastAPI()
    receipts = Receipts(backend.url)
    app.add_middleware(IdempotencyKeyMiddleware, receipts=receipts, required=True)

    async def charge(charge: Charge, request: fastapi.Request) -> dict[str, int]:
        runs.append(charge.cents)
        sql = "INSERT INTO charges (idem_key, cents) VALUES (:key, :cents)"
        key = request.state.idempotency.key
        values = {"key": key, "cents": charge.cents}
        request.state.idempotency.write(lambda tx: tx.execute(sql, values))
        return {"charge": len(runs)}

    # This module's annotations are strings, and Charge is local: FastAPI gets the objects.
    charge.__annotations__.update(charge=Charge, request=fastapi.Request)
    app.post("/charges", status_code=201)(charge)
    try:
        with serve(app) as base:
            first = post(f"{base}/charges", {"cents": 250}, "fa-1")
            again = post(f"{base}/charges", {"cents": 250}, "fa-1")
            other = post(f"{base}/charges", {"cents": 9}, "fa-1")
            keyless = post(f"{base}/charges", {"cents": 250})
    finally:
        receipts.close()
    assert [a.status_code for a in (first, again, other, keyless)] == [201, 201, 422, 400]
    assert first.json() == again.json() == {"charge": 1}
    assert again.headers["idempotent-replayed"] == "true"
    assert runs == [250]
    assert backend.charges() == [("fa-1", 250)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"receipts": None}, "receipts must be an oncewire.Receipts"),
        ({"receipts": "payments.db"}, "receipts must be an oncewire.Receipts"),
        ({"methods": "POST"}, "methods must be a collection"),
        ({"required": "yes"}, "required must be True, False or a function"),
    ],
)
def test_a_middleware_that_cannot_work_is_refused_when_built(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    """Refused where the app is assembled, not at the first keyed request."""
    receipts = Receipts(str(tmp_path / "r.db"))
    try:
        with pytest.raises(ConfigurationError, match=message):
            IdempotencyKeyMiddleware(lambda *a: None, **{"receipts": receipts, **kwargs})
    finally:
        receipts.close()
