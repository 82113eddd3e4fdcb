"""An ASGI middleware counting a server's HTTP requests by route and status and timing
them: the ingress's and the console's, each with its own metric families and its own
bounded route label (``route_of``). An unhandled error counts as the 500 it is answered
with."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class RequestMetrics:
    def __init__(
        self, app: ASGIApp, *, route_of: Callable[[Scope], str], requests: Counter, duration: Histogram
    ) -> None:
        self.app = app
        self.route_of = route_of
        self.requests = requests
        self.duration = duration

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
            route = self.route_of(scope)  # after the app: the router has written its route into scope
            self.requests.labels(route, str(status)).inc()
            self.duration.labels(route).observe(time.perf_counter() - started)
