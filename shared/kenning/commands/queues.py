"""``kenning queues list|pause|resume``: the operator's view of queues with limits.

``list`` shows each queue's limits, whether it is paused, its depth (instances waiting for
a slot, due or backing off), how many run now (leased) and how long the oldest due one has
waited. ``pause NAME`` stops every claim of the queue (instances running go on, and
finish); ``resume NAME`` lets the claims take it again and wakes the workers.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict

from kenning.commands.output import emit, emit_json, table
from kenning.commands.steering import cli_who
from kenning.db import connect
from kenning.errors import UsageError
from kenning.hosting.config import add_database_options, add_logging_options
from kenning.storage import actions as actions_sql
from kenning.storage import queues as queues_sql
from kenning.storage.actions import OperatorAction
from kenning.storage.queues import QueueOverview

HELP = "list queues (depth, running, oldest age, limits, paused); pause or resume one"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every queue: limits, paused, depth, running, oldest due")
    pause = actions.add_parser("pause", help="no claim takes the queue's instances until resumed")
    pause.add_argument("name")
    resume = actions.add_parser("resume", help="claims take the queue's instances again")
    resume.add_argument("name")
    for sub in (listing, pause, resume):
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        add_database_options(sub)
        add_logging_options(sub)


def _limits(q: QueueOverview) -> str:
    parts = [
        f"concurrency={q.concurrency}" if q.concurrency else "",
        f"worker={q.worker_concurrency}" if q.worker_concurrency else "",
        f"rate={q.rate_limit}/{q.rate_period_seconds:g}s" if q.rate_limit and q.rate_period_seconds else "",
        f"partition={q.partition_concurrency}" if q.partition_concurrency else "",
        f"strategy={q.partition_strategy}" if q.partition_strategy != "wait" else "",
        f"key_rate={q.key_rate_limit}/{q.key_rate_period_seconds:g}s"
        if q.key_rate_limit and q.key_rate_period_seconds
        else "",
    ]
    return " ".join(p for p in parts if p) or "none"


async def _run(args: argparse.Namespace) -> int:
    database = connect(args.database_url, pool_size=1, max_overflow=0)
    try:
        async with database.transaction() as conn:  # a pause and its record commit together
            if args.action == "list":
                queues = await queues_sql.queues_overview(conn)
                if args.json:
                    emit_json([asdict(q) for q in queues])
                    return 0
                rows = [
                    (
                        q.name,
                        q.depth,
                        q.running,
                        None if q.oldest_seconds is None else f"{q.oldest_seconds:.1f}s",
                        _limits(q),
                        "yes" if q.paused else "no",
                    )
                    for q in queues
                ]
                emit(table(["queue", "depth", "running", "oldest", "limits", "paused"], rows))
                return 0
            paused = args.action == "pause"
            if not await queues_sql.queue_set_paused(conn, args.name, paused):
                raise UsageError(f"no queue {args.name!r}: kenning queues list shows the queues there are")
            who = cli_who()
            action = OperatorAction(f"queue-{args.action}", who.origin, who.actor, target=args.name, affected=1)
            await actions_sql.action_record(conn, action)
            if args.json:
                emit_json({"queue": args.name, "paused": paused})
            else:
                emit(f"{args.name}: {'paused' if paused else 'resumed'}")
            return 0
    finally:
        await database.dispose()


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))
