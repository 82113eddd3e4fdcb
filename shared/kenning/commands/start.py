"""``kenning start WORKFLOW --input JSON``: start an instance from the shell."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from kenning.client import Client, InvalidInputError, ResultTimeoutError
from kenning.commands.output import emit, emit_json
from kenning.core.suggest import did_you_mean
from kenning.errors import UsageError
from kenning.hosting.appload import database_url, load_app
from kenning.hosting.config import add_database_options, add_logging_options, add_option
from kenning.registry import REGISTRY
from kenning.storage import definitions as definitions_sql


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"invalid JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object of keyword arguments")
    return value


HELP = "start a workflow instance"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workflow", help="workflow name")
    parser.add_argument("--input", type=json_object, default={}, help="keyword arguments as a JSON object")
    parser.add_argument("--instance-id", help="explicit id; starting again returns the same instance")
    parser.add_argument("--idempotency-key", help="starting again with this key returns the same instance")
    parser.add_argument("--wait", type=float, metavar="SECONDS", help="wait this long for the result")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--allow-unknown", action="store_true", help="start it even if no process ever registered this workflow"
    )
    add_option(
        parser,
        "--app",
        default="",
        help="optional: modules defining workflows, to check the input (its App's db_url is the fallback)",
    )
    add_database_options(parser)
    add_logging_options(parser)


async def _check_known(client: Client, name: str) -> None:
    """Refuse a workflow no process ever registered: no worker would ever claim it."""
    if name in REGISTRY.workflows:  # --app defines it: the start registers it
        return
    async with client.database.connection() as conn:
        names = await definitions_sql.definition_names(conn)
    if name not in names:
        hint = did_you_mean(name, {*names, *REGISTRY.workflows})
        raise UsageError(
            f"no workflow {name!r} was ever registered{hint} "
            "(a worker registers its workflows when it starts; --allow-unknown starts it anyway)"
        )


async def _run(args: argparse.Namespace) -> int:
    app = load_app(args.app) if args.app.strip() else None
    async with Client(database_url(args.database_url, app)) as client:  # else the App's db_url
        if not args.allow_unknown:
            await _check_known(client, args.workflow)
        try:
            started = await client.start(
                args.workflow, instance_id=args.instance_id, idempotency_key=args.idempotency_key, **args.input
            )
        except InvalidInputError as error:
            raise UsageError(str(error)) from None
        outcome: dict[str, Any] = {"instance_id": started.instance_id, "created": started.created}
        if started.cancelled:  # its queue's cancel_newest ended it at once: its key is at its limit
            outcome["cancelled"] = True
        if args.wait is not None:
            try:
                outcome["result"] = await client.result(started.instance_id, timeout=args.wait)
            except ResultTimeoutError as error:
                raise UsageError(f"{error}; it goes on: `kenning instances show {started.instance_id}`") from None
    if args.json:
        emit_json(outcome)
    else:
        emit(started.instance_id if "result" not in outcome else f"{started.instance_id} {outcome['result']!r}")
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))
