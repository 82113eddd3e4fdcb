"""``send_event_transactional``: a CloudEvent that exists if and only if the activity commits.

Called inside an activity (or a compensation), it inserts an outbox row through the
activity's own transaction, the one that records its result and holds its
``ctx.session`` writes. If the activity raises, the row is rolled back with everything
else; if it commits, ``kenning relayer`` publishes the row to the broker, at least once,
always with the same CloudEvents ``id``.

Unlike Edda 0.1.0, which logged a warning and wrote anyway, a call from workflow code
(outside an activity) raises: a write there would happen again on every replay.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from kenning import codecs, serialization
from kenning.context import WorkflowContext, current_step
from kenning.core.records import OutboxEvent
from kenning.observability import tracing

JSON_CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/octet-stream"
# The cloudevents SDK's own test for a JSON media type (application/json, text/json, +json).
_JSON_MEDIA_TYPE = re.compile(r"^(application|text)/([a-zA-Z0-9\-\.]+\+)?json(;.*)?$")
_EXTENSION_NAME = re.compile(r"^[a-z0-9]+$")
_RESERVED_ATTRIBUTES = frozenset(
    {"id", "source", "specversion", "type", "datacontenttype", "dataschema", "subject", "time", "data", "data_base64"}
)
_INT32 = (-(2**31), 2**31 - 1)

ExtensionValue = str | int | bool


def is_json_content_type(content_type: str | None) -> bool:
    return content_type is None or bool(_JSON_MEDIA_TYPE.match(content_type))


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _check_text(name: str, value: str | None, *, required: bool = False) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or not value:
        raise ValueError(f"send_event_transactional: {name} must be a non-empty string, got {value!r}")
    if "\x00" in value:
        raise ValueError(f"send_event_transactional: {name} contains a NUL character, which PostgreSQL cannot store")


def _check_extensions(extensions: Mapping[str, ExtensionValue] | None) -> dict[str, ExtensionValue]:
    checked: dict[str, ExtensionValue] = {}
    for name, value in (extensions or {}).items():
        if not isinstance(name, str) or not _EXTENSION_NAME.match(name):
            raise ValueError(
                f"send_event_transactional: extension name {name!r} is invalid: CloudEvents extension "
                "names are lower-case letters a-z and digits only"
            )
        if name in _RESERVED_ATTRIBUTES:
            raise ValueError(f"send_event_transactional: {name!r} is a CloudEvents attribute, not an extension")
        if isinstance(value, bool):
            pass
        elif isinstance(value, int):
            if not _INT32[0] <= value <= _INT32[1]:
                raise ValueError(
                    f"send_event_transactional: extension {name!r} is outside the CloudEvents integer range"
                )
        elif isinstance(value, str):
            _check_text(f"extension {name!r}", value)
        else:
            raise TypeError(
                f"send_event_transactional: extension {name!r} must be str, int or bool, got {type(value).__name__}"
            )
        checked[name] = value
    return checked


def _encode_data(event_data: Any, content_type: str | None) -> tuple[str | None, bytes | None, str | None]:
    """(JSON text, bytes, content type) for the outbox row."""
    if event_data is None:
        return None, None, content_type
    if isinstance(event_data, bytes | bytearray | memoryview):
        raw = bytes(event_data)
        sealed = codecs.seal_bytes(raw)  # in ``data`` beside an empty ``data_bytes`` (the sign), or as it came
        if sealed is None:
            return None, raw, content_type or BINARY_CONTENT_TYPE
        return json.dumps(sealed), b"", content_type or BINARY_CONTENT_TYPE
    value = serialization.to_json(event_data)  # pydantic models, dataclasses, datetimes...
    if not is_json_content_type(content_type) and not isinstance(value, str):
        raise TypeError(
            f"send_event_transactional: data for content type {content_type!r} must be str or bytes, "
            f"got {type(event_data).__name__}; only JSON content types take structured data"
        )
    if _has_nul(value):
        raise ValueError(
            "send_event_transactional: event data contains a NUL character, which PostgreSQL jsonb cannot "
            "store; send it as bytes instead"
        )
    return json.dumps(codecs.seal(value)), None, content_type or JSON_CONTENT_TYPE


async def send_event_transactional(
    ctx: WorkflowContext,
    event_type: str,
    event_source: str,
    event_data: Any,
    content_type: str | None = None,
    *,
    subject: str | None = None,
    extensions: Mapping[str, ExtensionValue] | None = None,
) -> str:
    """Record a CloudEvent in the current activity's transaction; returns its ``id``.

    ``event_data`` is JSON-compatible data (dicts, lists, pydantic models, dataclasses...),
    ``bytes``, or None for no data. ``content_type`` defaults to ``application/json``, or
    ``application/octet-stream`` for bytes; a non-JSON content type takes ``str`` or
    ``bytes``. ``subject`` and ``extensions`` (lower-case alphanumeric names; str, int or
    bool values) become CloudEvents attributes. The event is published by ``kenning
    relayer`` after the activity commits, at least once, always with the returned id.

    Raises ``RuntimeError`` outside an activity or compensation.
    """
    step = current_step.get()
    if step is None:
        raise RuntimeError(
            "send_event_transactional must be called inside an activity or compensation: in workflow "
            "code the event would be written again on every replay. Move the call into an @activity."
        )
    _check_text("event_type", event_type, required=True)
    _check_text("event_source", event_source, required=True)
    _check_text("subject", subject)
    _check_text("content_type", content_type)
    checked_extensions = _check_extensions(extensions)
    data_json, data_bytes, resolved_content_type = _encode_data(event_data, content_type)
    event_id = str(uuid.uuid4())
    event = OutboxEvent(
        event_id=event_id,
        instance_id=ctx.instance_id,
        event_type=event_type,
        source=event_source,
        subject=subject,
        content_type=resolved_content_type,
        data_json=data_json,
        data_bytes=data_bytes,
        extensions=tracing.with_trace(dict(checked_extensions)),
    )
    # on_event_sent is reported once the activity's transaction has committed, never for
    # a rolled-back one
    await ctx.runtime.send_event(step, event, event_data)
    return event_id


__all__ = ["send_event_transactional"]
