"""``kenning worker``: the process entry point."""

from __future__ import annotations

import argparse
import asyncio
import signal

import structlog

from kenning.app import App
from kenning.appload import database_url, load_app
from kenning.config import (
    add_database_options,
    add_health_file_option,
    add_listen_option,
    add_logging_options,
    add_migrate_option,
    add_option,
    add_poll_interval_option,
    positive_float,
    positive_int,
)
from kenning.db import connect
from kenning.health import heartbeat
from kenning.loop import run as run_loop
from kenning.migrate import migrate
from kenning.storage.instances import DEFAULT_MAX_RUNS
from kenning_worker.inbox import add_inbox_arguments, inbox_settings_from_args
from kenning_worker.shutdown import ExitBound
from kenning_worker.worker import Worker, WorkerSettings

# the name in the variables of settings that differ per process: KENNING_WORKER_LEASE_SECONDS
PROCESS = "worker"


HELP = "claim and run workflow instances"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--app", default="", help="modules defining workflows: module[:attribute][,module...]")
    add_database_options(parser)
    add_option(parser, "--concurrency", default=32, type=positive_int, help="instances run at once")
    add_option(
        parser,
        "--lease-seconds",
        default=30.0,
        type=positive_float,
        help="lease on a claimed instance",
        process=PROCESS,
    )
    add_option(
        parser,
        "--pool-size",
        default=10,
        type=positive_int,
        help="database connections per worker; instances in flight share them",
    )
    add_poll_interval_option(parser)
    add_option(
        parser,
        "--inline-retry-seconds",
        default=5.0,
        type=float,
        help="retry back-offs up to this long wait in the worker; longer ones free it",
    )
    add_option(
        parser,
        "--shutdown-grace-seconds",
        default=30.0,
        type=float,
        help="on SIGTERM, time for instances in flight to finish before they are released",
        process=PROCESS,
    )
    add_option(
        parser,
        "--activity-timeout",
        default=None,
        type=positive_float,
        help="seconds an activity attempt may run when it sets no @activity(timeout=); none by default",
    )
    add_listen_option(parser)
    add_migrate_option(parser)
    add_option(
        parser,
        "--max-runs",
        default=DEFAULT_MAX_RUNS,
        type=positive_int,
        help="runs in a row that may die without a step before the instance fails as crash_loop",
    )
    add_option(parser, "--worker-id", default="", help="name in leases and logs (default host-pid-random)")
    add_health_file_option(parser)
    add_inbox_arguments(parser)
    add_logging_options(parser)


async def _serve(args: argparse.Namespace, app: App) -> None:
    database = connect(args.database_url, pool_size=args.pool_size, max_overflow=2)
    worker = Worker(
        database,
        app,
        WorkerSettings(
            concurrency=args.concurrency,
            lease_seconds=args.lease_seconds,
            poll_interval=args.poll_interval,
            inline_retry_seconds=args.inline_retry_seconds,
            shutdown_grace_seconds=args.shutdown_grace_seconds,
            max_runs=args.max_runs,
            activity_timeout=args.activity_timeout,
            listen=args.listen,
            worker_id=args.worker_id,
            inbox=inbox_settings_from_args(args),
        ),
    )
    loop = asyncio.get_running_loop()
    bound = ExitBound(args.shutdown_grace_seconds)  # SIGTERM: exit within grace + a margin
    bound.install(loop)

    def stop() -> None:
        bound.arm()
        worker.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        async with heartbeat(args.health_file):
            await worker.run()
    finally:
        await database.dispose()
    await bound.finish(abandoned_runs=worker.abandoned)


def run(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    args.database_url = database_url(args.database_url, app)  # else the App's db_url
    if args.migrate:
        migrate(args.database_url)
    structlog.get_logger("kenning.worker").info(
        "worker.starting",
        app=args.app,
        concurrency=args.concurrency,
        pool_size=args.pool_size,
        lease_seconds=args.lease_seconds,
        shutdown_grace_seconds=args.shutdown_grace_seconds,
        poll_interval=args.poll_interval,
        listen=args.listen,
    )
    run_loop(_serve(args, app))
    return 0
