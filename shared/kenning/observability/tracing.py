"""OpenTelemetry tracing (``pip install 'kenning[otel]'``): every hook the engine, the ingress,
the worker's inbox and the relayer call, in one place.

Off unless configured the OpenTelemetry way: an SDK ``TracerProvider`` the process set up
itself (``opentelemetry-instrument``, a test's in-memory exporter), or the SDK's variables
(``OTEL_TRACES_EXPORTER`` other than ``none``, ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); ``OTEL_SDK_DISABLED=true`` wins over both. The
decision is taken once per process, at the first hook; off, each hook returns at once and
no span object is made (the import of ``opentelemetry`` is tried once, then never again).

The trace context travels as data, whether or not this process traces: a CloudEvent's
``traceparent``/``tracestate`` extension attributes (the CloudEvents distributed-tracing
extension), the instance's ``trace_context`` column (written by the start and by the
delivery that wakes it, read back by each claim, so a run after a worker crash continues
the same trace), and the ``traceparent`` an activity's outbox event carries to the broker.
A carrier is a dict of those two W3C Trace Context fields.

Waits are not spans: a wait lasts from seconds to months and outlives the worker that
suspended, so an open span would never be exported if the worker died, and a months-long
bar would squash every activity in Jaeger's timeline. The run that suspends ends with a
``kenning.suspended`` event naming the wait; the run that resumes starts with a
``kenning.resumed`` event. An event that wakes an instance moves it into the event's trace
(the resumed run is a child of the delivery, so ingress -> workflow -> outbox -> broker
reads as one trace), and every later run links back to the trace the instance started in
(the carrier's ``origin``), so both sides of a wait are one click apart.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

Carrier = dict[str, str]
TRACE_FIELDS = ("traceparent", "tracestate")
_log = structlog.get_logger("kenning.tracing")

# the instance's carrier during its run, for what the run writes (outbox events) when no
# span of this process is current
_run_carrier: contextvars.ContextVar[Carrier | None] = contextvars.ContextVar("kenning_run_carrier", default=None)


class NewEventLike(Protocol):
    """A received event (``kenning.storage.inbox.NewEvent``), as the ingress spans read it."""

    @property
    def event_type(self) -> str: ...
    @property
    def event_id(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def attributes(self) -> dict[str, Any]: ...


_UNSET: Any = object()
_tracer: Tracer | None = _UNSET
_service = "kenning"


def configure(service: str) -> bool:
    """Decide, at a process's start, whether it traces (``service``: its ``service.name``
    unless ``OTEL_SERVICE_NAME`` names one); later hooks keep that decision."""
    global _service, _tracer
    _service = service
    _tracer = _configured()
    return _tracer is not None


def tracer() -> Tracer | None:
    """The tracer if this process traces, else None (decided at the first call)."""
    global _tracer
    if _tracer is _UNSET:
        _tracer = _configured()
    return _tracer


def _wants_sdk() -> bool:
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _configured() -> Tracer | None:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    try:
        from opentelemetry import trace
    except ImportError:  # the otel extra is not installed: Kenning runs as without it
        return None
    provider = trace.get_tracer_provider()
    if not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return provider.get_tracer("kenning")  # one the process set itself: the SDK's or another
    if not _wants_sdk():
        return None  # and the SDK is not imported: 50 ms of every process start
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:  # the API alone
        _log.warning("tracing.sdk_missing", hint="pip install 'kenning[otel]'")
        return None
    sdk_provider = _sdk_provider()
    if sdk_provider is None:
        return None
    trace.set_tracer_provider(sdk_provider)
    return sdk_provider.get_tracer("kenning")


def _sdk_provider() -> TracerProvider | None:
    """A TracerProvider built from the SDK's variables: ``OTEL_TRACES_EXPORTER`` (a comma
    list of the exporters' entry-point names, ``otlp`` by default: the OTLP/HTTP exporter
    the extra installs), the sampler (``OTEL_TRACES_SAMPLER``), the batch processor's
    ``OTEL_BSP_*`` and the resource's ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES``
    (all read by the SDK itself)."""
    from importlib.metadata import entry_points

    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: _service}
    provider = TracerProvider(resource=Resource.create(attributes))
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",") if n.strip()]
    found = {e.name: e for e in entry_points(group="opentelemetry_traces_exporter")}
    added = 0
    for name in names:
        if name == "none":
            continue
        point = found.get(name) or (found.get("otlp_proto_http") if name == "otlp" else None)
        if point is None:
            _log.warning("tracing.unknown_exporter", exporter=name, known=sorted(found))
            continue
        provider.add_span_processor(BatchSpanProcessor(point.load()()))
        added += 1
    if not added:
        return None
    _log.info("tracing.configured", service=os.environ.get("OTEL_SERVICE_NAME", _service), exporters=names)
    return provider


# ------------------------------------------------------------------ carriers


def carrier_of(attributes: Mapping[str, Any]) -> Carrier | None:
    """The trace context a CloudEvent carries (its distributed-tracing extension)."""
    parent = attributes.get("traceparent")
    if not isinstance(parent, str):
        return None
    state = attributes.get("tracestate")
    return {"traceparent": parent, "tracestate": state} if isinstance(state, str) and state else {"traceparent": parent}


def carrier_of_span(span: Span | None) -> Carrier | None:
    if span is None:
        return None
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: Carrier = {}
    TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
    return carrier or None


def current_carrier() -> Carrier | None:
    """The context to store with what is written now: the current span's if this process
    traces and one is current, else the context of the instance being run."""
    if tracer() is not None:
        from opentelemetry import trace

        span = trace.get_current_span()
        if span.get_span_context().is_valid:
            return carrier_of_span(span)
    return _run_carrier.get()


def with_trace(extensions: dict[str, Any]) -> dict[str, Any]:
    """An outbox event's extensions with the writer's ``traceparent`` (one the caller set wins)."""
    if "traceparent" in extensions:
        return extensions
    carrier = current_carrier()
    return extensions if carrier is None else {**extensions, **carrier}


def _origin(carrier: Mapping[str, Any] | None) -> Carrier | None:
    origin = carrier.get("origin") if carrier else None
    return {"traceparent": origin} if isinstance(origin, str) else None


def _parent(carrier: Mapping[str, str] | None) -> Any:
    if not carrier:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(dict(carrier))


def _link(carrier: Mapping[str, str] | None) -> list[Any]:
    if not carrier:
        return []
    from opentelemetry import trace

    context = trace.get_current_span(_parent(carrier)).get_span_context()
    return [trace.Link(context)] if context.is_valid else []


# ------------------------------------------------------------------ spans


def start_span(
    name: str,
    *,
    parent: Mapping[str, str] | None = None,
    kind: str = "INTERNAL",
    attributes: Mapping[str, Any] | None = None,
    link: Mapping[str, str] | None = None,
) -> Span | None:
    """A started span (None if this process does not trace). ``parent``: a carrier to
    continue (else the current span's context); ``link``: a carrier to link to."""
    found = tracer()
    if found is None:
        return None
    from opentelemetry.trace import SpanKind

    return found.start_span(
        name,
        context=_parent(parent),
        kind=SpanKind[kind],
        attributes={k: v for k, v in (attributes or {}).items() if v is not None},
        links=_link(link),
    )


def end_span(span: Span | None, error: BaseException | None = None, *, outcome: str | None = None) -> None:
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    if outcome is not None:
        span.set_attribute("kenning.outcome", outcome)
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    span.end()


def activate(span: Span | None) -> object | None:
    """Make ``span`` current in this task (``deactivate`` with the token)."""
    if span is None:
        return None
    from opentelemetry import context, trace

    return context.attach(trace.set_span_in_context(span))


def deactivate(token: object | None) -> None:
    if token is not None:
        from opentelemetry import context

        context.detach(token)  # type: ignore[arg-type]


def add_event(span: Span | None, name: str, **attributes: Any) -> None:
    if span is not None:
        span.add_event(name, {k: v for k, v in attributes.items() if v is not None})


# ------------------------------------------------------------------ the worker's run


_RUN_ERRORS = frozenset({"failed", "crashed", "storage_unavailable", "lease_lost"})


class RunTrace:
    """A workflow run's span and carrier: continues the instance's stored context (from
    the claim, so a run after a crash joins the same trace), and is the context of what
    the run writes."""

    __slots__ = ("_carrier_token", "_token", "span")

    def __init__(self, instance_id: str, workflow: str, run_count: int, carrier: Mapping[str, str] | None) -> None:
        self._carrier_token = _run_carrier.set(carrier_of(carrier) if carrier else None)
        self.span: Span | None = None
        self._token: object | None = None
        if tracer() is None:
            return
        self.span = start_span(
            f"kenning.run {workflow}",
            parent=carrier,
            kind="CONSUMER",
            attributes={"kenning.instance_id": instance_id, "kenning.workflow": workflow, "kenning.run": run_count},
            link=_origin(carrier),
        )
        self._token = activate(self.span)
        if run_count > 1:
            add_event(self.span, "kenning.resumed")

    def close(self, outcome: str) -> None:
        deactivate(self._token)
        if self.span is not None and outcome in _RUN_ERRORS:
            from opentelemetry.trace import Status, StatusCode

            self.span.set_status(Status(StatusCode.ERROR, outcome))
        end_span(self.span, outcome=outcome)
        _run_carrier.reset(self._carrier_token)


def suspended(step_id: str, step_name: str, **detail: Any) -> None:
    """The run's span ends waiting: say what for (see the module's note on waits)."""
    if tracer() is None:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.add_event("kenning.suspended", {"kenning.step": step_id, "kenning.wait": step_name, **detail})


def start_attempt(step_id: str, name: str, attempt: int, *, activity: bool) -> tuple[Span, object] | None:
    """An activity (or compensation) attempt's span, current while it runs, so an event it
    writes to the outbox carries it."""
    if tracer() is None:
        return None
    span = start_span(
        f"kenning.{'activity' if activity else 'compensation'} {name}",
        attributes={"kenning.step": step_id, "kenning.attempt": attempt},
    )
    return (span, activate(span)) if span is not None else None


def end_attempt(started: tuple[Span, object] | None, error: BaseException | None = None) -> None:
    if started is not None:
        span, token = started
        deactivate(token)
        end_span(span, error, outcome="failed" if error is not None else "completed")


# ------------------------------------------------------------------ ingress, delivery, relayer


def ingress_spans(events: Sequence[NewEventLike], headers: Mapping[str, str]) -> list[Span]:
    """One span per received event, continuing the event's own ``traceparent`` (else the
    HTTP request's W3C ``traceparent`` header, else a new trace). An event that came
    without one gets the span's: the ingress is the first hop that traces it, and the
    stored attributes are what the worker continues. Empty if this process does not trace."""
    if tracer() is None:
        return []
    request = carrier_of(headers)
    spans = []
    for event in events:
        own = carrier_of(event.attributes)
        span = start_span(
            f"kenning.ingress {event.event_type}",
            parent=own or request,
            kind="SERVER",
            attributes={"cloudevents.event_id": event.event_id, "cloudevents.event_source": event.source},
        )
        if span is not None:
            spans.append(span)
            if own is None:
                event.attributes.update(carrier_of_span(span) or {})
    return spans


def end_spans(spans: Sequence[Span], error: BaseException | None = None) -> None:
    for span in spans:
        end_span(span, error)


class delivering:  # noqa: N801  (used as a statement: ``[async] with tracing.delivering(...)``)
    """An inbox row's delivery: its span (continuing the event's ``traceparent``) is current
    while it is delivered, so the instances it starts or wakes store the span's context, or
    the event's own when this process does not trace."""

    __slots__ = ("_carrier_token", "_span", "_token")

    def __init__(self, event_type: str, event_id: str, attributes: Mapping[str, Any]) -> None:
        carrier = carrier_of(attributes)
        self._span: Span | None = None
        if tracer() is not None:
            self._span = start_span(
                f"kenning.deliver {event_type}",
                parent=carrier,
                kind="CONSUMER",
                attributes={"cloudevents.event_id": event_id, "cloudevents.event_type": event_type},
            )
        self._carrier_token = _run_carrier.set(carrier)
        self._token = activate(self._span)

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        deactivate(self._token)
        end_span(self._span, error)
        _run_carrier.reset(self._carrier_token)

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        self.__exit__(kind, error, traceback)


def relay_span(event_type: str, event_id: str, extensions: Mapping[str, Any]) -> Span | None:
    """A relayed event's span, in the trace of the activity that wrote it (the event keeps
    that ``traceparent``: the CloudEvents extension names the event's creation)."""
    if tracer() is None:
        return None
    return start_span(
        f"kenning.relay {event_type}",
        parent=carrier_of(extensions),
        kind="PRODUCER",
        attributes={"cloudevents.event_id": event_id, "cloudevents.event_type": event_type},
    )
