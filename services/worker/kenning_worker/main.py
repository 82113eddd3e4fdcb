"""``kenning worker``: the process entry point."""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import io
import sys
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
from kenning.observability import metrics, tracing
from kenning_worker.shutdown import ExitBound
from kenning_worker.worker import Worker, WorkerSettings

HELP = "claim and run workflow instances"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings(parser, WorkerSettings)


async def _serve(settings: WorkerSettings, app: App, starting: Starting) -> None:
    database = connect(
        settings.database_url,
        pool_size=settings.pool_size,
        max_overflow=2,
        pgbouncer=settings.pgbouncer,
        bounds=settings.database_bounds(),
        direct_url=settings.direct_database_url,
    )
    worker = Worker(database, app, settings)
    metrics.zero_series(metrics.WORKER, workflows=worker.workflow_names)
    bound = ExitBound(settings.shutdown_grace_seconds)  # SIGTERM: exit within grace + a margin
    bound.install(asyncio.get_running_loop())
    async with serving_metrics(
        metrics.WORKER,
        database,
        settings.metrics_host,
        settings.metrics_port,
        readiness=worker.presence.commits.verdict,
    ):
        await serve(
            worker, close=database.dispose, health_file=settings.health_file, on_signal=bound.arm, starting=starting
        )
    await bound.finish(abandoned_runs=worker.abandoned)


def _settle_heap() -> None:
    """Load what the first claimed workflow would load (pydantic builds its model classes
    lazily: 0.1 s of CPU), then freeze the heap built at start out of the collector's
    generations. It lives as long as the process; full collections, set off by the objects
    each run allocates, walked all of it: 0.03 ms of a bench workflow's 0.25 ms of worker
    CPU. Long-lived servers do the same (``gc.freeze``)."""
    importlib.import_module("pydantic.main")
    gc.collect()
    gc.freeze()


def _line_buffered_stdout() -> None:
    """The app's prints reach the worker's log a line at a time, in order with its log lines
    (stderr, line-buffered). Written to a file or a pipe (``kenning up``'s logs, a
    supervisor's, a container's without ``PYTHONUNBUFFERED``), Python's stdout holds them in
    an 8 KiB block: an activity's print showed up minutes late, after log lines written after
    it, or never when the worker was killed."""
    if isinstance(sys.stdout, io.TextIOWrapper) and not sys.stdout.line_buffering:
        sys.stdout.reconfigure(line_buffering=True)


def run(args: argparse.Namespace) -> int:
    starting = Starting.catch()  # a stop while it loads the app, migrates or connects: exit code 0
    _line_buffered_stdout()  # before the app's import, which may print too
    settings = settings_from_args(WorkerSettings, args)
    app = load_app(settings.app)
    settings = replace(settings, database_url=database_url(settings.database_url, app))  # else the App's db_url
    if settings.migrate:
        migrate(settings.database_url, settings.migration_bounds())
    structlog.get_logger("kenning.worker").info(
        "worker.starting",
        app=settings.app,
        concurrency=settings.concurrency,
        pool_size=settings.pool_size,
        lease_seconds=settings.lease_seconds,
        idle_in_transaction_timeout=settings.database_bounds().idle_in_transaction,
        shutdown_grace_seconds=settings.shutdown_grace_seconds,
        poll_interval=settings.poll_interval,
        listen=settings.listen,
    )
    tracing.configure("kenning-worker")
    _settle_heap()
    starting.defer()
    run_loop(_serve(settings, app, starting))
    return 0
