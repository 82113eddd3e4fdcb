"""``kenning scheduler``: the process entry point."""

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
    positive_int,
)
from kenning.db import connect
from kenning.health import heartbeat
from kenning.loop import run as run_loop
from kenning.migrate import migrate
from kenning.schedules import scheduled_workflows
from kenning_scheduler.scheduler import Scheduler, SchedulerSettings

# the name in the variables of settings that differ per process: KENNING_SCHEDULER_BATCH_SIZE
PROCESS = "scheduler"


HELP = "fire timers and event timeouts, start cron ticks"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(
        parser,
        "--app",
        default="",
        help="modules defining workflows, for their cron schedules: module[:attribute][,module...] "
        "(timers and event timeouts need none)",
    )
    add_database_options(parser)
    add_option(
        parser, "--batch-size", default=100, type=positive_int, help="timers fired per transaction", process=PROCESS
    )
    add_poll_interval_option(parser)
    add_listen_option(parser)
    add_migrate_option(parser)
    add_option(parser, "--scheduler-id", default="", help="name in logs (default host-pid-random)")
    add_health_file_option(parser)
    add_logging_options(parser)


async def _serve(args: argparse.Namespace, app: App | None) -> None:
    database = connect(args.database_url, pool_size=2, max_overflow=2)
    scheduler = Scheduler(
        database,
        app,
        SchedulerSettings(
            batch_size=args.batch_size,
            poll_interval=args.poll_interval,
            listen=args.listen,
            scheduler_id=args.scheduler_id,
        ),
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, scheduler.stop)
    try:
        async with heartbeat(args.health_file):
            await scheduler.run()
    finally:
        await database.dispose()


def run(args: argparse.Namespace) -> int:
    app = load_app(args.app) if args.app.strip() else None
    if app is not None:
        scheduled_workflows(app.registry)  # a schedule's workflow that needs arguments: exit 2 now
    args.database_url = database_url(args.database_url, app)  # else the App's db_url
    if args.migrate:
        migrate(args.database_url)
    structlog.get_logger("kenning.scheduler").info(
        "scheduler.starting",
        app=args.app or None,
        batch_size=args.batch_size,
        poll_interval=args.poll_interval,
        listen=args.listen,
    )
    run_loop(_serve(args, app))
    return 0
