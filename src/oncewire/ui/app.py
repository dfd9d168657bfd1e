"""The Starlette application: routes, the guard in front of them, templates from the package.

Every GET page answers ``?fragment=1`` with its content alone: each template extends
``layout``, which is the whole page (``base.html``) or its content alone (``fragment.html``),
so a fragment is rendered like the page, with everything its template imports. The page's
script (``/static/dashboard.js``, the only script there is) fetches that once a refresh period
(``data-refresh-ms`` on ``#live``, two seconds unless told) and swaps it in, so the data stays
current without a reload. Reads run in Starlette's thread pool;
the store gives each thread a connection of its own.

An effect's page is ``/effect?key=KEY``, a run's ``/run?id=ID`` and a LangGraph thread's
``/thread?id=ID``: a key in the query string reaches the server as it is stored, where a path
segment like ``..`` would be resolved away by the browser. ``/effects/KEY`` and ``/runs/ID``
answer too, for keys a path can carry. Every response carries the headers of
:mod:`oncewire.ui.headers`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode

from oncewire.core.extras import refusal

try:
    import jinja2
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, RedirectResponse, Response
    from starlette.routing import Route
    from starlette.types import ASGIApp
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("ui", "oncewire ui", exc) from exc

from oncewire.core.errors import ConfigurationError, InvalidState, OncewireError
from oncewire.ledger import Ledger
from oncewire.storage.records import EffectState
from oncewire.ui import labview, period, threads, views
from oncewire.ui.guard import COOKIE, Guard, Refusal
from oncewire.ui.headers import SecurityHeaders

__all__ = ["Dashboard", "create_app", "effect_url", "run_url", "thread_url"]

log = logging.getLogger("oncewire.ui")

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("oncewire.ui", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters["tojson_text"] = lambda v: json.dumps(v, ensure_ascii=False, sort_keys=True)


def effect_url(key: str) -> str:
    """The address of an effect's page, for any key (``a/../b``, ``..``, ``%2F`` included)."""
    return "/effect?" + urlencode({"key": key})


def run_url(run_id: str) -> str:
    """The address of a run's page, for any run id."""
    return "/run?" + urlencode({"id": run_id})


def thread_url(thread_id: str) -> str:
    """The address of a LangGraph thread's page, for any thread id."""
    return "/thread?" + urlencode({"id": thread_id})


_ENV.globals.update(effect_url=effect_url, run_url=run_url, thread_url=thread_url)
_STATIC_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class Dashboard:
    """What one server process serves: the store, the guard, preloaded evidence files, and
    how often its pages refresh (milliseconds)."""

    ledger: Ledger
    guard: Guard
    db_label: str
    evidence: list[tuple[str, dict[str, Any]]]
    refresh_ms: int = period.milliseconds(period.DEFAULT_SECONDS)

    def render(self, request: Request, name: str, http_status: int = 200, **data: Any) -> Response:
        template = _ENV.get_template(name)
        fragment = request.query_params.get("fragment") == "1"
        context = {
            "layout": "fragment.html" if fragment else "base.html",
            "page": name.removesuffix(".html"),
            "db_label": self.db_label,
            "actions": self.guard.allow_actions,
            "csrf": self.guard.csrf,
            "refresh_ms": self.refresh_ms,
            "path": request.url.path,
            **data,
        }
        return HTMLResponse(
            template.render(context), status_code=http_status, headers={"Cache-Control": "no-store"}
        )

    def refusal(self, request: Request, status: int, message: str) -> Response:
        return self.render(request, "error.html", http_status=status, message=message)


