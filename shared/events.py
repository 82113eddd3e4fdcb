"""``wait_event`` and ``ReceivedEvent``: a workflow waiting for a CloudEvent.

Unlike Edda 0.1.0, an event does not wake every instance waiting for its type: with
``match`` the workflow waits on a correlation (top-level data fields), and an event
carrying the ``kenninginstanceid`` extension goes to that one instance. Without
``match`` Edda's behaviour is kept. The ``EventReceived`` history payload format is
defined here, in one place, for the worker that delivers and the workflow that replays.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kenning import serialization
from kenning.context import WorkflowContext
from kenning.errors import EventTimeoutError
from kenning.storage import subscriptions as subscriptions_sql

EVENT_RECEIVED = "EventReceived"
EVENT_TIMEOUT = "EventTimeout"
INSTANCE_EXTENSION = "kenninginstanceid"


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
        return payload, bytes(event.data)
    payload["data"] = serialization.to_json(event.data)
    return payload, None


def event_from_history(payload: dict[str, Any], payload_bytes: bytes | None, model: Any = None) -> ReceivedEvent:
    data: Any = payload_bytes if payload_bytes is not None else payload.get("data")
    if isinstance(data, str) and payload.get("data_base64"):
        data = base64.b64decode(data)
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

    ``match`` restricts it to events whose data has these top-level fields and values.
    ``since`` also accepts a matching event that arrived before the workflow subscribed:
    seconds or a ``timedelta`` back from now, or a point in time. ``timeout_seconds``
    raises ``EventTimeoutError`` here, which the workflow may catch. ``model`` turns the
    data into that pydantic model. ``event_id`` is an explicit step id.
    """
    if timeout_seconds is not None and timeout_seconds < 0:
        raise ValueError(f"wait_event timeout must not be negative, got {timeout_seconds}")
    replayer = ctx._replayer
    step_name = f"wait_event:{event_type}"
    step_id = event_id or replayer.next_step_id(f"wait_event_{event_type}")
    record = replayer.take_recorded(step_id, step_name)
    if record is not None:
        if record.kind == EVENT_TIMEOUT:
            raise EventTimeoutError(f"no {event_type!r} event within {timeout_seconds} s (step {step_id})")
        return event_from_history(record.payload or {}, record.payload_bytes, model)
    await replayer.before_new_step(step_id, step_name, flush=False)
    since_at: datetime | None = None
    since_seconds: float | None = None
    if isinstance(since, datetime):
        since_at = since
    elif isinstance(since, timedelta):
        since_seconds = since.total_seconds()
    elif since is not None:
        since_seconds = float(since)
    await replayer.suspend(
        lambda conn: subscriptions_sql.subscription_register_and_suspend(
            conn,
            instance_id=replayer.instance_id,
            token=replayer.token,
            step_id=step_id,
            step_name=step_name,
            event_type=event_type,
            match=serialization.to_json(match) if match is not None else None,
            since_at=since_at,
            since_seconds=since_seconds,
            timeout_seconds=timeout_seconds,
        )
    )
