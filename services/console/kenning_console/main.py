"""``kenning console``: the web console (Starlette on uvicorn, one process)."""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import replace

import structlog
import uvicorn

from kenning.app import App
from kenning.core.database_urls import redacted, sqlalchemy_url
from kenning.db.migrate import migrate
from kenning.hosting import exposure
from kenning.hosting.appload import database_url, load_app
from kenning.hosting.config import add_settings, settings_from_args
from kenning_console.app import create_app
from kenning_console.settings import ConsoleSettings

HELP = "serve the web console: instances, their histories, events and actions"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings(parser, ConsoleSettings)


def check_exposure(settings: ConsoleSettings) -> None:
    """Refuse a console anyone on the network could use, unless the operator said so."""
    exposure.check_exposure(
        host=settings.host,
        port=settings.port,
        guarded=bool(settings.admin_token),
        allow_open=settings.allow_open,
        refusal=f"refusing to listen on {settings.host} without KENNING_ADMIN_TOKEN: anyone who reaches the console "
        "could read every workflow's input and result, cancel and start workflows. Set KENNING_ADMIN_TOKEN, "
        "listen on 127.0.0.1, or pass --console-allow-open (KENNING_CONSOLE_ALLOW_OPEN=true)",
        logger="kenning.console",
        event="console.open",
        reason="--console-allow-open: no token guards it",
    )


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(ConsoleSettings, args)
    app: App | None = load_app(settings.app) if settings.app.strip() else None
    settings = replace(settings, database_url=database_url(settings.database_url, app))
    sqlalchemy_url(settings.database_url)  # a missing or malformed URL is a CLI error (exit 2)
    check_exposure(settings)
    if settings.migrate:
        migrate(settings.database_url, settings.migration_bounds())
    structlog.get_logger("kenning.console").info(
        "console.starting",
        host=settings.host,
        port=settings.port,
        app=settings.app or None,
        database=redacted(settings.database_url),
        auth="admin token" if settings.admin_token else "open",
    )
    # uvicorn re-raises the SIGTERM it stopped on after its graceful shutdown, and the
    # default action would end the process with 143: a stop asked for is a clean exit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uvicorn.run(
        create_app(settings, app),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=3,  # server-sent event streams never end by themselves
    )
    return 0
