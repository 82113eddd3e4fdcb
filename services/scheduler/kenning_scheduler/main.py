"""``kenning scheduler``: the process entry point."""

from __future__ import annotations

import argparse
from dataclasses import replace

import structlog

from kenning.app import App
from kenning.db import connect
from kenning.db.migrate import migrate
from kenning.hosting.appload import database_url, load_app
from kenning.hosting.config import add_settings, settings_from_args
from kenning.hosting.loop import run as run_loop
from kenning.hosting.scrape import serving_metrics
from kenning.hosting.service import Starting, serve
from kenning.observability import metrics
from kenning.schedules import scheduled_workflows
from kenning_scheduler.scheduler import Scheduler, SchedulerSettings

HELP = "fire timers and event timeouts, start cron ticks"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings(parser, SchedulerSettings)


async def _serve(settings: SchedulerSettings, app: App | None, starting: Starting) -> None:
    database = connect(
        settings.database_url,
        pool_size=2,
        max_overflow=2,
        pgbouncer=settings.pgbouncer,
        bounds=settings.database_bounds(),
        direct_url=settings.direct_database_url,
    )
    scheduler = Scheduler(database, app, settings)
    metrics.zero_series(metrics.SCHEDULER)
    async with serving_metrics(
        metrics.SCHEDULER,
        database,
        settings.metrics_host,
        settings.metrics_port,
        readiness=scheduler.presence.commits.verdict,
    ):
        await serve(
            scheduler,
            close=database.dispose,
            health_file=settings.health_file,
            starting=starting,
        )


def run(args: argparse.Namespace) -> int:
    starting = Starting.catch()  # a stop while it loads the app, migrates or connects: exit code 0
    settings = settings_from_args(SchedulerSettings, args)
    app = load_app(settings.app) if settings.app.strip() else None
    if app is not None:
        scheduled_workflows(app.registry)  # a schedule's workflow that needs arguments: exit 2 now
    settings = replace(settings, database_url=database_url(settings.database_url, app))  # else the App's db_url
    if settings.migrate:
        migrate(settings.database_url, settings.migration_bounds())
    structlog.get_logger("kenning.scheduler").info(
        "scheduler.starting",
        app=settings.app or None,
        batch_size=settings.batch_size,
        poll_interval=settings.poll_interval,
        listen=settings.listen,
    )
    starting.defer()
    run_loop(_serve(settings, app, starting))
    return 0
