"""Command-line flags backed by ``KENNING_*`` environment variables, one naming rule:
``--lease-seconds`` is ``KENNING_LEASE_SECONDS``, in every process and in compose.yaml."""

from __future__ import annotations

import argparse
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any


def env_name(flag: str) -> str:
    return "KENNING_" + flag.lstrip("-").replace("-", "_").upper()


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def add_option(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    default: Any,
    help: str,
    type: Callable[[str], Any] = str,
    choices: tuple[str, ...] | None = None,
) -> None:
    """Add ``flag`` whose default comes from its environment variable, then ``default``.

    A malformed environment value is reported like a malformed flag (exit 2, message
    naming the variable), never as a traceback.
    """
    variable = env_name(flag)
    raw = os.environ.get(variable)
    value = default
    if raw is not None:
        try:
            value = _parse_bool(raw) if type is bool else type(raw)
        except ValueError as error:
            parser.error(f"{variable}={raw!r} is invalid: {error}")
        if choices is not None and value not in choices:
            parser.error(f"{variable}={raw!r} is invalid: choose from {', '.join(choices)}")
    full_help = f"{help} [env {variable}; default {default!r}]"
    if type is bool:
        parser.add_argument(flag, default=value, action=argparse.BooleanOptionalAction, help=full_help)
    else:
        parser.add_argument(flag, default=value, type=type, choices=choices, help=full_help)


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


def add_database_options(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--database-url", default="", help="PostgreSQL URL (postgresql://user:pass@host/db)")


def add_logging_options(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--log-level", default="info", choices=("debug", "info", "warning", "error"), help="log level")
    add_option(parser, "--log-format", default="auto", choices=("auto", "json", "console"), help="log format")


def process_id(prefix: str = "") -> str:
    """``[prefix-]host-pid-random``: the default name of a process in leases and logs."""
    return f"{prefix}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
