"""The ingress Starlette app: CloudEvents in, inbox rows out, nothing else.

It never runs user code and never touches workflow state: an event is answered 202 once
its inbox row is committed (a request's events all or nothing; concurrent requests share
one insert and commit, ``groupcommit``), and workers do the rest. Routes:
``POST /cancel/{id}``, ``GET /instances/{id}``, ``GET /instances/{id}/streams/{key}`` (a
durable stream as Server-Sent Events, ``kenning_ingress.streams``), ``GET /healthz``, ``GET /readyz``,
``GET /metrics`` (Prometheus, ``kenning_ingress.metrics``); ``POST`` to any other path is
a CloudEvent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kenning import codecs
from kenning.client.results import ResultWaits
from kenning.client.streams import StreamReaders
from kenning.core.streams import sse_start_offset
from kenning.core.urls import hide_credentials
from kenning.db import Database, Executor
from kenning.db.errors import may_be_one_callers_fault
from kenning.db.groupcommit import GroupCommit
from kenning.errors import ObjectStoreError
from kenning.hosting.config import process_id
from kenning.hosting.presence import Presence
from kenning.objects import payloads
from kenning.observability import metrics, tracing
from kenning.observability.logs import configure_logging
from kenning.storage import inbox as inbox_sql
from kenning.storage import instances as instances_sql
from kenning.storage import streams as streams_sql
from kenning.storage.inbox import NewEvent
from kenning_ingress import responses
from kenning_ingress.auth import authorized, required_token
from kenning_ingress.metrics import ROUTES_LABELLED, metrics_response, request_metrics
from kenning_ingress.parsing import InvalidEventError, parse_request
from kenning_ingress.settings import IngressSettings, settings_from_environment
from kenning_ingress.sources import running_sources
from kenning_ingress.streams import HEADERS, checked_key, events, on_exit_signals

T = TypeVar("T")
_log = structlog.get_logger("kenning.ingress")
_RESERVED = ("healthz", "readyz", "cancel", "instances", "metrics")
AUTOCOMMIT_CONNECTIONS = 10


class BodyTooLargeError(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (``BodyTooLargeError``) as soon as it exceeds ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise BodyTooLargeError()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError()
        chunks.append(chunk)
    return b"".join(chunks)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


class Ingress:
    def __init__(self, settings: IngressSettings) -> None:
        self.settings = settings
        self.database: Database | None = None
        self.presence: Presence | None = None  # its registry entry and commit watch, while it serves
        # the event streams' readers: one LISTEN connection and one read per stream per wake
        self.readers: StreamReaders | None = None
        self.stopping = asyncio.Event()  # asked to stop: event streams end, their clients resume elsewhere
        self._inbox: GroupCommit[NewEvent, bool] = GroupCommit(
            write=lambda events: self._run(lambda conn: inbox_sql.inbox_insert_events(conn, events)),
            # a batch that failed on a request's own data is retried request by request;
            # one that failed because the database is away is not
            retry_alone=may_be_one_callers_fault,
            name="ingress_inbox",
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # in each uvicorn worker: its series at 0 before the first request (multiprocess files too)
        metrics.zero_series(metrics.INGRESS, routes=ROUTES_LABELLED)
        timeout = self.settings.database_timeout
        # Every route is one autocommit statement on the psycopg pool; SQLAlchemy's engine
        # is never built here (its sizes say so, were anything to use it).
        self.database = Database(
            url=self.settings.database_url,
            engine_pool_size=1,
            engine_max_overflow=0,
            engine_pool_timeout=timeout,
            # group commit keeps few statements in flight; the rest is headroom for
            # /instances and /cancel under load
            autocommit_pool_size=AUTOCOMMIT_CONNECTIONS,
            connect_timeout=max(2, round(timeout)),
            pool_timeout=timeout,
            pgbouncer=self.settings.pgbouncer,
            bounds=self.settings.database_bounds(),
        )
        _log.info(
            "ingress.started",
            pid=os.getpid(),
            max_body_bytes=self.settings.max_body_bytes,
            read_timeout=self.settings.read_timeout,
            # the key id events' data is sealed under in the inbox ("": stored plain)
            sealing_with=codecs.encrypting_key_id(),
        )
        restore_signals = on_exit_signals(self._stop_streams)
        try:
            # each broker source writes through the same group commit as the requests
            self.presence = self._presence()
            async with (
                self.presence.running(),
                running_sources(self.settings.sources, self.store, self.settings.limits, self.settings.max_body_bytes),
            ):
                yield
        finally:
            restore_signals()
            if self.readers is not None:
                await self.readers.close()
                await self.readers.waits.close()
            await self.database.dispose()

    def _stop_streams(self) -> None:
        """The process is asked to stop: end the event streams (uvicorn waits for them)."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        if self.readers is not None:
            asyncio.get_running_loop().create_task(self.readers.close())

    async def store(self, events: Sequence[NewEvent]) -> list[bool]:
        """Store one request's (or one broker message's) events: their data sealed in a
        thread first, where a large value's upload to the object store does not hold up the
        other requests, and one that fails (``ObjectStoreError``) fails this request only;
        then the shared group commit."""
        if not payloads.enabled():  # no upload: sealed here, no thread's hop per request
            return await self._inbox.store(inbox_sql.sealed(events))
        return await self._inbox.store(await asyncio.to_thread(inbox_sql.sealed, events))

    def _stream_readers(self) -> StreamReaders:
        """The event streams' readers, made at the first stream served: an ingress that
        serves none opens no LISTEN connection (and, behind a pooler with no direct URL,
        warns of none)."""
        if self.readers is None:
            assert self.database is not None
            waits = ResultWaits(self.database.listen_url, parameters=self.database.client_parameters)
            self.readers = StreamReaders(self.database, waits)
        return self.readers

    def _presence(self) -> Presence:
        """This process's entry in the fleet's registry (each uvicorn worker is one)."""
        assert self.database is not None
        settings = self.settings
        return Presence(
            self.database,
            kind="ingress",
            process_id=process_id("ingress-"),
            interval=settings.presence_interval,
            commit_stall_seconds=settings.commit_stall_seconds,
            details=lambda: {
                "listen": f"{settings.host}:{settings.port}",
                "workers": settings.workers,
                "sources": [hide_credentials(url) for url in settings.sources],
            },
        )

    # ---------------------------------------------------------------- database access

    async def _run(self, statement: Callable[[Executor], Awaitable[T]]) -> T:
        """Run one statement, in autocommit: a single statement is its own transaction
        (a batch insert is all or nothing) and costs one round trip. A pooled connection
        found dead is replaced once: every write here is idempotent, so repeating it is
        safe even if the first one committed."""
        assert self.database is not None, "the app is not started"
        async with asyncio.timeout(self.settings.database_timeout * 2):
            for attempt in (1, 2):
                async with self.database.connection() as conn:
                    try:
                        return await statement(conn)
                    except psycopg.Error:
                        if attempt == 1 and conn.driver.broken:
                            continue
                        raise
        raise AssertionError("unreachable")

    def _failed(self, exc: BaseException, **context: Any) -> JSONResponse:
        response, unexpected = responses.failure(exc)
        if unexpected:
            _log.error("ingress.internal_error", error=repr(exc), exc_info=exc, **context)
        else:
            _log.warning("ingress.database_unavailable", status=response.status_code, error=repr(exc), **context)
        return response

    def _denied(self, request: Request, *, admin: bool) -> JSONResponse | None:
        expected = required_token(
            admin=admin, ingress_token=self.settings.ingress_token, admin_token=self.settings.admin_token
        )
        if authorized(request, expected):
            return None
        return responses.error(401, "missing or wrong bearer token", "unauthorized")

    # ---------------------------------------------------------------- routes

    def _bad_instance_id(self, instance_id: str) -> JSONResponse | None:
        """A 400 for an id no instance can have: PostgreSQL text cannot hold NUL, and ids
        are capped like event ids. Answered here, so no such value ever reaches SQL."""
        if "\x00" in instance_id:
            return responses.error(400, "the instance id contains a NUL character", "invalid_request")
        if len(instance_id) > self.settings.limits.max_id_length:
            limit = self.settings.limits.max_id_length
            return responses.error(400, f"the instance id is over {limit} characters", "invalid_request")
        try:
            instance_id.encode("utf-8")
        except UnicodeEncodeError:
            return responses.error(400, "the instance id is not valid Unicode", "invalid_request")
        return None

    async def receive(self, request: Request) -> Response:
        path = request.path_params.get("path", "")
        if path.split("/", 1)[0] in _RESERVED:
            if path.split("/", 1)[0] == "cancel":
                return responses.error(400, "missing instance id: POST /cancel/{instance_id}", "invalid_request")
            return responses.error(405, f"method {request.method} not allowed on /{path}", "method_not_allowed")
        denied = self._denied(request, admin=False)
        if denied is not None:
            return denied
        try:
            # a client sending its body slower than this holds a connection for nothing
            async with asyncio.timeout(self.settings.read_timeout):
                body = await read_body(request, self.settings.max_body_bytes)
        except BodyTooLargeError:
            return responses.error(413, f"request body over {self.settings.max_body_bytes} bytes", "payload_too_large")
        except TimeoutError:
            _log.info("event.read_timeout", seconds=self.settings.read_timeout)
            return responses.error(
                408,
                f"the request body did not arrive within {self.settings.read_timeout:g} s (--ingress-read-timeout)",
                "request_timeout",
                headers={"Connection": "close"},
            )
        except ClientDisconnect:  # nobody is left to answer; nothing was stored
            _log.info("event.client_disconnected")
            return responses.error(400, "the client disconnected", "invalid_request")
        try:
            events, batch = parse_request(request.headers.raw, body, self.settings.limits)
        except InvalidEventError as invalid:
            _log.info("event.rejected", error_type=invalid.error_type, reason=str(invalid))
            return responses.error(400, str(invalid), invalid.error_type)
        spans = tracing.ingress_spans(events, request.headers)
        try:
            stored = await self.store(events)
        except ObjectStoreError as exc:  # a large event's data has nowhere to go: nothing stored
            tracing.end_spans(spans, exc)
            _log.warning("ingress.object_store_unavailable", events=len(events), error=str(exc))
            return responses.object_store_unavailable()
        except Exception as exc:
            tracing.end_spans(spans, exc)
            return self._failed(exc, events=len(events))
        tracing.end_spans(spans)
        _log.debug("event.accepted", events=len(events), duplicates=stored.count(False))
        if batch:
            return responses.accepted(
                accepted=len(events),
                duplicates=stored.count(False),
                events=[
                    {"source": e.source, "id": e.event_id, "duplicate": not s}
                    for e, s in zip(events, stored, strict=True)
                ],
            )
        (event,) = events
        return responses.accepted(source=event.source, id=event.event_id, duplicate=not stored[0])

    async def cancel(self, request: Request) -> Response:
        denied = self._denied(request, admin=True)
        if denied is not None:
            return denied
        instance_id = request.path_params["instance_id"]
        if not instance_id:
            return responses.error(400, "missing instance id: POST /cancel/{instance_id}", "invalid_request")
        bad = self._bad_instance_id(instance_id)
        if bad is not None:
            return bad
        try:
            found = await self._run(lambda conn: inbox_sql.inbox_insert_cancel(conn, instance_id))
        except Exception as exc:
            return self._failed(exc, instance_id=instance_id)
        if not found:
            return responses.error(404, f"no workflow instance {instance_id!r}", "not_found")
        _log.info("cancel.accepted", instance_id=instance_id)
        return responses.accepted(instance_id=instance_id)

    async def instance(self, request: Request) -> Response:
        denied = self._denied(request, admin=True)
        if denied is not None:
            return denied
        instance_id = request.path_params["instance_id"]
        bad = self._bad_instance_id(instance_id)
        if bad is not None:
            return bad
        try:
            row = await self._run(lambda conn: instances_sql.instance_get(conn, instance_id))
        except Exception as exc:
            return self._failed(exc, instance_id=instance_id)
        if row is None:
            return responses.error(404, f"no workflow instance {instance_id!r}", "not_found")
        body: dict[str, Any] = {
            "instance_id": row.id,
            "workflow": row.workflow_name,
            "status": row.status,
            "cancel_requested": row.cancel_requested,
            "created_at": _iso(row.created_at),
            "updated_at": _iso(row.updated_at),
            "finished_at": _iso(row.finished_at),
        }
        try:
            if row.status == "completed":
                # opened with this process's key; "encrypted" without it
                body["result"] = codecs.shown((row.result or {}).get("result"))
            message = codecs.shown(row.error.get("message")) if row.error else None
        except codecs.CodecError as exc:  # this ingress's keys (not the key's id, or other bytes): one line
            _log.error("ingress.payload_unreadable", instance_id=instance_id, error=str(exc))
            return responses.error(500, str(exc), "payload_unreadable")
        if row.error:
            body["error"] = {
                "type": row.error.get("type"),
                # a database error's text carries its statement and parameters (a lease token)
                "message": responses.without_internals(message) if isinstance(message, str) else message,
            }
        return JSONResponse(body)

    async def stream(self, request: Request) -> Response:
        """A durable stream as Server-Sent Events (``kenning_ingress.streams``)."""
        denied = self._denied(request, admin=True)
        if denied is not None:
            return denied
        instance_id = request.path_params["instance_id"]
        bad = self._bad_instance_id(instance_id)
        if bad is not None:
            return bad
        try:
            key = checked_key(request.path_params["key"])
            offset = sse_start_offset(request.query_params.get("offset"), request.headers.get("last-event-id"))
        except ValueError as error:
            return responses.error(400, str(error), "invalid_request")
        try:
            found = await self._run(lambda conn: streams_sql.stream_read(conn, instance_id, key, offset=0, limit=0))
        except Exception as exc:
            return self._failed(exc, instance_id=instance_id)
        if found is None:
            return responses.error(404, f"no workflow instance {instance_id!r}", "not_found")
        body = events(self._stream_readers(), instance_id, key, offset, self.stopping)
        return StreamingResponse(body, media_type="text/event-stream", headers=HEADERS)

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(self, request: Request) -> Response:
        return await metrics_response(self.database)

    async def readyz(self, request: Request) -> Response:
        # a primary that answers reads but finishes no commit: the read below would pass
        stalled = self.presence.commits.verdict() if self.presence is not None else None
        if stalled is not None:
            return responses.error(503, stalled, "commits_stalled", retryable=True)
        try:
            await self._run(inbox_sql.inbox_check_ready)
        except Exception as exc:
            return self._failed(exc)
        return JSONResponse({"status": "ready"})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kinds = {404: "not_found", 405: "method_not_allowed"}
    return responses.error(exc.status_code, str(exc.detail), kinds.get(exc.status_code, "invalid_request"))


