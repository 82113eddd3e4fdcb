"""Command-line flags backed by ``KENNING_*`` environment variables.

One naming rule, in every process and in compose.yaml. A setting that means the same in
every process that has it is ``KENNING_<FLAG>``: ``--database-url`` is
``KENNING_DATABASE_URL``, ``--poll-interval`` is ``KENNING_POLL_INTERVAL``. A setting whose
meaning or default differs per process carries the process's name: the relayer's
``--batch-size`` is ``KENNING_RELAYER_BATCH_SIZE``, the scheduler's is
``KENNING_SCHEDULER_BATCH_SIZE``. One ``.env`` shared by several processes then cannot set
one of them by accident: the shared spelling of such a setting is refused at start.
"""

from __future__ import annotations

import argparse
import os
import socket
import uuid
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

# parser -> {flag: variable}, for ``declared_variables`` (tests, docs)
_DECLARED: weakref.WeakKeyDictionary[argparse.ArgumentParser, dict[str, str]] = weakref.WeakKeyDictionary()


def env_name(flag: str, process: str = "") -> str:
    """``--batch-size`` -> ``KENNING_BATCH_SIZE``; with ``process="relayer"``,
    ``KENNING_RELAYER_BATCH_SIZE``."""
    name = f"{process}-{flag.lstrip('-')}" if process else flag.lstrip("-")
    return "KENNING_" + name.replace("-", "_").upper()


def declared_variables(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{flag: variable}`` of every option ``add_option`` gave ``parser``."""
    return dict(_DECLARED.get(parser, {}))


def _environment_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """One line and exit code 2: the flags' usage says nothing about a variable."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


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
    process: str = "",
) -> None:
    """Add ``flag`` whose default comes from its environment variable, then ``default``.

    ``process``: the setting means something different in each process that has it (or
    has a default of its own there), so its variable carries the process's name
    (``KENNING_<PROCESS>_<FLAG>``), and the shared spelling is refused rather than
    silently read by every process that once read it.

    A malformed environment value is reported by the variable's name (exit 2, one line),
    never as a traceback.
    """
    variable = env_name(flag, process)
    shared = env_name(flag)
    if process and shared in os.environ:
        _environment_error(
            parser,
            f"{shared} is no longer read, as it meant different things in different processes: set {variable}",
        )
    _DECLARED.setdefault(parser, {})[flag] = variable
    raw = os.environ.get(variable)
    value = default
    if raw is not None:
        try:
            value = _parse_bool(raw) if type is bool else type(raw)
        except ValueError as error:
            _environment_error(parser, f"{variable}={raw!r} is invalid: {error}")
        if choices is not None and value not in choices:
            _environment_error(parser, f"{variable}={raw!r} is invalid: choose from {', '.join(choices)}")
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


# Settings the long-running processes share, declared here once so that one name has one
# default and one meaning wherever it is read.


def add_migrate_option(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--migrate", default=True, type=bool, help="bring the schema up to date at start")


def add_listen_option(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--listen", default=True, type=bool, help="wake on LISTEN/NOTIFY (else poll only)")


def add_poll_interval_option(parser: argparse.ArgumentParser) -> None:
    add_option(
        parser, "--poll-interval", default=1.0, type=positive_float, help="fallback poll when a NOTIFY is missed (s)"
    )


def add_health_file_option(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--health-file", default="", help="touched every 5 s while alive (for healthchecks)")


def process_id(prefix: str = "") -> str:
    """``[prefix-]host-pid-random``: the default name of a process in leases and logs."""
    return f"{prefix}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
