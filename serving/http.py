"""``lambdalake serve``: the serving layer over HTTP for programs (a SQL API with a token) and
people (the dashboard at ``/``).

One :class:`~serving.engine.ServingEngine` stays open for the server's life; a background thread
refreshes it every ``refresh_seconds``, so a request never pays for opening or refreshing and
sees a lake at most that old. Queries go through the same guard as ``lambdalake query`` and
answer the same JSON.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from include.config import Settings
from include.output import json_rows
from serving.engine import QueryRefused, QueryTimeout, ServingEngine
from serving.status import view_status

DASHBOARD = Path(__file__).resolve().parent / "dashboard"
log = logging.getLogger("lambdalake.serve")


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


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class RequireToken:
    """Every ``/api/`` request needs ``Authorization: Bearer <token>``; checked before routing
    and body parsing, so without it every /api/ path answers the same bare 401. (Plain ASGI:
    Starlette's BaseHTTPMiddleware costs about a millisecond per request.)"""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/api/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await Response(status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _answer(engine: ServingEngine, sql: str) -> Response:
    try:
        return _json(engine.rows(sql))
    except QueryRefused as exc:
        return _error(400, str(exc))
    except QueryTimeout as exc:
        return _error(504, str(exc))


def create_app(settings: Settings, token: str, refresh_seconds: float = 1.0) -> FastAPI:
    engine = ServingEngine(settings, query_timeout=settings.query_timeout.total_seconds())
    stop = threading.Event()

    def keep_fresh() -> None:
        while not stop.wait(refresh_seconds):
            try:
                engine.refresh()
            except Exception:  # a table mid-rewrite or briefly unreadable: serve the last version
                log.exception("refreshing the serving engine failed; serving the previous versions")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        refresher = threading.Thread(target=keep_fresh, name="serving-refresh", daemon=True)
        refresher.start()
        yield
        stop.set()
        refresher.join()

    app = FastAPI(title="lambdalake serving", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine
    app.add_middleware(RequireToken, token=token)

    @app.post("/api/query")
    async def query(request: Request) -> Response:
        # The body is parsed here, not by a model, so that a bad one answers 400 like bad SQL.
        try:
            sql = json.loads(await request.body())["sql"]
            if not isinstance(sql, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return _error(400, 'the body must be JSON {"sql": "SELECT ..."}')
        return await run_in_threadpool(_answer, engine, sql)

    @app.get("/api/status")
    async def status() -> Response:
        return await run_in_threadpool(lambda: _json(view_status(settings, engine)))

    app.mount("/", StaticFiles(directory=DASHBOARD, html=True), name="dashboard")
    return app


def serve(settings: Settings, host: str, port: int, token: str) -> None:
    """Run the server until SIGINT/SIGTERM."""
    import uvicorn

    uvicorn.run(create_app(settings, token), host=host, port=port, log_level="warning")
