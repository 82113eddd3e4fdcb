"""The console's Starlette app: routes gathered from the page modules, one line each.

A page module exposes ``routes() -> list[BaseRoute]``; ``ROUTE_MODULES`` lists them. Every
handler reaches the database, templates and settings through
``kenning_console.state.console_of(request)``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from kenning.app import App
from kenning.core.names import env_name
from kenning.db import Database
from kenning.hosting.scrape import readiness_body
from kenning.storage import inbox as inbox_sql
from kenning_console import (
    actionlog,
    actions,
    approvals,
    bulk,
    escapes,
    events,
    forks,
    instances,
    live,
    login,
    metrics,
    queues,
    schedules,
    streams,
    values,
    workers,
)
from kenning_console.pages import ErrorPageMiddleware, http_error, templates
from kenning_console.security import SecurityMiddleware
from kenning_console.settings import ConsoleSettings
from kenning_console.state import Console, console_of

_log = structlog.get_logger("kenning.console")

# Each page module's routes, in order (the first match wins). Add a module here.
# bulk, actions and escapes before instances: its ids take any path (/instances/bulk included)
ROUTE_MODULES = (
    login,
    metrics,
    bulk,
    actions,
    forks,
    escapes,
    approvals,
    events,
    actionlog,
    instances,
    live,
    streams,
    values,
    workers,
    queues,
    schedules,
)


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok\n")


async def readyz(request: Request) -> Response:
    """Ready unless its commits do not complete (``kenning.hosting.commitwatch``) or the
    database does not answer."""
    console = console_of(request)
    reason = console.readiness() if console.readiness is not None else None
    if reason is None:
        try:
            await console.read(inbox_sql.inbox_check_ready)
        except Exception as error:  # the page says why; the pool's users log an unreachable database
            reason = f"database unavailable: {type(error).__name__}"
    code, body = readiness_body(reason)
    return Response(body, status_code=code, media_type="application/json")


def routes() -> list[BaseRoute]:
    found: list[BaseRoute] = [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]
    for module in ROUTE_MODULES:
        found.extend(module.routes())
    found.append(Mount("/static", StaticFiles(packages=[("kenning_console", "static")]), name="static"))
    return found


def database(settings: ConsoleSettings) -> Database:
    """The console's connections: connecting and waiting for a free one are bounded by
    ``--database-timeout`` (a page answers 503 then, not after the pool's 30 s)."""
    timeout = settings.database_timeout
    return Database(
        url=settings.database_url,
        # every statement runs on the psycopg pool: SQLAlchemy's engine is never built here
        engine_pool_size=1,
        engine_max_overflow=0,
        engine_pool_timeout=timeout,
        autocommit_pool_size=8,
        connect_timeout=max(2, round(timeout)),
        pool_timeout=timeout,
        pgbouncer=settings.pgbouncer,
        bounds=settings.database_bounds(),
        direct_url=os.environ.get(env_name("--direct-database-url"), ""),  # for LISTEN, as kenning.db.connect
    )


def create_app(settings: ConsoleSettings, app: App | None = None) -> Starlette:
    console = Console(settings=settings, templates=templates(), app=app)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        console.database = database(settings)
        async with live.listening(console), streams.reading(console), workers.present(console):
            _log.info("console.started", host=settings.host, port=settings.port)
            try:
                yield
            finally:
                await console.database.dispose()

    starlette = Starlette(
        routes=routes(),
        middleware=[
            Middleware(metrics.request_metrics),  # outside: refused requests are counted too
            Middleware(
                SecurityMiddleware,
                admin_token=settings.admin_token,
                session_seconds=settings.session_hours * 3600,
                allowed_hosts=settings.allowed_hosts,
            ),
            Middleware(ErrorPageMiddleware),  # inside: its pages get the security headers too
        ],
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
    )
    starlette.state.console = console
    return starlette
