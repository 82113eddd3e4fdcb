"""``kenning relayer``: the process entry point."""

from __future__ import annotations

import argparse
from dataclasses import replace

import structlog

from kenning.core.urls import hide_credentials
from kenning.db import connect
from kenning.db.migrate import migrate
from kenning.errors import ConfigurationError
from kenning.hosting.appload import broker_url, database_url, load_app
from kenning.hosting.config import add_settings, settings_from_args
from kenning.hosting.loop import run as run_loop
from kenning.hosting.scrape import serving_metrics
from kenning.hosting.service import Starting, serve
from kenning.observability import metrics, tracing
from kenning_relayer.settings import RelayerSettings
from kenning_relayer.targets import check_url

HELP = "publish outbox events to the broker as CloudEvents"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings(parser, RelayerSettings)


def settings_from(args: argparse.Namespace) -> RelayerSettings:
    """The settings from the flags, checked; the App's broker_url and db_url fill what
    the flags and variables leave empty."""
    settings = settings_from_args(RelayerSettings, args)
    app = load_app(settings.app) if settings.app.strip() else None
    settings = replace(
        settings,
        broker_url=broker_url(settings.broker_url, app),
        database_url=database_url(settings.database_url, app),
    )
    if settings.retry_max_seconds < settings.retry_initial_seconds:
        raise ConfigurationError("--retry-max-seconds must not be shorter than --retry-initial-seconds")
    check_url(settings.broker_url)
    return settings


async def _serve(settings: RelayerSettings, starting: Starting) -> None:
    from kenning_relayer.relayer import Relayer

    database = connect(
        settings.database_url,
        pool_size=4,
        max_overflow=4,
        pgbouncer=settings.pgbouncer,
        bounds=settings.database_bounds(),
        direct_url=settings.direct_database_url,
    )
    relayer = Relayer(database, settings)
    metrics.zero_series(metrics.RELAYER)
    async with serving_metrics(
        metrics.RELAYER,
        database,
        settings.metrics_host,
        settings.metrics_port,
        readiness=relayer.presence.commits.verdict,
    ):
        await serve(relayer, close=database.dispose, health_file=settings.health_file, starting=starting)


def run(args: argparse.Namespace) -> int:
    starting = Starting.catch()  # a stop while it loads the app, migrates or connects: exit code 0
    settings = settings_from(args)
    if settings.migrate:
        migrate(settings.database_url, settings.migration_bounds())
    structlog.get_logger("kenning.relayer").info(
        "relayer.starting",
        broker_url=hide_credentials(settings.broker_url),
        batch_size=settings.batch_size,
        lease_seconds=settings.lease_seconds,
        shutdown_grace_seconds=settings.shutdown_grace_seconds,
        poll_interval=settings.poll_interval,
        listen=settings.listen,
    )
    tracing.configure("kenning-relayer")
    starting.defer()
    run_loop(_serve(settings, starting))
    return 0
