"""``lambdalake serve``: the serving layer over HTTP for programs (a SQL API with a token),
people (the dashboard at ``/``) and operators (``/health``, ``/ready``, ``/metrics``); ``serve``
also starts the PostgreSQL wire protocol (:mod:`serving.pgwire`) over the same engine.

One :class:`~serving.engine.ServingEngine` stays open for the server's life; a background thread
refreshes it every ``refresh_seconds``, so a request never pays for opening or refreshing and
sees a lake at most that old. Queries go through the same guard as ``lambdalake query``, and the
server's row cap and query slots (:mod:`serving.limits`); they answer the same JSON by default,
or CSV, Arrow or a JSON envelope (:mod:`serving.formats`).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import anyio
from fastapi import FastAPI, Request, Response, params
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from include.config import Settings
from include.output import json_rows
from serving.engine import QueryRefused, QueryTimeout, Result, ServingEngine
from serving.formats import MEDIA_TYPES, SLICE_ROWS, encode
from serving.limits import QuerySlots, ServerBusy
from serving.metrics import ServingMetrics
from serving.status import view_status

DASHBOARD = Path(__file__).resolve().parent / "dashboard"
# How often the server looks for new commits: a look that finds none costs ~3 ms (31 tables),
# and a view's new micro-batch is served on average half this after its commit.
REFRESH_SECONDS = 0.25
# Beyond the query time limit, what a stop waits for answers to be sent before it cancels them.
SHUTDOWN_GRACE_SECONDS = 5
log = logging.getLogger("lambdalake.serve")
# A query's SQL: far more than any written or generated query needs, and a bound on what a body costs.
MAX_BODY_BYTES = 1024 * 1024
DRAINED_BODY_BYTES = 8 * MAX_BODY_BYTES  # read before a 413 (see _read_body); larger ones are cut off
# Beyond the running ones, queries that may wait for a slot on a thread; later ones wait without one.
QUERIES_WAITING_ON_THREADS = 32
TRUNCATED_HEADER = "X-Lambdalake-Truncated"
MAX_ROWS_HEADER = "X-Lambdalake-Max-Rows"


def serve_token(settings: Settings) -> str:
    """``LAMBDALAKE_SERVE_TOKEN``, or else the one generated into ``run/serve-token`` (mode 0600)."""
    if settings.serve_token:
        return settings.serve_token.get_secret_value()
    path = settings.run_dir / "serve-token"
    if not path.exists():
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process generated it first: use theirs
            return path.read_text().strip()
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


def dashboard_url(host: str, port: int, token: str) -> str:
    """The page's address with the token in the fragment, which browsers never send to a server."""
    return f"http://{host}:{port}/#token={token}"


def _json(rows: list[dict], status: int = 200) -> Response:
    return Response(json_rows(rows), status_code=status, media_type="application/json")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


LOOPBACK = ("127.0.0.1", "::1")


