"""The Starlette application: routes, the guard in front of them, templates from the package.

Every GET page answers ``?fragment=1`` with its content alone: the page's script fetches that
every two seconds and swaps it in, so the data stays current without a reload (and without a
second set of templates). Reads run in Starlette's thread pool; the store gives each thread a
connection of its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode

from oncewire.core.extras import refusal

try:
    import jinja2
    from markupsafe import Markup
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, RedirectResponse, Response
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("ui", "oncewire ui", exc) from exc

from oncewire.core.errors import ConfigurationError, InvalidState, OncewireError
from oncewire.ledger import Ledger
from oncewire.storage.records import EffectState
from oncewire.ui import labview, views
from oncewire.ui.guard import COOKIE, Guard, Refusal

__all__ = ["Dashboard", "create_app"]

log = logging.getLogger("oncewire.ui")

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("oncewire.ui", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters["tojson_text"] = lambda v: json.dumps(v, ensure_ascii=False, sort_keys=True)

Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class Dashboard:
    """What one server process serves: the store, the guard, preloaded evidence files."""

    ledger: Ledger
    guard: Guard
    db_label: str
    evidence: list[tuple[str, dict[str, Any]]]

    def render(self, request: Request, name: str, http_status: int = 200, **data: Any) -> Response:
        template = _ENV.get_template(name)
        context = {
            "page": name.removesuffix(".html"),
            "db_label": self.db_label,
            "actions": self.guard.allow_actions,
            "csrf": self.guard.csrf,
            "path": request.url.path,
            **data,
        }
        if request.query_params.get("fragment") == "1" and "content" in template.blocks:
            block = template.blocks["content"]
            html = "".join(block(template.new_context(context)))
        else:
            html = template.render(context)
        return HTMLResponse(html, status_code=http_status, headers={"Cache-Control": "no-store"})

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


def create_app(
    ledger: Ledger,
    guard: Guard,
    *,
    db_label: str,
    evidence: list[tuple[str, dict[str, Any]]] | None = None,
) -> Starlette:
    """The dashboard over ``ledger`` (opened by the caller, closed by the caller)."""
    dash = Dashboard(ledger, guard, db_label, list(evidence or []))

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

    async def action(request: Request) -> Response:
        key = request.path_params["key"]
        verb = request.path_params["verb"]
        if verb not in ("retry", "cancel"):
            raise Refusal(404, f"no action {verb!r}: the actions are retry and cancel")
        body = (await request.body()).decode("utf-8", "replace")
        form = {k: v[0] for k, v in parse_qs(body).items()}
        guard.check_action(
            request.headers.get("host", ""), request.headers.get("origin"), form.get("csrf", "")
        )
        if verb == "retry":
            done = await run_in_threadpool(ledger.effects.retry, key)
        else:
            reason = form.get("reason", "").strip() or "cancelled from the dashboard"
            done = await run_in_threadpool(ledger.effects.cancel, key, reason)
        target = f"/effects/{key}?{urlencode({'did': f'{verb}: now {done.state}'})}"
        return RedirectResponse(target, status_code=303)

    async def lab_render(request: Request) -> Response:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise Refusal(415, "send the evidence file as application/json")
        raw = await request.body()
        name = unquote(request.headers.get("x-evidence-name", "evidence.json"))
        html = labview.report(labview.parse(raw, name), name)
        return HTMLResponse(str(html), headers={"Cache-Control": "no-store"})

    def lab(request: Request) -> dict[str, Any]:
        return {
            "reports": [(name, labview.report(data, name)) for name, data in dash.evidence],
            "lab_style": Markup(labview.STYLE),
        }

    routes = [
        ("/", page("overview.html", lambda r: views.overview(ledger)), ["GET"]),
        ("/effects", page("effects.html", effects), ["GET"]),
        (
            "/effects/{key:path}/{verb:str}",
            action,
            ["POST"],
        ),
        (
            "/effects/{key:path}",
            page(
                "effect.html",
                lambda r: {
                    **views.effect_detail(ledger, r.path_params["key"]),
                    "did": r.query_params.get("did", ""),
                },
            ),
            ["GET"],
        ),
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
        (
            "/runs/{run_id:path}",
            page("run.html", lambda r: views.run_detail(ledger, r.path_params["run_id"])),
            ["GET"],
        ),
        ("/lab", page("lab.html", lab), ["GET"]),
        ("/lab/render", lab_render, ["POST"]),
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
    return app
