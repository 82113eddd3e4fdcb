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
from collections.abc import Iterator

from starlette.responses import Response
from starlette.types import ASGIApp

from kenning.db import Database
from kenning.hosting.request_metrics import RequestMetrics
from kenning.hosting.scrape import CONTENT_TYPE, scrape
from kenning.observability import metrics

MULTIPROCESS_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's name for it
# the route label: the first path segment of these; any other POST is an event
ROUTES = ("healthz", "readyz", "cancel", "instances", "metrics")
ROUTES_LABELLED = (*ROUTES, "events", "other")  # every value route_of answers


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


def request_metrics(app: ASGIApp) -> RequestMetrics:
    """``kenning_ingress_requests_total`` and ``kenning_ingress_request_duration_seconds``."""
    return RequestMetrics(
        app,
        route_of=lambda scope: route_of(scope["method"], scope["path"]),
        requests=metrics.INGRESS_REQUESTS,
        duration=metrics.INGRESS_REQUEST_DURATION,
    )


async def metrics_response(database: Database | None) -> Response:
    """``GET /metrics``: every worker's figures (multiprocess mode) or this process's."""
    body = await scrape(metrics.INGRESS, database, multiprocess_dir=os.environ.get(MULTIPROCESS_VARIABLE, ""))
    return Response(body, media_type=CONTENT_TYPE)
