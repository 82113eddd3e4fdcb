"""What ``GET /metrics`` answers, and the small HTTP server that answers it.

A scrape renders the process's own metrics in Prometheus's text format: the event
families its kind of process exports (``kenning.observability.metrics.exported_by``; every
process imports all of them, none reports another's), the process and GC collectors, and
any the application registered. The scheduler's (``DATABASE_GAUGES_PROCESS``) also reads
the database gauges with one statement (``kenning.storage.metrics``; a database that does
not answer within ``QUERY_TIMEOUT`` gives ``kenning_database_metrics_up 0`` and the
in-process metrics still).

The worker, scheduler and relayer serve it on ``--metrics-port`` (off by default) with
``serving_metrics``: an ``asyncio`` server on the process's own event loop, so a scrape
waits on the database without blocking anything and no thread touches the process's
objects; it stops after the service drained (a scrape during the drain is answered).
The same server answers ``GET /readyz``: 200, or 503 with the reason the process is not
ready (its commits do not complete: ``kenning.hosting.commitwatch``), as the ingress's
and the console's ``/readyz`` do.
The ingress and the console serve it as a route of their app; with several
uvicorn workers it uses ``prometheus_client``'s multiprocess mode, so the one worker
that answers a scrape reports every worker's counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterable

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from kenning.core.records import MetricsRow
from kenning.db import Database
from kenning.observability.metrics import DATABASE_GAUGES_PROCESS, DatabaseGauges, event_families
from kenning.storage.metrics import metrics_snapshot

_log = structlog.get_logger("kenning.metrics")

QUERY_TIMEOUT = 5.0  # seconds the database gauges may take before a scrape goes without them
REQUEST_TIMEOUT = 10.0  # seconds a scraper has to send its request line and headers
MAX_REQUEST_BYTES = 16 * 1024
CONTENT_TYPE = CONTENT_TYPE_LATEST
JSON_TYPE = "application/json"

# why the process is not ready, or None (``CommitWatch.verdict``)
Readiness = Callable[[], str | None]


class _ThisProcess(Collector):
    """The process's registry (Kenning's metrics, the process and GC collectors, and any
    the application registered), as one collector of a scrape's registry."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


class _Exported(Collector):
    """``source``'s metrics without the event families another kind of process exports
    (a family this module does not know, the application's, passes)."""

    def __init__(self, source: Collector, process: str) -> None:
        self.source = source
        self.process = process
        self.others = {name for name, exporters in event_families().items() if process not in exporters}

    def collect(self) -> Iterable[Metric]:
        return (metric for metric in self.source.collect() if metric.name not in self.others)


async def database_rows(database: Database | None) -> list[MetricsRow] | None:
    """The database gauges' snapshot, or None if the database did not answer in time."""
    if database is None:
        return None
    try:
        async with asyncio.timeout(QUERY_TIMEOUT), database.connection() as conn:
            return await metrics_snapshot(conn)
    except Exception as error:  # a scrape never fails for the database: it says so
        _log.warning("metrics.database_unavailable", error=repr(error))
        return None


async def scrape(process: str, database: Database | None, *, multiprocess_dir: str = "") -> bytes:
    """The text of one scrape of a ``process`` (``kenning.observability.metrics.PROCESSES``):
    its metrics, or with ``multiprocess_dir`` those every process wrote there (the
    ingress's workers); then, for the scheduler, the database gauges."""
    registry = CollectorRegistry(auto_describe=False)
    # registered through the filter only: the files hold every family a worker created
    source: Collector = (
        MultiProcessCollector(None, path=multiprocess_dir)  # type: ignore[no-untyped-call]
        if multiprocess_dir
        else _ThisProcess()
    )
    registry.register(_Exported(source, process))
    if process == DATABASE_GAUGES_PROCESS:
        registry.register(DatabaseGauges(await database_rows(database)))
    return generate_latest(registry)


# ---------------------------------------------------------------- the HTTP server


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


async def _request_line(reader: asyncio.StreamReader) -> list[str]:
    """The request line's words, once the headers were read (their content is not used)."""
    async with asyncio.timeout(REQUEST_TIMEOUT):
        head = await reader.readuntil(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0].decode("latin-1").split()


def readiness_body(reason: str | None) -> tuple[int, bytes]:
    """``/readyz``'s status and JSON body, for every process: ready, or why not."""
    if reason is None:
        return 200, json.dumps({"status": "ready"}).encode()
    return 503, json.dumps({"status": "not_ready", "reason": reason}).encode()


class MetricsServer:
    """``GET /metrics`` and ``GET /readyz`` on ``host:port``, one request per connection."""

    def __init__(
        self, process: str, database: Database | None, host: str, port: int, readiness: Readiness | None = None
    ) -> None:
        self.process = process
        self.database = database
        self.host = host
        self.port = port
        self.readiness = readiness
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen; a port in use raises ``OSError`` (the command's one-line error)."""
        self._server = await asyncio.start_server(self._answer, self.host, self.port, limit=MAX_REQUEST_BYTES)
        if self.port == 0:  # an ephemeral port (tests): the one the system chose
            self.port = self._server.sockets[0].getsockname()[1]
        _log.info("metrics.serving", url=f"http://{self.host}:{self.port}/metrics")

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(QUERY_TIMEOUT):
                    await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            words = await _request_line(reader)
            writer.write(await self._response_to(words))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a client that went away or sent no request: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _response_to(self, words: list[str]) -> bytes:
        if len(words) != 3:
            return _response("400 Bad Request", b"bad request line\n")
        method, target, _ = words
        path = target.split("?", 1)[0]
        if path not in ("/metrics", "/readyz"):
            return _response("404 Not Found", b"only /metrics and /readyz are served here\n")
        if method not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", f"GET {path}\n".encode())
        if path == "/readyz":
            code, body = readiness_body(self.readiness() if self.readiness is not None else None)
            response = _response("200 OK" if code == 200 else "503 Service Unavailable", body, JSON_TYPE)
        else:
            body = await scrape(self.process, self.database)
            response = _response("200 OK", body, CONTENT_TYPE)
        return response[: len(response) - len(body)] if method == "HEAD" else response


@contextlib.asynccontextmanager
async def serving_metrics(
    process: str, database: Database, host: str, port: int, readiness: Readiness | None = None
) -> AsyncIterator[MetricsServer | None]:
    """``process``'s ``GET /metrics`` and ``GET /readyz`` on ``host:port`` while the block
    runs (nothing when ``port`` is 0, the settings' "off")."""
    if not port:
        yield None
        return
    server = MetricsServer(process, database, host, port, readiness)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
