"""The ``kenning`` command: one entry point, a subcommand per process or task."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points

import psycopg
import structlog

# Parsed on import: every process refuses a malformed KENNING_FAULTS (one line, exit 2)
# before it starts anything, not only those that import a fault point early.
import kenning.observability.faults  # noqa: F401
from kenning import codecs
from kenning.commands.argparsing import ArgumentParser, VersionAction, parse
from kenning.core import stopping
from kenning.core.texts import text_refusal
from kenning.db import errors as dberrors
from kenning.errors import (
    ConfigurationError,
    KenningError,
    MigrationBlockedError,
    ObjectStoreError,
    UsageError,
    WorkflowNotFoundError,
)
from kenning.objects import payloads
from kenning.observability.logs import configure_logging

# Each subcommand is a module with ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``,
# registered by its package in the ``kenning.commands`` entry-point group (pyproject.toml):
# the library names no service, and a process imports only the module of its own command.
COMMAND_GROUP = "kenning.commands"
SUBCOMMANDS: dict[str, EntryPoint] = {entry.name: entry for entry in entry_points(group=COMMAND_GROUP)}


def build_parser(
    argv: Sequence[str],
) -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    """The parser, importing only the module of the subcommand named in ``argv``; the
    others are imported for their one-line help only when the command list is shown."""
    parser = ArgumentParser(prog="kenning", description="Durable workflows on PostgreSQL.")
    parser.add_argument("--version", action=VersionAction, help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    listing = chosen not in SUBCOMMANDS
    runners: dict[str, Callable[[argparse.Namespace], int]] = {}
    for name in sorted(SUBCOMMANDS):
        if name != chosen and not listing:
            commands.add_parser(name)
            continue
        module = SUBCOMMANDS[name].load()
        sub = commands.add_parser(name, help=module.HELP, description=module.HELP)
        if name == chosen:
            module.add_arguments(sub)
            runners[name] = module.run
    return parser, runners


# the operator's mistakes: one line, exit code 2
# (an object store's: its bucket, its credentials or an object to restore, each named)
# (a payload's key: missing, or other bytes under its id; a codec not registered)
# (a migration that gave up waiting for a lock: the session holding it, named)
USER_ERRORS = (
    UsageError,
    ConfigurationError,
    WorkflowNotFoundError,
    ObjectStoreError,
    codecs.CodecError,
    MigrationBlockedError,
)
# no such table or column: the schema is missing or older than this code
_SCHEMA_SQLSTATES = ("42P01", "42703")
DEBUG_HINT = "rerun with --log-level debug for the traceback"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _retry_hint(error: Exception) -> str:
    return " (the database is unavailable: try again)" if dberrors.is_unavailable(error) else ""


def explain(error: Exception, *, debug: bool = False) -> tuple[str, int]:
    """The one place an exception becomes what the operator reads: (message, exit code).
    ``debug``: the traceback is being logged, so the hint to ask for it is left out."""
    if isinstance(error, USER_ERRORS):
        return _first_line(error), 2
    if isinstance(error, KenningError):  # e.g. the instance awaited with --wait failed
        return _first_line(error), 1
    driver_error = dberrors.driver_error(error)
    if isinstance(driver_error, psycopg.Error):
        if driver_error.sqlstate in _SCHEMA_SQLSTATES:
            return "the database has no Kenning schema, or an older one: run `kenning migrate`", 2
        return f"database error: {_first_line(driver_error)}{_retry_hint(error)}", 1
    if dberrors.is_sqlalchemy_error(error):  # pool timeouts and the like
        return f"database error: {_first_line(error)}{_retry_hint(error)}", 1
    if isinstance(error, OSError):  # the machine's answer: a port in use, a file not readable
        return _first_line(error), 1
    hint = "" if debug else f" ({DEBUG_HINT})"
    return f"unexpected error: {type(error).__name__}: {_first_line(error)}{hint}", 1


def _quiet_broken_pipe() -> int:
    """The reader of stdout went away (``| head``): stop without a word, as Unix tools do.
    stdout now points at /dev/null so the interpreter's final flush cannot fail again;
    141 is what a shell reports for a tool killed by SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


def not_utf8(arguments: Sequence[str]) -> str | None:
    """The first argument that is not UTF-8 text (Python reads its bytes as lone
    surrogates, which PostgreSQL's text cannot take), said in one line; None if all are."""
    for argument in arguments:
        if text_refusal(argument) is not None:
            return f"argument {argument!r} is not UTF-8 text"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    refused = not_utf8(arguments)
    if refused is not None:  # before any parse: an id, a topic or a value, refused alike
        print(f"kenning: {refused}", file=sys.stderr)  # noqa: T201 - CLI edge
        return 2
    parser, runners = build_parser(arguments)
    args = parse(parser, arguments)
    configure_logging(getattr(args, "log_level", "info"), getattr(args, "log_format", "auto"))
    try:
        stopping.release()  # a service takes SIGTERM over first thing; a one-shot command dies by it
        codecs.chain()  # a malformed KENNING_ENCRYPTION_KEYS: one line, exit 2, before anything starts
        payloads.settings()  # so a malformed KENNING_OBJECT_STORE or KENNING_OFFLOAD_BYTES (the ingress's)
        code = runners[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here at the latest
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except Exception as error:
        debug = getattr(args, "log_level", "info") == "debug"
        message, code = explain(error, debug=debug)
        if code != 2 and debug:  # the operator's mistakes need no traceback; anything else may
            structlog.get_logger("kenning.cli").debug("command.error", exc_info=True)
        print(f"kenning {args.command}: {message}", file=sys.stderr)  # noqa: T201 - CLI edge
        return code


if __name__ == "__main__":
    raise SystemExit(main())
