"""``kenning ingress``: the CloudEvents HTTP endpoint, Starlette on uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import os

import structlog
import uvicorn

from kenning.commands.errors import UsageError
from kenning.config import (
    add_database_options,
    add_logging_options,
    add_migrate_option,
    add_option,
    env_name,
    positive_int,
)
from kenning.db import redacted, sqlalchemy_url
from kenning.migrate import migrate
from kenning_ingress.protocol import IngressProtocol
from kenning_ingress.settings import OPTIONS, IngressSettings, settings_of, settings_to_environment

KEEP_ALIVE_SECONDS = 90


# the name in the variables of settings that differ per process: KENNING_INGRESS_PORT
PROCESS = "ingress"


HELP = "accept CloudEvents over HTTP into the inbox"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_database_options(parser)
    add_option(
        parser,
        "--host",
        default="127.0.0.1",
        help="address to listen on (0.0.0.0 for every interface)",
        process=PROCESS,
    )
    add_option(parser, "--port", default=8000, type=positive_int, help="port to listen on", process=PROCESS)
    add_option(parser, "--workers", default=1, type=positive_int, help="uvicorn worker processes", process=PROCESS)
    for option in OPTIONS:
        add_option(parser, option.flag, default=option.default, type=option.type, help=option.help)
    add_option(
        parser,
        "--ingress-allow-open",
        default=False,
        type=bool,
        help="serve without KENNING_INGRESS_TOKEN on an address other than loopback (refused otherwise)",
    )
    add_migrate_option(parser)
    add_logging_options(parser)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_exposure(args: argparse.Namespace) -> None:
    """Refuse an ingress anyone on the network could use, unless the operator said so."""
    if args.ingress_token or is_loopback(args.host):
        return
    if not args.ingress_allow_open:
        raise UsageError(
            f"refusing to listen on {args.host} without KENNING_INGRESS_TOKEN: anyone who reaches it could "
            "post events, cancel workflows and read their results. Set KENNING_INGRESS_TOKEN (and "
            "KENNING_ADMIN_TOKEN), listen on 127.0.0.1, or pass --ingress-allow-open (KENNING_INGRESS_ALLOW_OPEN=true)"
        )
    structlog.get_logger("kenning.ingress").warning(
        "ingress.open",
        host=args.host,
        port=args.port,
        reason="--ingress-allow-open: no token guards events, /cancel or /instances",
    )


def settings_from(args: argparse.Namespace) -> IngressSettings:
    return settings_of(args.database_url, {option.field: getattr(args, option.dest) for option in OPTIONS})


def run(args: argparse.Namespace) -> int:
    sqlalchemy_url(args.database_url)  # a missing or malformed URL is a CLI error (exit 2)
    check_exposure(args)
    # uvicorn workers are fresh processes: hand them the settings through the environment.
    os.environ.update(settings_to_environment(settings_from(args)))
    os.environ.update({env_name("--log-level"): args.log_level, env_name("--log-format"): args.log_format})
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
        # the app, in worker processes (--workers N) that die with this one (lifeline.py)
        "kenning_ingress.lifeline:worker_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
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
    return 0