async def _internal_error(request: Request, exc: Exception) -> Response:
    _log.error("ingress.internal_error", error=repr(exc), exc_info=exc)
    return responses.error(500, "internal error", "internal_error", retryable=True)


def create_app(settings: IngressSettings) -> Starlette:
    ingress = Ingress(settings)
    return Starlette(
        routes=[
            Route("/healthz", ingress.healthz, methods=["GET"]),
            Route("/readyz", ingress.readyz, methods=["GET"]),
            Route("/metrics", ingress.metrics, methods=["GET"]),
            Route("/cancel/{instance_id:path}", ingress.cancel, methods=["POST"]),
            Route("/instances/{instance_id:path}/streams/{key}", ingress.stream, methods=["GET"]),
            Route("/instances/{instance_id:path}", ingress.instance, methods=["GET"]),
            Route("/{path:path}", ingress.receive, methods=["POST"]),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
        middleware=[Middleware(request_metrics)],
        lifespan=ingress.lifespan,
    )


def app_from_environment() -> Starlette:
    """The app of each uvicorn worker, built from the settings the parent handed over
    (called by the factory ``kenning_ingress.lifeline:worker_app``)."""
    configure_logging(os.environ.get("KENNING_LOG_LEVEL", "info"), os.environ.get("KENNING_LOG_FORMAT", "auto"))
    tracing.configure("kenning-ingress")
    return create_app(settings_from_environment())
