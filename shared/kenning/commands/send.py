"""``kenning send TYPE --source S --data JSON``: post a CloudEvent to the ingress."""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

import httpx
from cloudevents.core.bindings.http import to_binary
from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from kenning.commands.output import emit
from kenning.errors import UsageError
from kenning.hosting.config import add_logging_options, add_option


def json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"invalid JSON: {error}") from None


def extension(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.isalnum() or name.lower() != name:
        raise argparse.ArgumentTypeError("extensions are name=value with a lower-case alphanumeric name")
    return name, value


HELP = "post a CloudEvent to the ingress"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("type", help="CloudEvent type, e.g. order.created")
    parser.add_argument("--source", default="kenning-cli", help="CloudEvent source")
    parser.add_argument("--data", type=json_value, default=None, help="event data as JSON")
    parser.add_argument("--id", default=None, help="event id (default: a new UUID); resending an id is a no-op")
    parser.add_argument("--subject", default=None)
    parser.add_argument("--extension", type=extension, action="append", default=[], metavar="NAME=VALUE")
    add_option(parser, "--ingress-url", default="http://127.0.0.1:8000", help="the ingress base URL")
    add_option(parser, "--ingress-token", default="", help="bearer token, if the ingress requires one")
    add_logging_options(parser)


def run(args: argparse.Namespace) -> int:
    attributes: dict[str, Any] = {"type": args.type, "source": args.source, "id": args.id or str(uuid.uuid4())}
    if args.subject:
        attributes["subject"] = args.subject
    attributes.update(dict(args.extension))
    try:
        message = to_binary(CloudEvent(attributes, args.data), JSONFormat())
    except BaseCloudEventException as error:
        raise UsageError(f"not a valid CloudEvent: {' '.join(str(error).split())}") from None
    headers, body = dict(message.headers), message.body
    if args.ingress_token:
        headers["Authorization"] = f"Bearer {args.ingress_token}"
    try:
        response = httpx.post(args.ingress_url.rstrip("/") + "/", headers=headers, content=body, timeout=10)
    except (httpx.HTTPError, httpx.InvalidURL) as error:
        raise UsageError(f"cannot reach the ingress at {args.ingress_url}: {error}") from None
    emit(f"{response.status_code} {response.text.strip()}")
    return 0 if response.is_success else 1
