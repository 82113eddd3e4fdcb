"""``kenning ingress``: the CloudEvents HTTP endpoint, Starlette on uvicorn."""

from __future__ import annotations

import argparse
import os

import structlog
import uvicorn

from kenning.config import add_database_options, add_logging_options, add_option, positive_float, positive_int
from kenning.db import redacted, sqlalchemy_url
from kenning.ingress.settings import DEFAULT_MAX_BODY_BYTES
from kenning.migrate import migrate

KEEP_ALIVE_SECONDS = 90


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_database_options(parser)
    add_option(parser, "--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    add_option(parser, "--port", default=8000, type=positive_int, help="port to listen on")
    add_option(parser, "--workers", default=1, type=positive_int, help="uvicorn worker processes")
    add_option(
        parser, "--max-body-bytes", default=DEFAULT_MAX_BODY_BYTES, type=positive_int, help="larger bodies get 413"
    )
    add_option(
        parser,
        "--database-timeout",
        default=5.0,
        type=positive_float,
        help="seconds to connect to or wait on the database before answering 503",
    )
    add_option(parser, "--ingress-token", default="", help="bearer token required to post events (prefer the env)")
    add_option(parser, "--admin-token", default="", help="bearer token for /cancel and /instances (prefer the env)")
    add_option(parser, "--migrate", default=True, type=bool, help="bring the schema up to date at start")
    add_logging_options(parser)


def run(args: argparse.Namespace) -> int:
    sqlalchemy_url(args.database_url)  # a missing or malformed URL is a CLI error (exit 2)
    # uvicorn workers are fresh processes: hand them the settings through the environment.
    os.environ.update(
        {
            "KENNING_DATABASE_URL": args.database_url,
            "KENNING_MAX_BODY_BYTES": str(args.max_body_bytes),
            "KENNING_DATABASE_TIMEOUT": str(args.database_timeout),
            "KENNING_INGRESS_TOKEN": args.ingress_token,
            "KENNING_ADMIN_TOKEN": args.admin_token,
            "KENNING_LOG_LEVEL": args.log_level,
            "KENNING_LOG_FORMAT": args.log_format,
        }
    )
    if args.migrate:
        migrate(args.database_url)
    structlog.get_logger("kenning.ingress").info(
        "ingress.starting",
        host=args.host,
        port=args.port,
        workers=args.workers,
        database=redacted(args.database_url),
        auth="token" if args.ingress_token else "open",
        admin_auth="admin token" if args.admin_token else ("token" if args.ingress_token else "open"),
    )
    uvicorn.run(
        "kenning.ingress.app:app_from_environment",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_config=None,
        access_log=False,
        server_header=False,
        # Longer than clients' and proxies' idle pools (httpx 5 s, nginx 75 s), so the
        # client closes an idle connection first and never posts on one being closed.
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
    return 0
