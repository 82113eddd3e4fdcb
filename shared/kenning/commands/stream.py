"""``kenning stream read INSTANCE KEY [--offset N] [--follow]``: print a durable stream's
entries (``write_stream``) as JSON lines, as ``Client.read_stream`` yields them: each
``{"offset", "attempt", "step", "time", "value"}`` on one line, flushed as it comes.

Without ``--follow`` it prints the entries written so far and exits; with it, it waits
for each new one and exits 0 at the stream's close (``close_stream`` or the instance's
end). Exit code 2, one line on stderr, for an unknown instance or a bad key or offset.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from kenning.client import Client
from kenning.core.streams import check_stream_key, entry_as_json
from kenning.errors import UsageError
from kenning.hosting.appload import database_url
from kenning.hosting.config import add_database_options, add_logging_options, non_negative_int

HELP = "read a workflow instance's durable stream"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    read = actions.add_parser("read", help="print the entries of INSTANCE's stream KEY as JSON lines")
    read.add_argument("instance_id", metavar="INSTANCE", help="the writing instance's id")
    read.add_argument("key", metavar="KEY", help="the stream's key, as write_stream names it")
    read.add_argument("--offset", type=non_negative_int, default=0, help="the first entry's offset (default: 0)")
    read.add_argument(
        "--follow", action="store_true", help="wait for new entries until the stream closes (else: exit at the last)"
    )
    add_database_options(read)
    add_logging_options(read)


async def _read(args: argparse.Namespace) -> None:
    try:
        check_stream_key(args.key)
    except ValueError as error:
        raise UsageError(str(error)) from None
    async with Client(database_url(args.database_url, None)) as client:
        async for entry in client.read_stream(args.instance_id, args.key, args.offset, follow=args.follow):
            sys.stdout.write(json.dumps(entry_as_json(entry), separators=(",", ":")) + "\n")
            sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    asyncio.run(_read(args))
    return 0