def _guarded(dash: Dashboard, handler: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        host = request.headers.get("host", "")
        auth = request.headers.get("authorization", "")
        bearer = auth[7:] if auth.lower().startswith("bearer ") else None
        offered = request.query_params.get("token")
        if offered is not None and dash.guard.token_matches(offered):
            # First visit with ?token=: keep it in a cookie and drop it from the address bar.
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(
                COOKIE, offered, httponly=True, samesite="strict", path="/", max_age=86400
            )
            return response
        try:
            dash.guard.check_request(host, bearer, request.cookies.get(COOKIE))
            return await handler(request)
        except Refusal as refusal:
            return dash.refusal(request, refusal.status, refusal.message)
        except (ConfigurationError, InvalidState) as exc:
            return dash.refusal(request, 409, f"{exc} [{exc.code}]")
        except OncewireError as exc:
            # Every ...NotFound has a code ending so; anything else is the store's trouble.
            status = 404 if exc.code.endswith("not_found") else 503
            return dash.refusal(request, status, f"{exc} [{exc.code}]")
        except Exception as exc:  # a bug: one line on the page, the traceback in the log
            log.exception("%s %s failed", request.method, request.url.path)
            return dash.refusal(request, 500, f"internal error: {type(exc).__name__}: {exc}")

    return wrapped


def _int(value: str | None, what: str) -> int | None:
    if value in (None, ""):
        return None
    try:
        number = int(value)
    except ValueError:
        raise Refusal(400, f"{what} must be a whole number, not {value!r}") from None
    if number < 0:
        raise Refusal(400, f"{what} must not be negative")
    return number


def _required(request: Request, name: str, page: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise Refusal(400, f"name the {page}: /{page}?{name}=...")
    return value


def _static_files() -> dict[str, tuple[bytes, str]]:
    """The dashboard's own files, read once: its script and style, and the lab report's style."""
    folder = resources.files("oncewire.ui") / "static"
    found = {
        entry.name: (entry.read_bytes(), _STATIC_TYPES[entry.name[entry.name.rindex(".") :]])
        for entry in folder.iterdir()
        if entry.name.endswith(tuple(_STATIC_TYPES))
    }
    found["lab.css"] = (labview.STYLE.encode("utf-8"), _STATIC_TYPES[".css"])
    return found


def create_app(
    ledger: Ledger,
    guard: Guard,
    *,
    db_label: str,
    evidence: list[tuple[str, dict[str, Any]]] | None = None,
    refresh_seconds: float = period.DEFAULT_SECONDS,
) -> ASGIApp:
    """The dashboard over ``ledger`` (opened by the caller, closed by the caller), its pages
    refreshing every ``refresh_seconds`` (0.1 to 3600; ConfigurationError otherwise)."""
    refresh_ms = period.milliseconds(refresh_seconds)
    dash = Dashboard(ledger, guard, db_label, list(evidence or []), refresh_ms)
    static = _static_files()

    def page(name: str, read: Callable[[Request], dict[str, Any]]) -> Handler:
        async def handler(request: Request) -> Response:
            data = await run_in_threadpool(read, request)
            return dash.render(request, name, **data)

        return handler

    def effects(request: Request) -> dict[str, Any]:
        q = request.query_params
        state = q.get("state") or None
        if state is not None and state not in {s.value for s in EffectState}:
            raise Refusal(400, f"unknown state {state!r}")
        return views.effects_page(
            ledger, state, q.get("kind") or None, _int(q.get("after"), "after")
        )

    def effect(request: Request) -> dict[str, Any]:
        key = request.path_params.get("key") or _required(request, "key", "effect")
        return {**views.effect_detail(ledger, key), "did": request.query_params.get("did", "")}

    def run(request: Request) -> dict[str, Any]:
        run_id = request.path_params.get("run_id") or _required(request, "id", "run")
        return views.run_detail(ledger, run_id)

    def thread(request: Request) -> dict[str, Any]:
        return threads.thread_detail(ledger, _required(request, "id", "thread"))

    async def action(request: Request) -> Response:
        verb = request.path_params["verb"]
        if verb not in ("retry", "cancel"):
            raise Refusal(404, f"no action {verb!r}: the actions are retry and cancel")
        body = (await request.body()).decode("utf-8", "replace")
        form = {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}
        guard.check_action(
            request.headers.get("host", ""),
            request.headers.get("origin"),
            form.get("csrf", ""),
            request.headers.get("sec-fetch-site"),
        )
        key = form.get("key", "")
        if not key:
            raise Refusal(400, f"name the effect to {verb} (a form field key); nothing was changed")
        if verb == "retry":
            done = await run_in_threadpool(ledger.effects.retry, key)
        else:
            reason = form.get("reason", "").strip() or "cancelled from the dashboard"
            done = await run_in_threadpool(ledger.effects.cancel, key, reason)
        target = f"{effect_url(key)}&{urlencode({'did': f'{verb}: now {done.state}'})}"
        return RedirectResponse(target, status_code=303)

    async def static_file(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in static:
            raise Refusal(404, f"no file {name!r} here")
        content, media_type = static[name]
        return Response(content, media_type=media_type, headers={"Cache-Control": "no-cache"})

    async def lab_render(request: Request) -> Response:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise Refusal(415, "send the evidence file as application/json")
        raw = await request.body()
        name = unquote(request.headers.get("x-evidence-name", "evidence.json"))
        html = labview.report(labview.parse(raw, name), name)
        return HTMLResponse(str(html), headers={"Cache-Control": "no-store"})

    def lab(request: Request) -> dict[str, Any]:
        return {"reports": [(name, labview.report(data, name)) for name, data in dash.evidence]}

    routes = [
        ("/", page("overview.html", lambda r: views.overview(ledger)), ["GET"]),
        ("/effects", page("effects.html", effects), ["GET"]),
        ("/effect", page("effect.html", effect), ["GET"]),
        ("/effect/{verb:str}", action, ["POST"]),
        ("/effects/{key:path}", page("effect.html", effect), ["GET"]),
        (
            "/receipts",
            page(
                "receipts.html",
                lambda r: views.receipts_page(ledger, r.query_params.get("after", "")),
            ),
            ["GET"],
        ),
        (
            "/chats",
            page(
                "chats.html",
                lambda r: views.chats(ledger, _int(r.query_params.get("after"), "after") or 0),
            ),
            ["GET"],
        ),
        (
            "/chats/{inbound_id:int}",
            page("chat.html", lambda r: views.chat_detail(ledger, r.path_params["inbound_id"])),
            ["GET"],
        ),
        (
            "/runs",
            page(
                "runs.html",
                lambda r: views.runs_page(
                    ledger, r.query_params.get("status") or None, r.query_params.get("after", "")
                ),
            ),
            ["GET"],
        ),
        ("/run", page("run.html", run), ["GET"]),
        ("/runs/{run_id:path}", page("run.html", run), ["GET"]),
        (
            "/threads",
            page(
                "threads.html",
                lambda r: threads.threads_page(ledger, r.query_params.get("after", "")),
            ),
            ["GET"],
        ),
        ("/thread", page("thread.html", thread), ["GET"]),
        ("/lab", page("lab.html", lab), ["GET"]),
        ("/lab/render", lab_render, ["POST"]),
        ("/static/{name:str}", static_file, ["GET"]),
    ]

    async def not_found(request: Request) -> Response:
        return dash.refusal(request, 404, f"no page at {request.url.path}")

    app = Starlette(
        routes=[
            Route(path, _guarded(dash, handler), methods=methods)
            for path, handler, methods in routes
        ]
        + [Route("/{rest:path}", _guarded(dash, not_found))],
    )
    return SecurityHeaders(app)
