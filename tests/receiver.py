"""A CloudEvents receiver for the relayer tests, run as its own process::

    python -m tests.receiver --port P --record FILE [--hang-first N] [--fail-first N]
        [--fail-status 500] [--status-for-type TYPE=CODE ...] [--hold-file PATH --hold-after N]
        [--delay-ms MS]

Every POST to ``/events`` is parsed with the official cloudevents SDK (binary or
structured mode) and appended, at arrival, as one JSON line to FILE; ``GET /events``
returns the same records and ``GET /health`` answers 200 once the server is up.

Requests are numbered by arrival. The first ``--hang-first`` are never answered (the
client times out); the next ``--fail-first`` get ``--fail-status``; events of a type named
by ``--status-for-type`` always get that status; requests after number ``--hold-after``
wait while ``--hold-file`` exists; the rest get 200 after ``--delay-ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import uvicorn
from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route


def _status_map(pairs: list[str]) -> dict[str, int]:
    statuses: dict[str, int] = {}
    for pair in pairs:
        event_type, _, code = pair.rpartition("=")
        statuses[event_type] = int(code)
    return statuses


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


class Receiver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.record_path = Path(args.record)
        self.status_for_type = _status_map(args.status_for_type)
        self.count = 0
        self.records: list[dict[str, Any]] = []
        self.in_flight: dict[str, int] = {}  # subject -> requests being handled

    def _write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        line = (json.dumps(record) + "\n").encode()
        fd = os.open(self.record_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)  # one write per line: readers never see half a record
        finally:
            os.close(fd)

    def _answer_for(self, n: int, event_type: str | None) -> int | str:
        args = self.args
        if n <= args.hang_first:
            return "hang"
        if n <= args.hang_first + args.fail_first:
            return int(args.fail_status)
        if event_type is not None and event_type in self.status_for_type:
            return self.status_for_type[event_type]
        if args.hold_file and n > args.hold_after and os.path.exists(args.hold_file):
            return "hold"
        return 200

    async def post(self, request: Request) -> Response:
        self.count += 1
        n = self.count
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        record: dict[str, Any] = {
            "n": n,
            "at": time.time(),
            "mode": "binary" if any(k.startswith("ce-") for k in headers) else "structured",
            "content_type": headers.get("content-type"),
        }
        try:
            event = from_http(HTTPMessage(headers=headers, body=body), JSONFormat())
        except Exception as error:
            record.update(answer=400, error=f"{type(error).__name__}: {error}")
            self._write(record)
            return PlainTextResponse("not a CloudEvent", status_code=400)
        data = event.get_data()
        record["attributes"] = {k: _plain(v) for k, v in event.get_attributes().items()}
        if isinstance(data, bytes | bytearray):
            record["data_base64"] = base64.b64encode(bytes(data)).decode()
        else:
            record["data"] = data
        answer = self._answer_for(n, event.get_type())
        record["answer"] = answer
        subject = str(event.get_subject())
        # Requests with the same subject being handled right now: the relayer tests put
        # the instance id there, and an instance's events must go out one at a time.
        record["overlapping"] = self.in_flight.get(subject, 0)
        self.in_flight[subject] = record["overlapping"] + 1
        self._write(record)
        try:
            if answer == "hang":
                await asyncio.sleep(3600)
            if answer == "hold":
                while os.path.exists(self.args.hold_file):
                    await asyncio.sleep(0.01)
                answer = 200
            if self.args.delay_ms:
                await asyncio.sleep(self.args.delay_ms / 1000)
        finally:
            self.in_flight[subject] -= 1
        status = int(answer)
        text = "ok" if status < 300 else f"refused by test receiver (request {n})"
        return PlainTextResponse(text, status_code=status)

    async def list_events(self, request: Request) -> Response:
        return JSONResponse(self.records)

    async def health(self, request: Request) -> Response:
        return PlainTextResponse("ok")


def build_app(args: argparse.Namespace) -> Starlette:
    receiver = Receiver(args)
    return Starlette(
        routes=[
            Route("/events", receiver.post, methods=["POST"]),
            Route("/events", receiver.list_events, methods=["GET"]),
            Route("/health", receiver.health, methods=["GET"]),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="tests.receiver")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--hang-first", type=int, default=0)
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--fail-status", type=int, default=500)
    parser.add_argument("--status-for-type", action="append", default=[])
    parser.add_argument("--hold-file", default="")
    parser.add_argument("--hold-after", type=int, default=0)
    parser.add_argument("--delay-ms", type=int, default=0)
    args = parser.parse_args()
    Path(args.record).touch()
    config = uvicorn.Config(
        build_app(args), host="127.0.0.1", port=args.port, log_level="warning", timeout_graceful_shutdown=1
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
