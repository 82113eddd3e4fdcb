"""``wait_event`` and ``ReceivedEvent``: a workflow waiting for a CloudEvent.

Unlike Edda 0.1.0, an event does not wake every instance waiting for its type: with
``match`` the workflow waits on a correlation (top-level data fields), and an event
carrying the ``kenninginstanceid`` extension goes to that one instance. Without
``match`` Edda's behaviour is kept. The ``EventReceived`` history payload format is
defined here, in one place, for the worker that delivers and the workflow that replays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kenning import codecs, serialization
from kenning.context import WorkflowContext
from kenning.core.names import EVENT_RECEIVED, EVENT_TIMEOUT
from kenning.core.records import StoredEvent
from kenning.errors import EventTimeoutError

INSTANCE_EXTENSION = "kenninginstanceid"
# Event types and sources Kenning writes itself (a child's end to its parent: type
# kenning.child.finished, source kenning.children, id the child's). The ingress, its broker
# sources and the console refuse both: a type, so no sender fakes a child's end; a source,
# so no sender takes the (source, id) of a child's end first and has the real one dropped
# as its duplicate (the inbox keeps one row per source and id).
RESERVED_PREFIX = "kenning."


def reserved_attribute_error(event_type: str, source: str) -> str | None:
    """Why an event of ``event_type`` from ``source`` may not come from outside, or None
    if it may."""
    if event_type.startswith(RESERVED_PREFIX):
        return f"event type {event_type!r} is reserved: types starting with {RESERVED_PREFIX!r} are Kenning's own"
    if source.startswith(RESERVED_PREFIX):
        return f"event source {source!r} is reserved: sources starting with {RESERVED_PREFIX!r} are Kenning's own"
    return None


# CloudEvents 1.0 context attributes; every other attribute is an extension.
STANDARD_ATTRIBUTES = frozenset(
    {"id", "source", "type", "specversion", "datacontenttype", "dataschema", "subject", "time"}
)


@dataclass(frozen=True)
class ReceivedEvent:
    """The CloudEvent a ``wait_event`` returned (Edda's fields)."""

    data: Any
    type: str
    source: str
    id: str
    time: str | None = None
    datacontenttype: str | None = None
    subject: str | None = None
    extensions: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        """``event["type"]``, ``event["data"]``, ``event["myextension"]``: the SDK's
        ``CloudEvent`` access that Edda's ``on_event`` handlers use."""
        if name in ("type", "source", "id", "time", "datacontenttype", "subject", "data"):
            return getattr(self, name)
        if name == "specversion":
            return "1.0"
        return self.extensions[name]

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default


def event_from_inbox(stored: StoredEvent) -> ReceivedEvent:
    """The ``ReceivedEvent`` of an inbox row, as handlers and waiting workflows see it: data
    the writer sealed is opened here (``kenning.codecs.EncryptionKeyError`` without the key,
    the row left as it is)."""
    attributes = stored.attributes
    if stored.data_bytes is None:
        data = codecs.unseal(stored.data)
    else:  # binary data: sealed in ``data`` beside an empty ``data_bytes``, or as it came
        data = codecs.unseal_bytes(stored.data) if stored.data is not None else stored.data_bytes
    return ReceivedEvent(
        data=data,
        type=stored.event_type,
        source=stored.source,
        id=stored.event_id,
        time=attributes.get("time"),
        datacontenttype=attributes.get("datacontenttype"),
        subject=attributes.get("subject"),
        extensions={k: v for k, v in attributes.items() if k not in STANDARD_ATTRIBUTES},
    )


def opaque_to_sql(data: Any) -> bool:
    """Whether SQL containment could not test inbox data (``kenning.storage.subscriptions.
    SEALED_DATA``, the same test): sealed (an envelope's key) or offloaded (a reference's),
    the key's value not null, as ``data ->> key IS NOT NULL`` reads it."""
    return isinstance(data, dict) and (data.get(codecs.ENVELOPE_KEY) is not None or data.get("$ref") is not None)


def data_contains(data: Any, match: Any) -> bool:
    """PostgreSQL's ``data @> match`` for jsonb, in Python: a ``wait_event(match=...)`` tested
    on inbox data that is sealed, which SQL cannot look into. Objects contain every key of
    ``match`` with a value containing its value; arrays contain each element of ``match``'s
    somewhere (a scalar among their scalars); scalars are equal, and of the same JSON type
    (``true`` is not ``1``, ``1`` is ``1.0``); at the top, an array holds a scalar it has."""
    if isinstance(match, dict):
        if not isinstance(data, dict):
            return False
        for key, wanted in match.items():
            if key not in data:
                return False
            value = data[key]
            if _json_kind(value) != _json_kind(wanted):  # an object's values: same type, no array exception
                return False
            if not data_contains(value, wanted):
                return False
        return True
    if isinstance(match, list):
        if not isinstance(data, list):  # a scalar never contains an array
            return False
        for wanted in match:
            kind = _json_kind(wanted)
            if not any(_json_kind(item) == kind and data_contains(item, wanted) for item in data):
                return False
        return True
    if isinstance(data, list):  # at the top only (below, the kinds already agree): "a" in ["a"]
        return any(_json_kind(item) == "scalar" and _scalar_equal(item, match) for item in data)
    return _json_kind(data) == "scalar" and _scalar_equal(data, match)


def _json_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "scalar"


def _scalar_equal(left: Any, right: Any) -> bool:
    # bool is an int in Python, not in JSON: true is neither 1 nor "true"
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    return type(left) is type(right) and bool(left == right)


def event_history_payload(event: ReceivedEvent) -> tuple[dict[str, Any], bytes | None]:
    """The ``EventReceived`` row for ``event``: JSON attributes, data as JSON or as bytes."""
    payload: dict[str, Any] = {
        "type": event.type,
        "source": event.source,
        "id": event.id,
        "time": event.time,
        "datacontenttype": event.datacontenttype,
        "subject": event.subject,
        "extensions": serialization.to_json(event.extensions),
    }
    if isinstance(event.data, bytes | bytearray | memoryview):
        sealed = codecs.seal_bytes(bytes(event.data))
        if sealed is None:
            return payload, bytes(event.data)
        payload["data"] = sealed  # beside an empty payload_bytes: the sign of sealed bytes
        return payload, b""
    payload["data"] = codecs.seal(serialization.to_json(event.data))  # type, source and id stay plain
    return payload, None


def event_from_history(payload: dict[str, Any], payload_bytes: bytes | None, model: Any = None) -> ReceivedEvent:
    if payload_bytes is None:
        data: Any = codecs.unseal(payload.get("data"))
    elif payload.get("data") is not None:  # sealed bytes (opened to their base64 text or not)
        data = codecs.unseal_bytes(payload["data"])
    else:
        data = payload_bytes
    if model is not None and not isinstance(data, bytes):
        data = serialization.from_json(data, model)
    return ReceivedEvent(
        data=data,
        type=payload["type"],
        source=payload["source"],
        id=payload["id"],
        time=payload.get("time"),
        datacontenttype=payload.get("datacontenttype"),
        subject=payload.get("subject"),
        extensions=dict(payload.get("extensions") or {}),
    )


async def wait_event(
    ctx: WorkflowContext,
    event_type: str,
    timeout_seconds: float | None = None,
    model: Any = None,
    event_id: str | None = None,
    *,
    match: dict[str, Any] | None = None,
    since: float | timedelta | datetime | None = None,
) -> ReceivedEvent:
    """Wait, durably and without holding a worker, for a CloudEvent of ``event_type``.

    ``match`` restricts it to events whose data has these top-level fields and values
    (JSON containment); without it any event of the type is taken (Edda's broadcast). An
    event with the ``kenninginstanceid`` extension is only taken by that instance.

    By default only events received after the workflow subscribed are taken. ``since``
    also takes one received earlier, back to that point: seconds or a ``timedelta`` back
    from now, or a point in time (the oldest such event this instance has not taken yet,
    while the inbox keeps it). ``timeout_seconds`` raises ``EventTimeoutError`` here,
    which the workflow may catch. ``model`` turns the data into that pydantic model.
    ``event_id`` is an explicit step id.
    """
    if timeout_seconds is not None and timeout_seconds < 0:
        raise ValueError(f"wait_event timeout must not be negative, got {timeout_seconds}")
    since_at: datetime | None = None
    since_seconds: float | None = None
    if isinstance(since, datetime):
        since_at = since
    elif isinstance(since, timedelta):
        since_seconds = since.total_seconds()
    elif since is not None:
        since_seconds = float(since)
    record = await ctx.runtime.wait_event(
        event_type,
        event_id=event_id,
        match=match,  # turned into JSON once the step is known to be new (replay never does)
        since_at=since_at,
        since_seconds=since_seconds,
        timeout_seconds=timeout_seconds,
    )
    if record.kind == EVENT_TIMEOUT:
        raise EventTimeoutError(f"no {event_type!r} event within {timeout_seconds} s (step {record.step_id})")
    return event_from_history(record.payload or {}, record.payload_bytes, model)


__all__ = ["EVENT_RECEIVED", "EVENT_TIMEOUT", "ReceivedEvent", "wait_event"]
