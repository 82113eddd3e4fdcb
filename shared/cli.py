"""The ``kenning`` command: one entry point, a subcommand per process or task."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

import structlog
from sqlalchemy.exc import SQLAlchemyError

from kenning.config import add_database_options, add_logging_options
from kenning.db import redacted
from kenning.errors import ConfigurationError
from kenning.logs import configure_logging

# subcommand -> (module with add_arguments(parser) and run(args) -> int, help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "worker": ("kenning.worker.main", "claim and run workflow instances"),
    "migrate": ("kenning.cli", "bring the database schema up to date"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:  # for ``kenning migrate``
    add_database_options(parser)
    add_logging_options(parser)


def run(args: argparse.Namespace) -> int:  # ``kenning migrate``
    from kenning.migrate import migrate

    revision = migrate(args.database_url)
    log = structlog.get_logger("kenning.migrate")
    log.info("schema.ready", revision=revision, database=redacted(args.database_url))
    return 0


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    parser = argparse.ArgumentParser(prog="kenning", description="Durable workflows on PostgreSQL.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    runners: dict[str, Callable[[argparse.Namespace], int]] = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(commands.add_parser(name, help=help_text, description=help_text))
        runners[name] = module.run
    return parser, runners


def main(argv: Sequence[str] | None = None) -> int:
    parser, runners = build_parser()
    args = parser.parse_args(argv)
    configure_logging(getattr(args, "log_level", "info"), getattr(args, "log_format", "auto"))
    try:
        return runners[args.command](args)
    except ConfigurationError as error:
        print(f"kenning {args.command}: {error}", file=sys.stderr)  # noqa: T201 - CLI edge
        return 2
    except (SQLAlchemyError, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"kenning {args.command}: database error: {message}", file=sys.stderr)  # noqa: T201
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
