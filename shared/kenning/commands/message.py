"""``kenning message send INSTANCE TOPIC --data JSON``: put a message into an instance's
mailbox, as ``Client.send_message`` does (kenning/messages.py)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from kenning.client import Client
from kenning.client.unavailable import COMMAND_RETRY_SECONDS
from kenning.commands.output import emit, emit_json
from kenning.commands.send import json_value
from kenning.errors import MessageUndeliverableError, UnstorableValueError, UsageError, WorkflowNotFoundError
from kenning.hosting.appload import database_url
from kenning.hosting.config import add_database_options, add_logging_options

HELP = "send a message to a workflow instance's mailbox"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    send = actions.add_parser("send", help="put a message into INSTANCE's TOPIC mailbox (a receive takes it)")
    send.add_argument("instance_id", metavar="INSTANCE", help="the receiving instance's id")
    send.add_argument("topic", metavar="TOPIC", help="the mailbox's topic, as the workflow's receive names it")
    send.add_argument("--data", type=json_value, default=None, help="the message as JSON (default: null)")
    send.add_argument(
        "--id", dest="message_id", default=None, help="message id (default: a new UUID); resending an id is a no-op"
    )
    send.add_argument("--json", action="store_true", help="machine-readable output")
    add_database_options(send)
    add_logging_options(send)


async def _send(args: argparse.Namespace) -> dict[str, Any]:
    async with Client(database_url(args.database_url, None), retry_seconds=COMMAND_RETRY_SECONDS) as client:
        try:
            message_id = await client.send_message(args.instance_id, args.topic, args.data, args.message_id)
        except (WorkflowNotFoundError, MessageUndeliverableError, UnstorableValueError) as error:
            raise UsageError(str(error)) from None
    return {"instance_id": args.instance_id, "topic": args.topic, "message_id": message_id}


def run(args: argparse.Namespace) -> int:
    sent = asyncio.run(_send(args))
    if args.json:
        emit_json(sent)
    else:
        emit(sent["message_id"])
    return 0
