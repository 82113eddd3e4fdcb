"""``kenning actions list``: the operator action log, newest first: every cancel, retry,
terminate, skipped compensation, bulk action and queue pause or resume, from the CLI or
the console, with when, who and from where, on what (an id or a bulk filter), how many
rows it changed and why."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict

from kenning.commands.output import emit, emit_json, table
from kenning.db import connect
from kenning.hosting.config import add_database_options, add_logging_options, positive_int
from kenning.storage import actions as actions_sql

HELP = "list what operators did (cancel, retry, terminate, bulk actions, queue pauses), newest first"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="newest first")
    listing.add_argument("--target", help="only actions on this instance id or queue name")
    listing.add_argument("--kind", help="only this action (cancel, retry, terminate, skip-compensation, ...)")
    listing.add_argument("--limit", type=positive_int, default=50)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    add_database_options(listing)
    add_logging_options(listing)


async def _run(args: argparse.Namespace) -> int:
    database = connect(args.database_url, pool_size=1, max_overflow=0)
    try:
        async with database.connection() as conn:
            rows = await actions_sql.actions_list(conn, target=args.target, action=args.kind, limit=args.limit)
    finally:
        await database.dispose()
    if args.json:
        emit_json([asdict(r) for r in rows])
        return 0
    emit(
        table(
            ["at", "action", "from", "who", "on", "affected", "reason"],
            [(r.at, r.action, r.origin, r.actor, r.target or r.filter, r.affected, r.reason) for r in rows],
        )
        if rows
        else "no operator action recorded"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))
