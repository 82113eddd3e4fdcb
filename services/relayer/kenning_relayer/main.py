"""``kenning relayer``: the process entry point."""

from __future__ import annotations

import argparse
import asyncio
import signal
from urllib.parse import urlsplit

import structlog

from kenning.appload import broker_url, database_url, load_app
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
from kenning.errors import ConfigurationError
from kenning.health import heartbeat
from kenning.loop import run as run_loop
from kenning.migrate import migrate
from kenning_relayer.settings import CONTENT_MODES, RelayerSettings


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError("must not be negative")
    return value


# the name in the variables of settings that differ per process: KENNING_RELAYER_BATCH_SIZE
PROCESS = "relayer"


HELP = "publish outbox events to the broker as CloudEvents"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--broker-url", default="", help="where events are POSTed (http:// or https:// URL)")
    add_option(
        parser,
        "--app",
        default="",
        help="optional: module[:attribute] whose App's broker_url and db_url are the fallbacks",
    )
    add_database_options(parser)
    add_option(parser, "--content-mode", default="binary", choices=CONTENT_MODES, help="CloudEvents HTTP content mode")
    add_option(
        parser, "--batch-size", default=50, type=positive_int, help="events claimed and sent at once", process=PROCESS
    )
    add_option(parser, "--max-connections", default=20, type=positive_int, help="HTTP connections to the broker")
    add_option(
        parser, "--lease-seconds", default=30.0, type=positive_float, help="lease on a claimed batch", process=PROCESS
    )
    add_poll_interval_option(parser)
    add_option(parser, "--request-timeout-seconds", default=10.0, type=positive_float, help="HTTP timeout per event")
    add_option(parser, "--max-attempts", default=10, type=positive_int, help="attempts before an event is dead")
    add_option(parser, "--retry-initial-seconds", default=1.0, type=positive_float, help="first retry back-off")
    add_option(parser, "--retry-max-seconds", default=300.0, type=positive_float, help="longest retry back-off")
    add_option(
        parser, "--retention-hours", default=168.0, type=non_negative_float, help="keep published events this long"
    )
    add_option(parser, "--cleanup-interval-seconds", default=60.0, type=positive_float, help="how often old events go")
    add_option(
        parser,
        "--shutdown-grace-seconds",
        default=10.0,
        type=float,
        help="on SIGTERM, time for the batch in flight",
        process=PROCESS,
    )
    add_listen_option(parser)
    add_migrate_option(parser)
    add_option(parser, "--relayer-id", default="", help="name in leases and logs (default host-pid-random)")
    add_health_file_option(parser)
    add_logging_options(parser)


def check_broker_url(url: str) -> str:
    if not url:
        raise ConfigurationError(
            "no broker URL: pass --broker-url or set KENNING_BROKER_URL (or --app, an App with broker_url)"
        )
    try:
        parsed = urlsplit(url)
        host = parsed.hostname
        _ = parsed.port  # raises ValueError for a malformed port
    except ValueError as error:
        raise ConfigurationError(f"broker URL {url!r} is invalid: {error}") from None
    if parsed.scheme not in ("http", "https") or not host:
        raise ConfigurationError(f"broker URL must be http://host/... or https://host/..., got {url!r}")
    return url


def settings_from(args: argparse.Namespace) -> RelayerSettings:
    if args.retry_max_seconds < args.retry_initial_seconds:
        raise ConfigurationError("--retry-max-seconds must not be shorter than --retry-initial-seconds")
    return RelayerSettings(
        broker_url=check_broker_url(args.broker_url),
        content_mode=args.content_mode,
        batch_size=args.batch_size,
        max_connections=args.max_connections,
        lease_seconds=args.lease_seconds,
        poll_interval=args.poll_interval,
        request_timeout_seconds=args.request_timeout_seconds,
        max_attempts=args.max_attempts,
        retry_initial_seconds=args.retry_initial_seconds,
        retry_max_seconds=args.retry_max_seconds,
        retention_hours=args.retention_hours,
        cleanup_interval_seconds=args.cleanup_interval_seconds,
        shutdown_grace_seconds=args.shutdown_grace_seconds,
        listen=args.listen,
        relayer_id=args.relayer_id,
    )


async def _serve(settings: RelayerSettings, database_url: str, health_file: str) -> None:
    from kenning_relayer.relayer import Relayer

    database = connect(database_url, pool_size=4, max_overflow=4)
    relayer = Relayer(database, settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, relayer.stop)
    try:
        async with heartbeat(health_file):
            await relayer.run()
    finally:
        await database.dispose()


def run(args: argparse.Namespace) -> int:
    app = load_app(args.app) if args.app.strip() else None
    args.broker_url = broker_url(args.broker_url, app)  # else the App's broker_url
    args.database_url = database_url(args.database_url, app)  # else the App's db_url
    settings = settings_from(args)
    if args.migrate:
        migrate(args.database_url)
    structlog.get_logger("kenning.relayer").info(
        "relayer.starting",
        broker_url=settings.broker_url,
        batch_size=settings.batch_size,
        lease_seconds=settings.lease_seconds,
        shutdown_grace_seconds=settings.shutdown_grace_seconds,
        poll_interval=settings.poll_interval,
        listen=settings.listen,
    )
    run_loop(_serve(settings, args.database_url, args.health_file))
    return 0
