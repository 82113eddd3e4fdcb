"""``kenning start WORKFLOW --input JSON``: start an instance from the shell."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from kenning.appload import load_app
from kenning.client import Client
from kenning.commands.output import emit, emit_json
from kenning.config import add_database_options, add_logging_options, add_option


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"invalid JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object of keyword arguments")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workflow", help="workflow name")
    parser.add_argument("--input", type=json_object, default={}, help="keyword arguments as a JSON object")
    parser.add_argument("--instance-id", help="explicit id; starting again returns the same instance")
    parser.add_argument("--idempotency-key", help="starting again with this key returns the same instance")
    parser.add_argument("--wait", type=float, metavar="SECONDS", help="wait this long for the result")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_option(parser, "--app", default="", help="optional: modules defining workflows, to check the input")
    add_database_options(parser)
    add_logging_options(parser)


async def _run(args: argparse.Namespace) -> int:
    if args.app:
        load_app(args.app)
    async with Client(args.database_url) as client:
        started = await client.start(
            args.workflow, instance_id=args.instance_id, idempotency_key=args.idempotency_key, **args.input
        )
        outcome: dict[str, Any] = {"instance_id": started.instance_id, "created": started.created}
        if args.wait is not None:
            outcome["result"] = await client.result(started.instance_id, timeout=args.wait)
    if args.json:
        emit_json(outcome)
    else:
        emit(started.instance_id if "result" not in outcome else f"{started.instance_id} {outcome['result']!r}")
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))
