"""``kenning mcp``: an MCP server over Kenning's database, for an AI assistant
(docs/mcp.md). Over stdio (the assistant starts it) or streamable HTTP at ``/mcp``
(bearer token ``KENNING_MCP_TOKEN``; without one it listens on loopback only). Read-only
unless started with ``--allow-actions``; every action lands in the operator action log
with the client's identity. Needs the ``mcp`` extra (``pip install 'kenning[mcp]'``)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import signal
import sys
from dataclasses import replace
from typing import Any

import structlog

from kenning.app import App
from kenning.assistant.settings import McpSettings
from kenning.core.database_urls import redacted, sqlalchemy_url
from kenning.db import connect
from kenning.db.migrate import migrate
from kenning.errors import UsageError
from kenning.hosting import exposure
from kenning.hosting.appload import database_url, load_app
from kenning.hosting.config import add_settings, settings_from_args

HELP = "serve an MCP server over the database for AI assistants (read-only unless --allow-actions)"

_log = structlog.get_logger("kenning.mcp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings(parser, McpSettings)


def check_exposure(settings: McpSettings) -> None:
    """Refuse an HTTP server anyone on the network could use without a token."""
    if settings.transport != "http":
        return
    exposure.check_exposure(
        host=settings.host,
        port=settings.port,
        guarded=bool(settings.token),
        allow_open=False,
        refusal=f"refusing to listen on {settings.host} without KENNING_MCP_TOKEN: anyone who reaches it could read "
        "every workflow's input and result. Set KENNING_MCP_TOKEN (or --token), or listen on 127.0.0.1",
        logger="kenning.mcp",
        event="mcp.open",
        reason="no token",
    )


def _stdlib_logging(level: str) -> None:
    """The SDK's and uvicorn's lines on stderr, level first (never stdout: over stdio that
    is the protocol's), set before the SDK would install its own handler."""
    logging.basicConfig(
        level=max(logging.WARNING, getattr(logging, level.upper())),
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(McpSettings, args)
    if importlib.util.find_spec("mcp") is None:
        raise UsageError("kenning mcp needs the MCP SDK: pip install 'kenning[mcp]'")
    app: App | None = load_app(settings.app) if settings.app.strip() else None
    settings = replace(settings, database_url=database_url(settings.database_url, app))
    sqlalchemy_url(settings.database_url)  # a missing or malformed URL is a CLI error (exit 2)
    check_exposure(settings)
    _stdlib_logging(settings.log_level)
    if settings.migrate:
        migrate(settings.database_url, settings.migration_bounds())
    _log.info(
        "mcp.starting",
        transport=settings.transport,
        host=settings.host if settings.transport == "http" else None,
        port=settings.port if settings.transport == "http" else None,
        actions="allowed" if settings.allow_actions else "refused (read-only)",
        auth="bearer token" if settings.token else "none",
        app=settings.app or None,
        database=redacted(settings.database_url),
    )
    # a stop asked for is a clean exit (uvicorn re-raises the SIGTERM it stopped on)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(_serve(settings, app))
    return 0


async def _serve(settings: McpSettings, app: App | None) -> None:
    from kenning.assistant.operations import Operations
    from kenning.assistant.server import build_server

    database = connect(settings.database_url, pool_size=2, max_overflow=2, bounds=settings.database_bounds())
    operations = Operations(
        database, allow_actions=settings.allow_actions, app=app, commit_stall_seconds=settings.commit_stall_seconds
    )
    try:
        server = build_server(operations, guarded=settings.transport == "http" and bool(settings.token))
        if settings.transport == "stdio":
            await server.run_stdio_async()
        else:
            await _serve_http(server, settings)
    finally:
        await database.dispose()


async def _serve_http(server: Any, settings: McpSettings) -> None:
    import uvicorn
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    from kenning.assistant.http import BearerGuard

    @server.custom_route("/healthz", methods=["GET"])  # type: ignore[untyped-decorator]
    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    asgi = BearerGuard(server.streamable_http_app(host=settings.host), settings.token)
    config = uvicorn.Config(
        asgi,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=3,
    )
    _log.info("mcp.listening", url=f"http://{settings.host}:{settings.port}/mcp")
    await uvicorn.Server(config).serve()
