"""``kenning sink``: a local CloudEvents receiver that logs what the relayer publishes.

The broker stand-in for ``kenning up`` and compose when no ``--broker-url`` is given.
Every request is answered 202 and logged as ``sink.received`` with its attributes.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kenning.hosting.config import add_logging_options, add_option, positive_int

_log = structlog.get_logger("kenning.sink")


async def receive(request: Request) -> JSONResponse:
    body = await request.body()
    attributes: dict[str, Any] = {k[3:]: v for k, v in request.headers.items() if k.startswith("ce-")}
    data: Any = body.decode(errors="replace")
    if request.headers.get("content-type", "").startswith("application/cloudevents+json"):
        try:
            structured = json.loads(body)
            data = structured.pop("data", None)
            attributes.update(structured)
        except ValueError:
            pass
    _log.info("sink.received", path=request.url.path, data=data, **attributes)
    return JSONResponse({"status": "received"}, status_code=202)


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


def create_app() -> Starlette:
    return Starlette(routes=[Route("/healthz", healthz), Route("/{path:path}", receive, methods=["POST"])])


HELP = "a local CloudEvents receiver that logs what it gets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--sink-host", default="127.0.0.1", help="address to listen on")
    add_option(parser, "--sink-port", default=9000, type=positive_int, help="port to listen on")
    add_logging_options(parser)


def run(args: argparse.Namespace) -> int:
    _log.info("sink.started", url=f"http://{args.sink_host}:{args.sink_port}/")
    uvicorn.run(create_app(), host=args.sink_host, port=args.sink_port, log_level="warning")
    return 0
