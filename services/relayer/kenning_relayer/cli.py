"""``kenning outbox list`` and ``kenning outbox retry``: the operator's view of the outbox.

``list`` shows events newest first (``--status failed`` for the dead letters), as a table
or as JSON; ``retry ID...`` or ``retry --all-failed`` puts dead-lettered events back to
pending with a fresh attempt count, and the relayers pick them up at once (NOTIFY).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from kenning.db import connect
from kenning.errors import ConfigurationError
from kenning.hosting.config import add_database_options, add_logging_options, positive_int
from kenning.storage import outbox as outbox_sql
from kenning.storage.outbox import OUTBOX_STATUSES, OutboxRow

_ERROR_WIDTH = 80


HELP = "list outbox events and retry dead-lettered ones"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="outbox_action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="list outbox events, newest first")
    listing.add_argument("--status", choices=OUTBOX_STATUSES, help="only events in this state")
    listing.add_argument("--instance", help="only events sent by this workflow instance")
    listing.add_argument("--limit", type=positive_int, default=50, help="at most this many (default 50)")
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")
    retry = actions.add_parser("retry", help="put failed (dead-lettered) events back to pending")
    retry.add_argument("ids", nargs="*", metavar="ID", help="event ids (the CloudEvents id)")
    retry.add_argument("--all-failed", action="store_true", help="every failed event")
    retry.add_argument("--json", action="store_true", help="JSON instead of text")
    for sub in (listing, retry):
        add_database_options(sub)
        add_logging_options(sub)


def run(args: argparse.Namespace) -> int:
    if args.outbox_action == "list":
        return asyncio.run(_list(args))
    return asyncio.run(_retry(args))


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def row_json(row: OutboxRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "status": row.status,
        "attempts": row.attempts,
        "type": row.event_type,
        "source": row.source,
        "subject": row.subject,
        "instance_id": row.instance_id,
        "content_type": row.content_type,
        "data": row.data,
        "data_base64": None if row.data_bytes is None else base64.b64encode(row.data_bytes).decode(),
        "extensions": row.extensions,
        "last_error": row.last_error,
        "lease_owner": row.lease_owner,
        "created_at": _iso(row.created_at),
        "last_attempt_at": _iso(row.last_attempt_at),
        "next_attempt_at": _iso(row.available_at) if row.status == "pending" else None,
        "published_at": _iso(row.published_at),
    }


def _short_time(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def render_table(rows: Sequence[OutboxRow]) -> str:
    header = ("ID", "STATUS", "ATTEMPTS", "TYPE", "INSTANCE", "CREATED", "LAST ERROR")
    lines = [
        (
            row.id,
            row.status,
            str(row.attempts),
            row.event_type,
            row.instance_id or "-",
            _short_time(row.created_at),
            " ".join((row.last_error or "-").split())[:_ERROR_WIDTH],
        )
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in (header, *lines)) for i in range(len(header))]
    out = [
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in (header, *lines)
    ]
    return "\n".join(out) + "\n"


async def _list(args: argparse.Namespace) -> int:
    database = connect(args.database_url, pool_size=1, max_overflow=0)
    try:
        async with database.connection() as conn:
            rows = await outbox_sql.outbox_list(conn, status=args.status, instance_id=args.instance, limit=args.limit)
    finally:
        await database.dispose()
    if args.json:
        sys.stdout.write(json.dumps([row_json(r) for r in rows], indent=2) + "\n")
    elif rows:
        sys.stdout.write(render_table(rows))
    else:
        sys.stdout.write("no outbox events" + (f" with status {args.status}" if args.status else "") + "\n")
    return 0


def _event_ids(raw: Sequence[str]) -> list[str]:
    ids = []
    for text in raw:
        try:
            ids.append(str(uuid.UUID(text)))
        except ValueError:
            raise ConfigurationError(f"{text!r} is not an outbox event id (a UUID)") from None
    return ids


async def _retry(args: argparse.Namespace) -> int:
    if bool(args.ids) == bool(args.all_failed):
        raise ConfigurationError("name the events to retry (ID ...) or pass --all-failed, not both")
    ids = _event_ids(args.ids)
    database = connect(args.database_url, pool_size=1, max_overflow=0)
    try:
        async with database.transaction() as conn:
            retried = await outbox_sql.outbox_retry_failed(conn, None if args.all_failed else ids)
            statuses = await outbox_sql.outbox_statuses(conn, [i for i in ids if i not in retried])
    finally:
        await database.dispose()
    problems = {
        event_id: (f"is {statuses[event_id]}, not failed" if event_id in statuses else "does not exist")
        for event_id in ids
        if event_id not in retried
    }
    if args.json:
        sys.stdout.write(json.dumps({"retried": retried, "not_retried": problems}, indent=2) + "\n")
    else:
        sys.stdout.write(f"retried {len(retried)} event(s)\n" + "".join(f"{i}\n" for i in retried))
        for event_id, problem in problems.items():
            sys.stderr.write(f"kenning outbox retry: event {event_id} {problem}\n")
    return 1 if problems else 0