class RequireToken:
    """Every ``/api/`` request (and ``/metrics``, unless ``metrics_open_on_localhost`` lets this
    machine scrape it) needs ``Authorization: Bearer <token>``; checked before routing and body
    parsing, so without it every such path answers the same bare 401. (Plain ASGI: Starlette's
    BaseHTTPMiddleware costs about a millisecond per request.)"""

    def __init__(self, app: ASGIApp, token: str, metrics_open_on_localhost: bool = False) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.metrics_open_on_localhost = metrics_open_on_localhost

    def _guarded(self, scope: Scope) -> bool:
        path = scope["path"]
        if path == "/metrics":
            return not (self.metrics_open_on_localhost and scope.get("client") and scope["client"][0] in LOOPBACK)
        return path.startswith("/api/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._guarded(scope):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await Response(status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


ROUTES = ("/api/query", "/api/status", "/health", "/ready", "/metrics")


class CountRequests:
    """Each HTTP request's duration by route and status, for ``/metrics`` (the dashboard's files
    and unknown paths share one label each, so that no client can make up new series)."""

    def __init__(self, app: ASGIApp, metrics: ServingMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in ROUTES else "/api/other" if path.startswith("/api/") else "dashboard"
        started = time.perf_counter()
        status = 500  # unless the app answers

        async def counted_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counted_send)
        finally:
            self.metrics.requests.labels(route, str(status)).observe(time.perf_counter() - started)


async def _read_body(request: Request) -> bytes | None:
    """The request's body, or None past MAX_BODY_BYTES (declared or sent). A body a little over
    is still read (and dropped) before the 413: answered and closed while it still sends, a
    client gets a broken pipe or a reset instead of the answer."""
    declared = request.headers.get("content-length", "")
    if declared and (not declared.isdigit() or int(declared) > DRAINED_BODY_BYTES):
        return None
    body, read = bytearray(), 0
    async for chunk in request.stream():
        read += len(chunk)
        if read > DRAINED_BODY_BYTES:
            return None
        if read <= MAX_BODY_BYTES:
            body += chunk
    return bytes(body) if read <= MAX_BODY_BYTES else None


def _sql_of(body: bytes) -> str | None:
    try:
        sql = json.loads(body)["sql"]
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: JSON nested thousands deep
        return None
    return sql if isinstance(sql, str) else None


def _answer_options(request: Request) -> tuple[str, bool]:
    """``?format=json|csv|arrow`` and ``&envelope=1`` (JSON only); ValueError says what is wrong."""
    unknown = set(request.query_params) - {"format", "envelope"}
    if unknown:
        raise ValueError(f"unknown query parameter '{sorted(unknown)[0]}' (known: format, envelope)")
    fmt = request.query_params.get("format", "json")
    if fmt not in MEDIA_TYPES:
        raise ValueError(f"format must be one of {', '.join(MEDIA_TYPES)}, got '{fmt}'")
    envelope = request.query_params.get("envelope", "0")
    if envelope not in ("0", "1", "false", "true"):
        raise ValueError(f"envelope must be 1 or 0, got '{envelope}'")
    if envelope in ("1", "true") and fmt != "json":
        raise ValueError("envelope=1 goes with format=json (csv and arrow carry the columns themselves)")
    return fmt, envelope in ("1", "true")


@dataclass
class Freshness:
    """How the background refresh went, for ``/ready``."""

    failing_since: datetime | None = None
    error: str | None = None


def create_app(settings: Settings, token: str | None, refresh_seconds: float = REFRESH_SECONDS,
               engine: ServingEngine | None = None, slots: QuerySlots | None = None,
               metrics: ServingMetrics | None = None, login: params.Depends | None = None) -> FastAPI:
    """The HTTP server; ``engine``, ``slots`` and ``metrics`` are shared with the PostgreSQL wire
    protocol when ``serve`` runs both (else made here). Its routes need ``token`` as a bearer token
    or, with no token, pass the ``login`` dependency (Airflow's, in :mod:`lambdalake.airflow_plugin`)."""
    if (token is None) == (login is None):
        raise ValueError("the serving API needs exactly one of a token and a login dependency")
    engine = engine or ServingEngine(settings, query_timeout=settings.query_timeout.total_seconds())
    slots = slots or QuerySlots(settings.max_concurrent_queries, engine.query_timeout)
    metrics = metrics or ServingMetrics(settings, engine)
    # Queries run (or wait for a slot) on threads of their own, never on the ones that answer
    # /api/status, /metrics and the dashboard's files.
    query_threads = anyio.CapacityLimiter(settings.max_concurrent_queries + QUERIES_WAITING_ON_THREADS)
    refresh = Freshness()
    stop = threading.Event()

    def keep_fresh() -> None:
        while not stop.wait(refresh_seconds):
            try:
                engine.refresh()
                refresh.failing_since, refresh.error = None, None
            except Exception as exc:  # a table mid-rewrite or briefly unreadable: serve the last version
                log.exception("refreshing the serving engine failed; serving the previous versions")
                refresh.failing_since = refresh.failing_since or datetime.now(timezone.utc)
                refresh.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        refresher = threading.Thread(target=keep_fresh, name="serving-refresh", daemon=True)
        refresher.start()
        yield
        stop.set()
        refresher.join()

    app = FastAPI(title="lambdalake serving", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[login] if login else None)
    app.state.engine, app.state.slots, app.state.metrics = engine, slots, metrics
    if token is not None:
        app.add_middleware(RequireToken, token=token, metrics_open_on_localhost=settings.metrics_open_on_localhost)
    app.add_middleware(CountRequests, metrics=metrics)  # the outermost: it also counts the 401s

    def run_query(sql: str, arrow: bool) -> Result:
        def limited() -> Result:
            with slots.hold():
                return engine.execute(sql, max_rows=settings.max_result_rows, arrow=arrow)

        return metrics.observe("http", limited)

    @app.post("/api/query")
    async def query(request: Request) -> Response:
        try:
            fmt, envelope = _answer_options(request)
        except ValueError as exc:
            metrics.refused.labels("http", "bad_request").inc()
            return _error(400, str(exc))
        body = await _read_body(request)
        if body is None:
            metrics.refused.labels("http", "too_large").inc()
            return _error(413, f"the body is larger than {MAX_BODY_BYTES:,} bytes")
        # The body is parsed here, not by a model, so that a bad one answers 400 like bad SQL.
        sql = _sql_of(body)
        if sql is None:
            metrics.refused.labels("http", "bad_request").inc()
            return _error(400, 'the body must be JSON {"sql": "SELECT ..."}')
        try:
            result = await anyio.to_thread.run_sync(run_query, sql, fmt == "arrow", limiter=query_threads)
        except QueryRefused as exc:
            return _error(400, str(exc))
        except QueryTimeout as exc:
            return _error(504, str(exc))
        except ServerBusy as exc:
            return _error(503, str(exc), {"Retry-After": "1"})
        headers = {TRUNCATED_HEADER: "true" if result.truncated else "false",
                   MAX_ROWS_HEADER: str(settings.max_result_rows)}
        chunks = encode(result, fmt, envelope)
        if result.row_count <= SLICE_ROWS:  # one slice: a plain response costs less than a stream
            return Response(b"".join(chunks), media_type=MEDIA_TYPES[fmt], headers=headers)
        return StreamingResponse(chunks, media_type=MEDIA_TYPES[fmt], headers=headers)

    @app.get("/api/status")
    async def status() -> Response:
        return await run_in_threadpool(lambda: _json(view_status(settings, engine)))

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get("/ready")
    async def ready() -> Response:
        if not settings.lakehouse_dir.is_dir() or not os.access(settings.lakehouse_dir, os.R_OK | os.X_OK):
            return JSONResponse({"ready": False, "reason": f"the lake {settings.lakehouse_dir} is not readable"}, 503)
        if refresh.failing_since is not None:
            return JSONResponse({"ready": False, "reason": f"refreshing from the lake fails since "
                                 f"{refresh.failing_since.isoformat()}: {refresh.error}"}, 503)
        return JSONResponse({"ready": True, "lake_current_at": engine.current_at.isoformat()})

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(await run_in_threadpool(metrics.exposition), media_type=CONTENT_TYPE_LATEST)

    app.mount("/", StaticFiles(directory=DASHBOARD, html=True), name="dashboard")
    return app


def serve(settings: Settings, host: str, port: int, token: str, pg_port: int = 0) -> None:
    """Run the HTTP server, and the PostgreSQL wire protocol on ``pg_port`` (0: not), until
    SIGINT/SIGTERM; both answer through one engine and one set of query slots. On the signal it
    stops cleanly and returns: no new connections, the queries in flight finish (or are cancelled
    at the query time limit) and are answered, the PostgreSQL listener closes."""
    import uvicorn

    from serving.pgwire import start_pg_server

    # Until uvicorn takes the signals over, and when it gives them back: uvicorn raises the one
    # that stopped it again for the handler it found, and the default would end the process
    # with -15, which a supervisor or systemd reads as a crash.
    previous = {sig: signal.signal(sig, _stop_requested) for sig in (signal.SIGINT, signal.SIGTERM)}
    pg = None
    grace = settings.query_timeout.total_seconds() + SHUTDOWN_GRACE_SECONDS
    try:
        listener = _listen(host, port)
        app = create_app(settings, token)
        state = app.state
        if pg_port:
            pg = start_pg_server(settings, host, pg_port, token, state.engine, state.slots, state.metrics)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                                timeout_graceful_shutdown=math.ceil(grace))
        uvicorn.Server(config).run(sockets=[listener])
    except StopRequested:
        pass
    finally:
        for sig in previous:  # a second signal during the stop below changes nothing
            signal.signal(sig, signal.SIG_IGN)
        if pg is not None:
            left = pg.stop(grace)
            if left:
                log.warning("serve: %d PostgreSQL connections still open at exit", left)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _listen(host: str, port: int) -> socket.socket:
    """The HTTP port, bound here rather than by uvicorn, which would log the error and end the
    process with its own exit code (3): a taken port is a runtime failure told in one line."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise RuntimeError(f"cannot listen for HTTP on {host}:{port}: {exc.strerror} "
                           "(choose another port with --port)") from None
    return listener


class StopRequested(Exception):
    """SIGINT or SIGTERM while ``serve`` starts or once uvicorn has stopped."""


def _stop_requested(signum: int, frame: object) -> None:
    raise StopRequested(signal.Signals(signum).name)
