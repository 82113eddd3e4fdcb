"""``kenning ingress``: the CloudEvents HTTP endpoint, Starlette on uvicorn."""

from __future__ import annotations

import argparse
import os

import structlog
import uvicorn

from kenning.core.database_urls import redacted, sqlalchemy_url
from kenning.core.urls import hide_credentials
from kenning.db.migrate import migrate
from kenning.hosting import exposure
from kenning.hosting.config import add_settings, settings_from_args
from kenning.hosting.service import Starting
from kenning_ingress.metrics import shared_metrics_directory
from kenning_ingress.protocol import IngressProtocol
from kenning_ingress.settings import IngressSettings, settings_to_environment
from kenning_ingress.sources import check_sources

KEEP_ALIVE_SECONDS = 90

HELP = "accept CloudEvents over HTTP into the inbox"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings(parser, IngressSettings)


def check_exposure(settings: IngressSettings) -> None:
    """Refuse an ingress anyone on the network could use, unless the operator said so."""
    exposure.check_exposure(
        host=settings.host,
        port=settings.port,
        guarded=bool(settings.ingress_token),
        allow_open=settings.allow_open,
        refusal=f"refusing to listen on {settings.host} without KENNING_INGRESS_TOKEN: anyone who reaches it could "
        "post events, cancel workflows and read their results. Set KENNING_INGRESS_TOKEN (and "
        "KENNING_ADMIN_TOKEN), listen on 127.0.0.1, or pass --ingress-allow-open (KENNING_INGRESS_ALLOW_OPEN=true)",
        logger="kenning.ingress",
        event="ingress.open",
        reason="--ingress-allow-open: no token guards events, /cancel or /instances",
    )


def settings_from(args: argparse.Namespace) -> IngressSettings:
    return settings_from_args(IngressSettings, args)


def run(args: argparse.Namespace) -> int:
    # a stop while it migrates or connects, and uvicorn's SIGTERM raised again after its
    # graceful shutdown (the default action would end the process with -15): exit code 0
    Starting.catch()
    settings = settings_from(args)
    sqlalchemy_url(settings.database_url)  # a missing or malformed URL is a CLI error (exit 2)
    check_exposure(settings)
    check_sources(settings.sources)  # a bad URL or a missing broker client: exit 2 before anything starts
    # uvicorn workers are fresh processes: hand them the settings through the environment.
    os.environ.update(settings_to_environment(settings))
    if settings.migrate:
        migrate(settings.database_url, settings.migration_bounds())
    structlog.get_logger("kenning.ingress").info(
        "ingress.starting",
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        database=redacted(settings.database_url),
        auth="token" if settings.ingress_token else "open",
        admin_auth="admin token" if settings.admin_token else ("token" if settings.ingress_token else "open"),
        sources=[hide_credentials(url) for url in settings.sources],
    )
    with shared_metrics_directory(settings.workers):  # /metrics sums every worker's figures
        _run_uvicorn(settings)
    return 0


def _run_uvicorn(settings: IngressSettings) -> None:
    uvicorn.run(
        # the app, in worker processes (--workers N) that die with this one (lifeline.py)
        "kenning_ingress.lifeline:worker_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_config=None,
        access_log=False,
        server_header=False,
        # uvicorn's httptools protocol with JSON for malformed HTTP, a header size cap
        # and a header read deadline (kenning_ingress.protocol)
        http=IngressProtocol,
        # Longer than clients' and proxies' idle pools (httpx 5 s, nginx 75 s), so the
        # client closes an idle connection first and never posts on one being closed.
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
