"""The dashboard's routes, added to the API's FastAPI app by :func:`add_dashboard` (none in the OpenAPI schema).

==============================  ==================================================================================
``GET /login``, ``POST /login``  the login form; a good token starts a session (cookie ``corral_session``)
``POST /logout``                 ends it
``GET /``                        cluster: nodes, GPUs, who is on each, allocated against used over the last hour
``GET /tenants``, ``/tenants/N`` quotas, guaranteed and opportunistic use, shortfall over time
``GET /queue``                   pending jobs in the policy's order, why each waits and for how long
``GET /jobs/ID``                 a job: its timeline, runs, step time against solo, memory, share, rung, log
``GET /scheduler``               round latency, decisions per round, preemptions, resizes, jobs per phase (admin)
``GET /ui/data/...``             the same pages as JSON, polled every 2 s by ``static/dashboard.js``
``GET /ui/static/...``           the script, the style sheet and uPlot (vendored): nothing comes from the network
==============================  ==================================================================================

Pages without a session redirect (303) to ``/login``; the JSON answers 401. The login form's body is parsed here
with :mod:`urllib.parse` (no python-multipart for one field). Routes that read the controller are plain ``def``,
run in FastAPI's thread pool as the API's are.

Why polling and not server-sent events: a poll is a short request, so the server holds no connection per open
tab (uvicorn's connection count and a proxy's idle timeouts never come into it), it works unchanged behind any
proxy, and a tab left open costs one small request every 2 s; ``benchmarks/bench_dashboard.py`` measures that
the controller's rounds do not notice it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from corral import __version__
from corral.live.api.app import Principal, _Tokens
from corral.live.dashboard import pages
from corral.live.dashboard.cells import html_rows
from corral.live.dashboard.history import DEFAULT_EVERY_S, DEFAULT_WINDOW_S, History, LatestCluster
from corral.live.dashboard.sessions import COOKIE, DEFAULT_TTL_S, Sessions

if TYPE_CHECKING:
    from corral.live.controller import Controller

HERE = Path(__file__).parent
TEMPLATES_DIR = HERE / "templates"
STATIC_DIR = HERE / "static"
STATIC_URL = "/ui/static"
DATA_URL = "/ui/data"
POLL_S = 2.0
# Every asset is this server's: the browser refuses anything else (a stray CDN link fails loudly in tests).
# Inline styles are allowed for uPlot, which sizes its canvas that way; no inline script anywhere.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
HEADERS = {"Cache-Control": "no-store", "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}

# The pages of the navigation bar: path, title, admin only.
NAV = (
    ("/", "Cluster", False),
    ("/tenants", "Tenants", False),
    ("/queue", "Queue", False),
    ("/scheduler", "Scheduler", True),
)

# What each page lays out, top to bottom, from its data: ("table", id, heading), ("charts", heading, ids or None
# for all), ("log", heading). The script fills the same ids from the JSON.
Layout = Sequence[tuple[Any, ...]]
LAYOUTS: dict[str, Layout] = {
    "cluster": (
        ("table", "gpus", "GPUs"),
        ("charts", "Allocated against used, last hour", None),
        ("table", "nodes", "Nodes"),
    ),
    "tenants": (("table", "tenants", "Tenants"), ("charts", "Quota and use over time (GPUs)", None)),
    "tenant": (
        ("table", "tenant", "Now"),
        ("charts", "Quota and use over time (GPUs)", None),
        ("table", "jobs", "Jobs (newest first)"),
    ),
    "queue": (("table", "queue", "Pending jobs, in the policy's order"),),
    "job": (("table", "events", "Timeline"), ("charts", "Over time", None), ("table", "runs", "Runs"), ("log", "Log")),
    "scheduler": (
        ("charts", "Over time", None),
        ("table", "buckets", "Round latency"),
        ("table", "events", "Job events"),
    ),
}


class Dashboard:
    """The dashboard of one app: its sessions, its history, its templates."""

    def __init__(
        self,
        controller: Controller,
        tokens: _Tokens,
        *,
        every_s: float = DEFAULT_EVERY_S,
        window_s: float = DEFAULT_WINDOW_S,
        session_ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        self.tokens = tokens
        self.sessions = Sessions(session_ttl_s)
        latest = LatestCluster(controller)
        self.history = History(controller, latest, every_s=every_s, window_s=window_s)
        topology = controller.topology
        self.ctx = pages.Context(
            controller=controller,
            latest=latest,
            history=self.history,
            gpu_order=controller.gpu_order,
            node_of=lambda g: topology.node_names[topology.gpu_node[g]],
        )
        self.templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
        self.templates.env.filters["rows"] = html_rows

    def who(self, request: Request) -> Principal | None:
        return self.sessions.get(request.cookies.get(COOKIE))

    def latest_sample_s(self) -> float:
        with self.history.lock:
            return self.history.cluster[-1].time_s if self.history.cluster else 0.0


def add_dashboard(
    app: FastAPI,
    controller: Controller,
    tokens: _Tokens,
    *,
    every_s: float = DEFAULT_EVERY_S,
    window_s: float = DEFAULT_WINDOW_S,
    session_ttl_s: float = DEFAULT_TTL_S,
) -> Dashboard:
    """Add the dashboard to ``app`` (the API of ``controller``, whose tokens are ``tokens``). Its history is
    sampled by a thread started and stopped with the app's lifespan."""
    dash = Dashboard(controller, tokens, every_s=every_s, window_s=window_s, session_ttl_s=session_ttl_s)
    app.state.dashboard = dash
    app.mount(STATIC_URL, StaticFiles(directory=str(STATIC_DIR)), name="dashboard-static")
    _lifespan(app, dash.history)
    _login_routes(app, dash)
    _page_routes(app, dash)
    _data_routes(app, dash)
    return dash


