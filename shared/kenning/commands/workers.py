"""``kenning workers list``: who is running, from the fleet's registry.

Every process (worker, scheduler, relayer, ingress, console) registers and heartbeats
(``kenning.hosting.presence``); this lists them, live or stale, with where they run
(host, pid), on which version (Kenning's, and a worker's code fingerprint), and what
each says of itself: a worker's workflows, queues and how busy it is (running /
concurrency). ``--kind worker`` keeps one kind, ``--live`` only the live ones.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict
from typing import Any

from kenning.commands.output import emit, emit_json, table
from kenning.db import connect
from kenning.hosting.config import add_database_options, add_logging_options
from kenning.storage import processes as processes_sql
from kenning.storage.processes import ProcessEntry

HELP = "list the fleet's processes (workers, schedulers, relayers, ingresses, consoles): live or stale, and what runs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every registered process: kind, live or stale, host, version, load")
    listing.add_argument("--kind", choices=processes_sql.KINDS, help="only processes of this kind")
    listing.add_argument("--live", action="store_true", help="only live processes (stale ones are shown by default)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    add_database_options(listing)
    add_logging_options(listing)


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.0f}h ago"


def _busy(entry: ProcessEntry) -> str | None:
    concurrency = entry.details.get("concurrency")
    return None if concurrency is None else f"{entry.details.get('running', 0)}/{concurrency}"


def _runs(entry: ProcessEntry) -> str | None:
    names = entry.details.get("workflows") or entry.details.get("schedules")
    return ",".join(str(n) for n in names) if names else None


def as_json(entry: ProcessEntry) -> dict[str, Any]:
    found = asdict(entry)
    found["state"] = "live" if entry.live else "stale"
    return found


async def _list(args: argparse.Namespace) -> list[ProcessEntry]:
    database = connect(args.database_url, pool_size=1, max_overflow=0)
    try:
        async with database.connection() as conn:
            entries = await processes_sql.processes_list(conn, kind=args.kind)
    finally:
        await database.dispose()
    return [e for e in entries if e.live or not args.live]


def run(args: argparse.Namespace) -> int:
    entries = asyncio.run(_list(args))
    if args.json:
        emit_json([as_json(e) for e in entries])
        return 0
    if not entries:
        kind = f" of kind {args.kind}" if args.kind else ""
        emit(f"no {'live ' if args.live else ''}process is registered{kind}")
        return 0
    rows = [
        (
            e.id,
            e.kind,
            "live" if e.live else "stale",
            f"{e.host}:{e.pid}",
            e.version + (f" ({e.details['code_version']})" if e.details.get("code_version") else ""),
            _busy(e),
            _runs(e),
            ",".join(e.details.get("queues") or []) or None,
            _ago(e.seen_seconds_ago),
        )
        for e in entries
    ]
    emit(table(["id", "kind", "state", "host:pid", "version", "busy", "workflows", "queues", "last seen"], rows))
    return 0
