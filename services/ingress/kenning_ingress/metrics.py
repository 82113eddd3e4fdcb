"""The ingress's part of the metrics: ``GET /metrics``, the count and latency of every
request, and the shared directory of its uvicorn workers' figures.

uvicorn's ``--workers N`` are separate processes, and a scrape reaches only one of them.
With more than one, ``kenning ingress`` gives them a fresh directory in
``PROMETHEUS_MULTIPROC_DIR`` (``prometheus_client``'s multiprocess mode) before they
start: each worker writes its counters and histograms there (memory-mapped files, an
increment costs no system call), and the worker that answers a scrape sums every
worker's files. Merging per-process registries ourselves would need each worker to ask
the others at scrape time; the files are how ``prometheus_client`` does it under
gunicorn and uvicorn, and counts of a worker that restarted stay in the sum.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kenning.db import Database
from kenning.observability import metrics
from kenning.runtime.scrape import CONTENT_TYPE, scrape

MULTIPROCESS_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's name for it
# the route label: the first path segment of these; any other POST is an event
ROUTES = ("healthz", "readyz", "cancel", "instances", "metrics")


@contextlib.contextmanager
def shared_metrics_directory(workers: int) -> Iterator[None]:
    """With several workers, a fresh directory for their figures while the block runs
    (set before they start: ``prometheus_client`` reads it on import). One the operator
    set is used as it is, and kept."""
    if workers <= 1 or os.environ.get(MULTIPROCESS_VARIABLE):
        yield
        return
    directory = tempfile.mkdtemp(prefix="kenning-ingress-metrics-")
    os.environ[MULTIPROCESS_VARIABLE] = directory
    try:
        yield
    finally:
        os.environ.pop(MULTIPROCESS_VARIABLE, None)
        shutil.rmtree(directory, ignore_errors=True)


def route_of(method: str, path: str) -> str:
    """The ``route`` label: bounded, whatever paths clients send."""
    first = path.lstrip("/").split("/", 1)[0]
    if first in ROUTES:
        return first
    return "events" if method == "POST" else "other"


class RequestMetrics:
    """ASGI middleware: ``kenning_ingress_requests_total`` and
    ``kenning_ingress_request_duration_seconds`` for every HTTP request (an unhandled
    error counts as the 500 it is answered with)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = route_of(scope["method"], scope["path"])
            metrics.INGRESS_REQUESTS.labels(route, str(status)).inc()
            metrics.INGRESS_REQUEST_DURATION.labels(route).observe(time.perf_counter() - started)


async def metrics_response(database: Database | None) -> Response:
    """``GET /metrics``: every worker's figures (multiprocess mode) or this process's."""
    body = await scrape(metrics.INGRESS, database, multiprocess_dir=os.environ.get(MULTIPROCESS_VARIABLE, ""))
    return Response(body, media_type=CONTENT_TYPE)
