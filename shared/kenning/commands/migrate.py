"""``kenning migrate``: bring the database schema up to date."""

from __future__ import annotations

import argparse

import structlog

from kenning.core.database_urls import redacted
from kenning.db.bounds import MigrationBounds
from kenning.db.migrate import migrate
from kenning.hosting.config import add_database_options, add_logging_options, add_migration_options

HELP = "bring the database schema up to date"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_database_options(parser)
    add_migration_options(parser)
    add_logging_options(parser)


def run(args: argparse.Namespace) -> int:
    bounds = MigrationBounds(
        lock=args.migrate_lock_timeout, retries=args.migrate_lock_retries, statement=args.migrate_statement_timeout
    )
    revision = migrate(args.database_url, bounds)
    log = structlog.get_logger("kenning.migrate")
    log.info("schema.ready", revision=revision, database=redacted(args.database_url))
    return 0
