"""OpenTelemetry tracing (issue 16, item 2): kenning.observability.tracing's spans and the trace context
that travels inside CloudEvents (``traceparent``).

In process, with the SDK's in-memory exporter: a Client start inside the caller's span, the
run, activity and delivery spans, the context an outbox event carries, and a wait that an
event from another trace ends. Across real processes (ingress, workers, relayer, a receiver
as the broker, an OTLP/HTTP collector in the test): the ``traceparent`` the ingress received
comes out on the relayed CloudEvent with the same trace id, also after the worker running the
workflow is killed mid-activity and another resumes it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import psycopg
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kenning import Client
from kenning.db import Database
from kenning.observability import tracing
from kenning.storage import inbox as inbox_sql
from kenning.storage.inbox import NewEvent
from tests.apps import tracing as traced
from tests.ingress_support import binary, cloud_event, start_ingress, structured
from tests.relayer_support import relayer_process, start_receiver
from tests.support import ProcessPool, eventually, executions, running_worker

Sql = psycopg.Connection[tuple[object, ...]]
APP = "tests.apps.tracing:app"


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


def trace_of(parent: str) -> str:
    return parent.split("-")[1]


def ids_of(parent: str) -> tuple[str, str]:
    """Trace and span id (the flags vary: the SDK sets W3C's random bit too)."""
    _, trace_id, span_id, _ = parent.split("-")
    return trace_id, span_id


def new_trace() -> tuple[str, str]:
    return uuid.uuid4().hex, uuid.uuid4().hex[:16]


# ------------------------------------------------------------------ in process


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """Tracing on in this process only for the test: a provider of its own (never the global
    one, which other tests would then trace with)."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("kenning"))
    return spans


def named(spans: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name.startswith(prefix)]


def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


def hex_span(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.span_id:016x}"


def outbox_traceparents(sql: Sql) -> dict[str, str]:
    rows = sql.execute("SELECT data ->> 'stage', extensions ->> 'traceparent' FROM kenning_outbox").fetchall()
    return {str(stage): str(parent) for stage, parent in rows}


async def test_a_client_start_runs_in_the_callers_trace(
    database: Database, sql: Sql, side_channel: str, exporter: InMemorySpanExporter
) -> None:
    caller = tracing.tracer()
    assert caller is not None
    async with Client(database=database) as client, running_worker(database, traced.app):
        with caller.start_as_current_span("caller") as span:
            started = await client.start(traced.traced_order, order_id="a")
        assert await client.result(started.instance_id, timeout=30) == "a"
    trace_id = f"{span.get_span_context().trace_id:032x}"
    (run,) = named(exporter, "kenning.run trace.order")
    assert hex_trace(run) == trace_id
    assert run.parent is not None and run.parent.span_id == span.get_span_context().span_id
    assert run.attributes is not None and run.attributes["kenning.outcome"] == "completed"
    activities = {s.name: s for s in named(exporter, "kenning.activity ")}
    assert set(activities) == {
        "kenning.activity hold",
        "kenning.activity announce",
    }
    for activity_span in activities.values():
        assert activity_span.parent is not None and activity_span.parent.span_id == run.context.span_id
    # the outbox event carries the context of the activity attempt that wrote it
    announce = activities["kenning.activity announce"]
    (parent,) = outbox_traceparents(sql).values()
    assert ids_of(parent) == (trace_id, hex_span(announce))


async def test_an_event_that_ends_a_wait_carries_the_rest_into_its_trace(
    database: Database, sql: Sql, side_channel: str, exporter: InMemorySpanExporter
) -> None:
    caller = tracing.tracer()
    assert caller is not None
    async with Client(database=database) as client, running_worker(database, traced.app):
        with caller.start_as_current_span("caller"):
            started = await client.start(traced.traced_order, order_id="w", wait=True)
        (first_run,) = await eventually(lambda: named(exporter, "kenning.run trace.order"), message="first run")
        origin = hex_trace(first_run)
        # waits are events on the runs, not spans (kenning.observability.tracing's module note)
        assert [e.name for e in first_run.events] == ["kenning.suspended"]
        paid_trace, paid_span = new_trace()
        async with database.connection() as conn:
            await inbox_sql.inbox_insert_events(
                conn,
                [
                    NewEvent(
                        source="tests",
                        event_id="paid-w",
                        event_type=traced.PAID,
                        attributes={"traceparent": traceparent(paid_trace, paid_span), "tracestate": "k=v"},
                        data={"order_id": "w"},
                    )
                ],
            )
        assert await client.result(started.instance_id, timeout=30) == "w"
    # more than one inbox pass may handle the event (CI saw two delivery spans once): every
    # pass is in the event's trace, and the resumed run is a child of one of them
    deliveries = named(exporter, f"kenning.deliver {traced.PAID}")
    assert deliveries, "no delivery span"
    for delivery in deliveries:
        assert hex_trace(delivery) == paid_trace
        assert delivery.parent is not None and f"{delivery.parent.span_id:016x}" == paid_span
    resumed = [s for s in named(exporter, "kenning.run trace.order") if s is not first_run]
    (last,) = [s for s in resumed if s.attributes and s.attributes["kenning.outcome"] == "completed"]
    assert hex_trace(last) == paid_trace
    assert last.parent is not None
    assert last.parent.span_id in {d.context.span_id for d in deliveries if d.context is not None}
    # every run after the wake links back to the trace the instance started in
    assert [f"{link.context.trace_id:032x}" for link in last.links] == [origin]
    parents = outbox_traceparents(sql)
    assert trace_of(parents["placed"]) == origin
    assert trace_of(parents["paid"]) == paid_trace


async def test_tracing_off_creates_no_spans_and_passes_the_context_on(
    database: Database, sql: Sql, side_channel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off (the default without OTEL_* variables), no span is made, and the context an
    event brought still reaches the events its workflow publishes."""
    monkeypatch.setattr(tracing, "_tracer", None)
    monkeypatch.setattr(tracing, "start_span", _no_span)
    trace_id, span_id = new_trace()
    async with running_worker(database, traced.app):
        async with database.connection() as conn:
            event = NewEvent(
                source="tests",
                event_id="off",
                event_type="trace.order",
                attributes={"traceparent": traceparent(trace_id, span_id)},
                data={"order_id": "off"},
            )
            await inbox_sql.inbox_insert_events(conn, [event])
        parents = await eventually(lambda: outbox_traceparents(sql), message="announcement")
    assert parents == {"placed": traceparent(trace_id, span_id)}


def _no_span(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a span was started with tracing off")


# ------------------------------------------------------------------ real processes


class Collector:
    """An OTLP/HTTP endpoint: the spans every process exports, decoded."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    service = next(
                        (a.value.string_value for a in resource.resource.attributes if a.key == "service.name"), ""
                    )
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            collector.spans.append(
                                {
                                    "service": service,
                                    "name": span.name,
                                    "trace_id": span.trace_id.hex(),
                                    "span_id": span.span_id.hex(),
                                    "parent": span.parent_span_id.hex(),
                                }
                            )
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def env(self) -> dict[str, str]:
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }

    def in_trace(self, trace_id: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["trace_id"] == trace_id]


@pytest.fixture
def collector() -> Iterator[Collector]:
    # requested before ``processes``: torn down after them, so their last export lands
    found = Collector()
    yield found
    found.server.shutdown()
    found.server.server_close()


async def test_one_trace_from_ingress_to_broker_across_a_worker_crash(
    collector: Collector, processes: ProcessPool, database_url: str, side_channel: str, sql: Sql
) -> None:
    env = {**collector.env(), "KENNING_TEST_SIDE_CHANNEL": side_channel}
    receiver = await start_receiver(processes)
    ingress = start_ingress(processes, database_url, env=env)
    relayer_process(processes, database_url, receiver.url, env=env)
    doomed = processes.worker(database_url, APP, "--lease-seconds", "2", env=env)

    # a workflow whose worker dies mid-activity (binary mode in)
    crash_trace, crash_span = new_trace()
    headers, body = binary(
        cloud_event("trace.order", {"order_id": "c", "crash": True}, traceparent=traceparent(crash_trace, crash_span))
    )
    assert httpx.post(ingress.url + "/", headers=headers, content=body).status_code == 202
    await eventually(lambda: executions(side_channel)["hold c"] == 1, timeout=30, message="first attempt")
    doomed.kill()
    doomed.wait(timeout=10)
    processes.worker(database_url, APP, "--lease-seconds", "2", env=env)

    # and one that waits for an event from another trace (structured mode in)
    wait_trace, wait_span = new_trace()
    headers, body = structured(
        cloud_event("trace.order", {"order_id": "p", "wait": True}, traceparent=traceparent(wait_trace, wait_span))
    )
    assert httpx.post(ingress.url + "/", headers=headers, content=body).status_code == 202
    paid_trace, paid_span = new_trace()

    def announced(order_id: str, stage: str) -> dict[str, Any]:
        """The attributes of that relayed event ({} until it arrives)."""
        for event in receiver.events():
            data = event.get("data") or {}
            if data.get("order_id") == order_id and data.get("stage") == stage:
                return dict(event["attributes"])
        return {}

    await eventually(lambda: announced("p", "placed"), timeout=30, message="p placed")
    headers, body = binary(cloud_event(traced.PAID, {"order_id": "p"}, traceparent=traceparent(paid_trace, paid_span)))
    assert httpx.post(ingress.url + "/", headers=headers, content=body).status_code == 202

    crashed = await eventually(lambda: announced("c", "placed"), timeout=60, message="c after a crash")
    placed = await eventually(lambda: announced("p", "placed"), timeout=30)
    paid = await eventually(lambda: announced("p", "paid"), timeout=30, message="p paid")
    assert trace_of(crashed["traceparent"]) == crash_trace
    assert trace_of(placed["traceparent"]) == wait_trace
    assert trace_of(paid["traceparent"]) == paid_trace
    assert executions(side_channel)["hold c"] == 2

    # every process exported its spans into those traces
    def names(trace_id: str, wanted: set[tuple[str, str]]) -> bool:
        return wanted <= {(s["service"], s["name"].split(" ")[0]) for s in collector.in_trace(trace_id)}

    everyone = {
        ("kenning-ingress", "kenning.ingress"),
        ("kenning-worker", "kenning.deliver"),
        ("kenning-worker", "kenning.run"),
        ("kenning-worker", "kenning.activity"),
        ("kenning-relayer", "kenning.relay"),
    }
    # the delivery's span may have died unexported with the killed worker; the run after the
    # crash is a child of it all the same (the context came back from the instance's row)
    survivors = everyone - {("kenning-worker", "kenning.deliver")}
    await eventually(lambda: names(crash_trace, survivors), timeout=20, message=f"spans: {collector.spans}")
    await eventually(lambda: names(paid_trace, everyone), timeout=20, message=f"spans: {collector.spans}")
    ingress_span = next(s for s in collector.in_trace(crash_trace) if s["name"].startswith("kenning.ingress"))
    assert ingress_span["parent"] == crash_span
    row = sql.execute("SELECT trace_context FROM kenning_instances WHERE input ->> 'order_id' = 'p'").fetchone()
    assert row is not None and isinstance(row[0], dict)
    assert trace_of(row[0]["traceparent"]) == paid_trace and trace_of(row[0]["origin"]) == wait_trace