def _lifespan(app: FastAPI, history: History) -> None:
    """Run the history's thread while the app runs: wrap the app's lifespan (start before it, stop after)."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(the_app: Any) -> AsyncIterator[Any]:
        history.start()
        try:
            async with inner(the_app) as state:
                yield state
        finally:
            await asyncio.to_thread(history.stop)  # joins the thread: not on the event loop

    app.router.lifespan_context = lifespan


def _root(request: Request) -> str:
    # Behind a proxy that serves corral under a prefix, every link needs it (as the API's /docs does).
    return str(request.scope.get("root_path", "")).rstrip("/")


def _since(request: Request) -> float:
    try:
        since = float(request.query_params.get("since", "0"))
    except ValueError:
        return 0.0
    return since if math.isfinite(since) else 0.0


# -- login ---------------------------------------------------------------------------------------------------------
def _login_routes(app: FastAPI, dash: Dashboard) -> None:
    def form(request: Request, message: str | None = None, status: int = 200) -> Response:
        context = {"root": _root(request), "message": message, "version": __version__, "title": "Log in", "nav": None}
        return dash.templates.TemplateResponse(request, "login.html", context, status_code=status, headers=HEADERS)

    @app.get("/login", include_in_schema=False)
    def login_form(request: Request) -> Response:
        if dash.who(request) is not None:
            return RedirectResponse(_root(request) + "/", status_code=303)
        return form(request)

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        body = (await request.body()).decode("utf-8", errors="replace")
        token = (parse_qs(body, keep_blank_values=True).get("token") or [""])[0].strip()
        # _Tokens reads a header's Latin-1 text back into its bytes: hand it the UTF-8 bytes of the form's token
        # that way, so that a non-ASCII token matches as it does in the header.
        who = dash.tokens.principal(token.encode("utf-8").decode("latin-1")) if token else None
        if who is None:
            # The same words for every failure: nothing says whether a token (or a tenant) exists.
            return form(request, "That token is not valid here. Use the admin token or a tenant's token.", 401)
        session_id = dash.sessions.create(who)
        response = RedirectResponse(_root(request) + "/", status_code=303)
        response.set_cookie(
            COOKIE,
            session_id,
            max_age=int(dash.sessions.ttl_s),
            path="/",
            httponly=True,  # no script reads it
            samesite="strict",  # never sent by another site's page: no cross-site request acts as the user
            secure=request.url.scheme == "https",
        )
        return response

    @app.post("/logout", include_in_schema=False)
    def logout(request: Request) -> Response:
        dash.sessions.end(request.cookies.get(COOKIE))
        response = RedirectResponse(_root(request) + "/login", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response


# -- pages ---------------------------------------------------------------------------------------------------------
def _page_routes(app: FastAPI, dash: Dashboard) -> None:
    def render(
        request: Request, page: str, title: str, src: str, build: Callable[[Principal], dict[str, Any]]
    ) -> Response:
        who = dash.who(request)
        root = _root(request)
        if who is None:
            return RedirectResponse(root + "/login", status_code=303)
        try:
            data = build(who)
        except pages.NotFound as e:
            return _error(dash, request, who, 404, "Not found", str(e))
        except pages.Forbidden as e:
            return _error(dash, request, who, 403, "Not yours", str(e))
        data["now"] = dash.latest_sample_s()
        context = {
            "root": root,
            "page": page,
            "title": title,
            "src": root + DATA_URL + src,
            "data": data,
            "layout": LAYOUTS[page],
            "nav": _nav(who, request.url.path.removeprefix(root)),
            "who": _who(who),
            "window_s": dash.history.window_s,
            "poll_s": POLL_S,
            "version": __version__,
        }
        return dash.templates.TemplateResponse(request, "page.html", context, headers=HEADERS)

    ctx = dash.ctx

    @app.get("/", include_in_schema=False)
    def cluster(request: Request) -> Response:
        return render(request, "cluster", "Cluster", "/cluster", lambda who: pages.cluster_page(ctx, who, 0.0))

    @app.get("/tenants", include_in_schema=False)
    def tenants(request: Request) -> Response:
        return render(request, "tenants", "Tenants", "/tenants", lambda who: pages.tenants_page(ctx, who, 0.0))

    @app.get("/tenants/{name}", include_in_schema=False)
    def tenant(request: Request, name: str) -> Response:
        return render(
            request, "tenant", f"Tenant {name}", f"/tenants/{name}", lambda w: pages.tenant_page(ctx, w, name, 0.0)
        )

    @app.get("/queue", include_in_schema=False)
    def queue(request: Request) -> Response:
        return render(request, "queue", "Queue", "/queue", lambda who: pages.queue_page(ctx, who))

    @app.get("/jobs/{job_id}", include_in_schema=False)
    def job(request: Request, job_id: str) -> Response:
        return render(request, "job", f"Job {job_id}", f"/jobs/{job_id}", lambda w: pages.job_page(ctx, w, job_id, 0.0))

    @app.get("/scheduler", include_in_schema=False)
    def scheduler(request: Request) -> Response:
        return render(request, "scheduler", "Scheduler", "/scheduler", lambda w: pages.scheduler_page(ctx, w, 0.0))


def _nav(who: Principal, path: str) -> list[dict[str, Any]]:
    out = []
    for href, title, admin_only in NAV:
        if admin_only and not who.admin:
            continue
        current = path == href or (href != "/" and path.startswith(href + "/"))
        out.append({"href": href, "title": title, "current": current})
    return out


def _who(who: Principal) -> str:
    return "admin" if who.tenant is None else f"tenant {who.tenant}"


def _error(dash: Dashboard, request: Request, who: Principal, status: int, title: str, message: str) -> Response:
    context = {
        "root": _root(request),
        "title": title,
        "message": message,
        "nav": _nav(who, ""),
        "who": _who(who),
        "version": __version__,
    }
    return dash.templates.TemplateResponse(request, "error.html", context, status_code=status, headers=HEADERS)


# -- JSON ----------------------------------------------------------------------------------------------------------
def _data_routes(app: FastAPI, dash: Dashboard) -> None:
    ctx = dash.ctx

    def answer(request: Request, build: Callable[[Principal], dict[str, Any]]) -> Response:
        who = dash.who(request)
        if who is None:
            return JSONResponse({"detail": "not logged in: log in at /login"}, status_code=401, headers=HEADERS)
        try:
            data = build(who)
        except pages.NotFound as e:
            return JSONResponse({"detail": str(e)}, status_code=404, headers=HEADERS)
        except pages.Forbidden as e:
            return JSONResponse({"detail": str(e)}, status_code=403, headers=HEADERS)
        data.setdefault("now", dash.latest_sample_s())
        return JSONResponse(data, headers=HEADERS)

    @app.get(DATA_URL + "/cluster", include_in_schema=False)
    def cluster(request: Request) -> Response:
        return answer(request, lambda who: pages.cluster_page(ctx, who, _since(request)))

    @app.get(DATA_URL + "/tenants", include_in_schema=False)
    def tenants(request: Request) -> Response:
        return answer(request, lambda who: pages.tenants_page(ctx, who, _since(request)))

    @app.get(DATA_URL + "/tenants/{name}", include_in_schema=False)
    def tenant(request: Request, name: str) -> Response:
        return answer(request, lambda who: pages.tenant_page(ctx, who, name, _since(request)))

    @app.get(DATA_URL + "/queue", include_in_schema=False)
    def queue(request: Request) -> Response:
        return answer(request, lambda who: pages.queue_page(ctx, who))

    @app.get(DATA_URL + "/jobs/{job_id}", include_in_schema=False)
    def job(request: Request, job_id: str) -> Response:
        return answer(request, lambda who: pages.job_page(ctx, who, job_id, _since(request)))

    @app.get(DATA_URL + "/jobs/{job_id}/log", include_in_schema=False)
    def job_log(request: Request, job_id: str) -> Response:
        raw = request.query_params.get("offset")
        offset = int(raw) if raw is not None and raw.isdigit() and len(raw) < 19 else None
        return answer(request, lambda who: pages.log_tail(ctx, who, job_id, offset))

    @app.get(DATA_URL + "/scheduler", include_in_schema=False)
    def scheduler(request: Request) -> Response:
        return answer(request, lambda who: pages.scheduler_page(ctx, who, _since(request)))
