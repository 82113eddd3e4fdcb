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
from kenning.errors import ConfigurationError, KenningError
from kenning.logs import configure_logging

# subcommand -> (module with add_arguments(parser) and run(args) -> int, help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "worker": ("kenning.worker.main", "claim and run workflow instances"),
    "ingress": ("kenning.ingress.main", "accept CloudEvents over HTTP into the inbox"),
    "scheduler": ("kenning.scheduler.main", "fire timers and event timeouts, start cron ticks"),
    "migrate": ("kenning.cli", "bring the database schema up to date"),
    "instances": ("kenning.commands.instances", "list, show, cancel and retry workflow instances"),
    "start": ("kenning.commands.start", "start a workflow instance"),
    "send": ("kenning.commands.send", "post a CloudEvent to the ingress"),
    "sink": ("kenning.commands.sink", "a local CloudEvents receiver that logs what it gets"),
    "healthcheck": ("kenning.commands.healthcheck", "container healthcheck: an HTTP URL or a health file"),
    "up": ("kenning.up.main", "run the whole stack locally (embedded PostgreSQL unless one is configured)"),
    "bench": ("kenning.bench.main", "measure throughput and latency against limits from the same run"),
    "relayer": ("kenning.relayer.main", "publish outbox events to the broker as CloudEvents"),
    "outbox": ("kenning.relayer.cli", "list outbox events and retry dead-lettered ones"),
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


def build_parser(
    argv: Sequence[str],
) -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    """The parser, importing only the module of the subcommand named in ``argv``: a process
    loads just its own service (and ``kenning --help`` loads none)."""
    parser = argparse.ArgumentParser(prog="kenning", description="Durable workflows on PostgreSQL.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    runners: dict[str, Callable[[argparse.Namespace], int]] = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            runners[name] = module.run
    return parser, runners


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser, runners = build_parser(arguments)
    args = parser.parse_args(arguments)
    configure_logging(getattr(args, "log_level", "info"), getattr(args, "log_format", "auto"))
    try:
        return runners[args.command](args)
    except ConfigurationError as error:
        print(f"kenning {args.command}: {error}", file=sys.stderr)  # noqa: T201 - CLI edge
        return 2
    except KenningError as error:
        print(f"kenning {args.command}: {error}", file=sys.stderr)  # noqa: T201
        return 1
    except (SQLAlchemyError, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"kenning {args.command}: database error: {message}", file=sys.stderr)  # noqa: T201
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
