"""The console's ``GET /metrics``: its requests by route, counted by a middleware.

The route label is the matched route's path template (``/instances/{instance_id:path}``),
or ``other`` for a path no route matched: bounded by the route list, whatever paths
browsers and scanners send. The endpoint carries no token, as ``/healthz`` and the
ingress's ``/metrics``: request counts and the process's own figures say nothing about
workflows' data, and a Prometheus scrape cannot log in.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Scope

from kenning.hosting.request_metrics import RequestMetrics
from kenning.hosting.scrape import CONTENT_TYPE, scrape
from kenning.observability import metrics
from kenning_console.state import console_of

PATH = "/metrics"


def route_of(scope: Scope) -> str:
    """The ``route`` label of a request the router has seen."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) and path else "other"


def request_metrics(app: ASGIApp) -> RequestMetrics:
    """``kenning_console_requests_total`` and ``kenning_console_request_duration_seconds``."""
    return RequestMetrics(
        app, route_of=route_of, requests=metrics.CONSOLE_REQUESTS, duration=metrics.CONSOLE_REQUEST_DURATION
    )


async def metrics_page(request: Request) -> Response:
    """The console's figures (no database gauges: the scheduler reports those)."""
    body = await scrape(metrics.CONSOLE, console_of(request).database)
    return Response(body, media_type=CONTENT_TYPE)


def routes() -> list[BaseRoute]:
    return [Route(PATH, metrics_page, methods=["GET"])]
