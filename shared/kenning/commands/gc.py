"""``kenning gc [--dry-run]``: one retention sweep now, as the scheduler runs them.

It deletes, in the scheduler's small batches, what has expired under the retention
settings (the same options and ``KENNING_*`` variables as ``kenning scheduler``'s, so one
``.env`` gives both the same policy): finished instances with their history, processed
inbox rows, published outbox rows. ``--dry-run`` counts them and deletes nothing.
"""

from __future__ import annotations

import argparse
import asyncio

from kenning.commands.output import emit, emit_json, table
from kenning.db import connect
from kenning.hosting.config import add_database_options, add_logging_options, add_settings, settings_from_args
from kenning.hosting.retention import RetentionSettings, SweepResult, count_expired, sweep

HELP = "delete expired finished instances, processed inbox and published outbox rows now (--dry-run: count them)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_settings(parser, RetentionSettings)
    add_database_options(parser)
    add_logging_options(parser)


async def _run(args: argparse.Namespace) -> SweepResult:
    policy = settings_from_args(RetentionSettings, args).policy()
    database = connect(args.database_url, pool_size=1, max_overflow=0)
    try:
        return await (count_expired(database, policy) if args.dry_run else sweep(database, policy))
    finally:
        await database.dispose()


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(_run(args))
    counts = result.as_dict()
    if args.json:
        emit_json({"dry_run": args.dry_run, **counts})
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    emit(table(["rows", verb], list(counts.items())))
    return 0
