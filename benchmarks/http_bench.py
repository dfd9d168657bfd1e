"""HTTP out and in: HttpSink effects/s and IdempotencyKeyMiddleware's cost per request.

    .venv/bin/python benchmarks/http_bench.py [--quick] [--rounds N] [--json FILE]

Every server runs in a child process of its own on 127.0.0.1 (so that it does not share this
process's interpreter lock), and every figure is compared with a floor measured in the same run:

* ``raw httpx2 POST loop``: one keep-alive client posting the same JSON bodies one after the
  other to the counting server (the floor of the sink rows);
* ``HttpSink, called directly``: the sink awaited once per attempt, one after the other (what
  the sink adds to a POST: the canonical JSON, the headers, the outcome);
* ``Dispatcher + HttpSink``: effects accepted on a fresh SQLite ledger (WAL, synchronous=FULL),
  then dispatched until idle, with ``concurrency`` 1 and 8; every claim, outcome and commit
  included;
* ``Starlette, no middleware`` (floor of the middleware rows) and ``Starlette +
  IdempotencyKeyMiddleware``: the same one-route app on uvicorn, POSTed one request after the
  other with a new key each (a first request: its receipt committed on SQLite before the
  answer), and with one key repeated (a replay). The overhead is per request, in milliseconds.

The counting server's journal is read back after each sink row: every effect must have arrived
exactly once, or the run fails. Timings on shared machines are noisy: compare rows of the same
run, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve()
try:
    import oncewire
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(HERE.parents[1] / "src"))
    import oncewire

import httpx2  # noqa: E402

from oncewire.dispatch import Dispatcher  # noqa: E402
from oncewire.effects.attempt import Attempt  # noqa: E402
from oncewire.ledger import Ledger  # noqa: E402
from oncewire.sinks import HttpSink  # noqa: E402
from oncewire.storage.records import EffectState  # noqa: E402

PAYLOAD = {"order": "order-0", "cents": 1999, "currency": "EUR", "note": "x" * 64}


# -- the servers (child processes) ------------------------------------------------------------
def serve_counter(port_file: Path) -> None:
    """A counting HTTP/1.1 server: answers every POST 200 with a small JSON body and keeps the
    Idempotency-Key of each; GET /count answers how many requests and distinct keys arrived."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    lock = threading.Lock()
    keys: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # The headers and the body are two writes: without this, the body waits for the
        # client's delayed ACK of the headers (40 ms on Linux) and every row measures that.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                keys.append(self.headers.get("Idempotency-Key", ""))
            self._answer(b'{"ok": true}')

        def do_GET(self) -> None:
            with lock:
                body = json.dumps({"requests": len(keys), "keys": len(set(keys) - {""})})
                if self.path == "/reset":
                    keys.clear()
            self._answer(body.encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port_file.write_text(str(server.server_address[1]))
    server.serve_forever()


def serve_app(port_file: Path, db: str) -> None:
    """The one-route Starlette app on uvicorn; with ``db``, behind IdempotencyKeyMiddleware."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from oncewire.asgi import IdempotencyKeyMiddleware
    from oncewire.receipts import Receipts

    async def charge(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"charged": body["cents"]}, status_code=201)

    middleware = []
    if db:
        middleware = [Middleware(IdempotencyKeyMiddleware, receipts=Receipts(db))]
    app = Starlette(routes=[Route("/charge", charge, methods=["POST"])], middleware=middleware)
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it each response's body waits for the client's delayed ACK of its headers.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port_file.write_text(str(sock.getsockname()[1]))
    config = uvicorn.Config(app, log_level="critical", lifespan="off", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


class Child:
    """A server child process; its port read from the file it writes."""

    def __init__(self, folder: Path, *args: str) -> None:
        port_file = folder / f"port-{time.monotonic_ns()}"
        self.process = subprocess.Popen(
            [sys.executable, str(HERE), "--serve", str(port_file), *args],
            stdout=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(HERE.parents[1] / "src")},
        )
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text()):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError(f"the server {args} did not start")
            time.sleep(0.02)
        self.base = f"http://127.0.0.1:{int(port_file.read_text())}"
        wait_until_answering(self.base)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def wait_until_answering(base: str) -> None:
    url = urlsplit(base)
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection((url.hostname, url.port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


# -- the workloads ----------------------------------------------------------------------------
def counted(base: str) -> dict[str, int]:
    answer: dict[str, int] = httpx2.get(f"{base}/reset", timeout=30).json()
    return answer


def raw_loop(base: str, n: int) -> dict[str, Any]:
    body = json.dumps(PAYLOAD).encode()
    with httpx2.Client(timeout=30) as client:
        start = time.perf_counter()
        for i in range(n):
            client.post(
                f"{base}/raw",
                content=body,
                headers={"Content-Type": "application/json", "Idempotency-Key": f"raw-{i}"},
            ).raise_for_status()
        seconds = time.perf_counter() - start
    return {"ops": n, "seconds": seconds, "arrived": counted(base)}


def sink_direct(base: str, n: int) -> dict[str, Any]:
    sink = HttpSink(f"{base}/sink")

    async def run() -> float:
        start = time.perf_counter()
        for i in range(n):
            outcome = await sink(Attempt(f"direct-{i}", "charge", PAYLOAD, 1, False, 1))
            if outcome != oncewire.Done({"ok": True}):
                raise RuntimeError(f"unexpected outcome {outcome}")
        seconds = time.perf_counter() - start
        await sink.aclose()
        return seconds

    return {"ops": n, "seconds": asyncio.run(run()), "arrived": counted(base)}


def dispatched(base: str, folder: Path, n: int, concurrency: int) -> dict[str, Any]:
    folder.mkdir(exist_ok=True)
    with Ledger(str(folder / f"out-{concurrency}.db")) as ledger:
        with ledger.transaction() as tx:
            for i in range(n):
                tx.accept(f"effect-{i}", "charge", {**PAYLOAD, "order": f"order-{i}"})
        dispatcher = Dispatcher(
            ledger, {"charge": HttpSink(f"{base}/dispatch")}, concurrency=concurrency
        )
        start = time.perf_counter()
        stats = dispatcher.run(until_idle=True, handle_signals=False)
        seconds = time.perf_counter() - start
        done = ledger.effects.counts().get(EffectState.DONE, 0)
    if done != n:
        raise RuntimeError(f"{done} of {n} effects done ({stats})")
    return {"ops": n, "seconds": seconds, "arrived": counted(base)}


def requests_loop(base: str, n: int, *, keyed: bool, repeat: bool) -> dict[str, Any]:
    body = json.dumps({"cents": 1999}).encode()
    with httpx2.Client(timeout=30) as client:
        prefix = f"{time.monotonic_ns()}"
        if repeat:  # the key's first request, before the clock starts
            client.post(f"{base}/charge", content=body, headers={"Idempotency-Key": f"{prefix}-r"})
        start = time.perf_counter()
        for i in range(n):
            headers = {}
            if keyed:
                headers["Idempotency-Key"] = f"{prefix}-r" if repeat else f"{prefix}-{i}"
            answer = client.post(f"{base}/charge", content=body, headers=headers)
            if answer.status_code != 201:
                raise RuntimeError(f"HTTP {answer.status_code}: {answer.text}")
            if repeat and answer.headers.get("idempotent-replayed") != "true":
                raise RuntimeError("a repeat was not replayed")
        seconds = time.perf_counter() - start
    return {"ops": n, "seconds": seconds}


# -- the run --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--rounds", type=int, help="rounds per workload; the median is shown")
    parser.add_argument("--n", type=int, help="requests per workload (default 2000; 40 quick)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        port_file, *rest = args.serve
        if rest[0] == "counter":
            serve_counter(Path(port_file))
        else:
            serve_app(Path(port_file), rest[1] if len(rest) > 1 else "")
        return 0
    rounds_n = args.rounds or (1 if args.quick else 3)
    n = args.n or (40 if args.quick else 2000)
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="oncewire-http-bench-") as tmp:
        folder = Path(tmp)
        counter = Child(folder, "counter")
        plain = Child(folder, "app")
        keyed = Child(folder, "app", str(folder / "receipts.db"))
        try:
            workloads: list[tuple[str, str, Callable[[int], dict[str, Any]]]] = [
                ("raw httpx2 POST loop", "out", lambda r: raw_loop(counter.base, n)),
                ("HttpSink, called directly", "out", lambda r: sink_direct(counter.base, n)),
                (
                    "Dispatcher + HttpSink, concurrency 1",
                    "out",
                    lambda r: dispatched(counter.base, folder / f"r{r}c1", n, 1),
                ),
                (
                    "Dispatcher + HttpSink, concurrency 8",
                    "out",
                    lambda r: dispatched(counter.base, folder / f"r{r}c8", n, 8),
                ),
                (
                    "Starlette, no middleware",
                    "in",
                    lambda r: requests_loop(plain.base, n, keyed=False, repeat=False),
                ),
                (
                    "Starlette + middleware, new key each",
                    "in",
                    lambda r: requests_loop(keyed.base, n, keyed=True, repeat=False),
                ),
                (
                    "Starlette + middleware, one key replayed",
                    "in",
                    lambda r: requests_loop(keyed.base, n, keyed=True, repeat=True),
                ),
            ]
            for round_number in range(rounds_n):
                for label, _, run in workloads:
                    print(f"round {round_number + 1}: {label} ...", file=sys.stderr, flush=True)
                    figures = run(round_number)
                    arrived = figures.get("arrived")
                    if arrived is not None and arrived != {"requests": n, "keys": n}:
                        raise RuntimeError(f"{label}: the server counted {arrived}, not {n}")
                    figures["per_second"] = figures["ops"] / figures["seconds"]
                    figures["ms_per_op"] = 1000 * figures["seconds"] / figures["ops"]
                    rows.setdefault(label, []).append(figures)
        finally:
            for child in (counter, plain, keyed):
                child.close()
    results: dict[str, dict[str, Any]] = {}
    for label, runs in rows.items():
        runs.sort(key=lambda f: f["per_second"])
        middle = runs[len(runs) // 2]
        results[label] = {
            "per_second": middle["per_second"],
            "ms_per_op": middle["ms_per_op"],
            "n": n,
            "rounds": [r["per_second"] for r in runs],
        }
    out_floor = results["raw httpx2 POST loop"]
    in_floor = results["Starlette, no middleware"]
    for label, figures in results.items():
        side = next(s for lab, s, _ in workloads if lab == label)
        floor = out_floor if side == "out" else in_floor
        figures["x_floor"] = figures["per_second"] / floor["per_second"]
        figures["overhead_ms"] = figures["ms_per_op"] - floor["ms_per_op"]
    print(
        f"oncewire {oncewire.__version__} HTTP benchmark, Python {platform.python_version()}, "
        f"{n} requests per row, median of {rounds_n}{' (quick)' if args.quick else ''}"
    )
    header = f"{'workload':42} {'per s':>9} {'ms/op':>8} {'x floor':>8} {'+ms vs floor':>13}"
    print(header)
    print("-" * len(header))
    for label, f in results.items():
        print(
            f"{label:42} {f['per_second']:9.0f} {f['ms_per_op']:8.3f} {f['x_floor']:8.2f} "
            f"{f['overhead_ms']:+13.3f}"
        )
    if args.json:
        document = {
            "benchmark": "http",
            "version": oncewire.__version__,
            "python": platform.python_version(),
            "n": n,
            "rounds": rounds_n,
            "quick": args.quick,
            "figures": results,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
