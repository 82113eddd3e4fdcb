"""``kenning request INSTANCE TOPIC [DATA] --timeout S``: send a request to an instance's
mailbox and print the workflow's reply as JSON, as ``Client.request`` does
(kenning/messages.py, ``ReceivedMessage.reply``).

Exit codes: 0 with the reply on stdout; 2 for bad input, an unknown instance or one that
had ended (one line on stderr); 1 when the instance ended without replying or refused
the request; 124 (as ``timeout(1)``) when no reply came within ``--timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from kenning.client import Client
from kenning.client.unavailable import COMMAND_RETRY_SECONDS
from kenning.commands.output import emit_json
from kenning.commands.send import json_value
from kenning.errors import MessageUndeliverableError, RequestTimeoutError, UnstorableValueError, UsageError
from kenning.hosting.appload import database_url
from kenning.hosting.config import add_database_options, add_logging_options, non_negative_float

HELP = "send a request to a workflow instance and print its reply"

# the exit code of a request that got no reply in time (timeout(1)'s)
TIMED_OUT = 124


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("instance_id", metavar="INSTANCE", help="the instance that answers")
    parser.add_argument("topic", metavar="TOPIC", help="the mailbox's topic, as the workflow's receive names it")
    parser.add_argument("data", metavar="DATA", type=json_value, nargs="?", default=None, help="JSON (default: null)")
    parser.add_argument(
        "--timeout", type=non_negative_float, default=60.0, help="seconds to wait for the reply (default: 60)"
    )
    parser.add_argument(
        "--id", dest="request_id", default=None, help="request id (default: a new UUID); asking again gets its reply"
    )
    add_database_options(parser)
    add_logging_options(parser)


async def _request(args: argparse.Namespace) -> Any:
    async with Client(database_url(args.database_url, None), retry_seconds=COMMAND_RETRY_SECONDS) as client:
        try:
            return await client.request(
                args.instance_id, args.topic, args.data, timeout=args.timeout, request_id=args.request_id
            )
        except (MessageUndeliverableError, UnstorableValueError) as error:
            raise UsageError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    try:
        reply = asyncio.run(_request(args))
    except RequestTimeoutError as error:
        sys.stderr.write(f"kenning request: {error}\n")
        return TIMED_OUT
    emit_json(reply)
    return 0
