"""Durable streams' vocabulary, shared by the SDK (``write_stream``), storage and the
readers (``Client.read_stream``, the ingress's Server-Sent Events, the console)."""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning.core.limits import MAX_STREAM_ENTRIES, MAX_VALUE_KEY_LENGTH
from kenning.errors import StreamClosedError, StreamFullError

# the attempt number of an entry written by workflow code (recorded once, never retried)
WORKFLOW_ATTEMPT = 0


@dataclass(frozen=True)
class StreamEntry:
    """One entry of a stream, as readers get it.

    ``offset``: its place in the stream, 0 for the first, with no gaps. ``attempt``: 0
    when workflow code wrote it; else the attempt of the activity (or compensation) that
    wrote it, 1 for the first, growing with every later attempt of that step, an attempt
    cut short by a crashed worker included. ``step`` names that step (None from workflow
    code; ``<step id>@<run>`` after a ``continue_as_new``): entries of a step with a
    lower ``attempt`` than a later entry of the same step came from an abandoned attempt.
    ``time``: when it was written (the database's clock).
    """

    offset: int
    attempt: int
    value: Any  # JSON
    time: datetime
    step: str | None = None


def check_stream_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > MAX_VALUE_KEY_LENGTH:
        raise ValueError(f"a stream's key must be a non-empty str of at most {MAX_VALUE_KEY_LENGTH} characters")


def stream_closed_error(instance_id: str, key: str) -> StreamClosedError:
    return StreamClosedError(f"stream {key!r} of instance {instance_id!r} is closed: nothing was written")


def stream_full_error(instance_id: str, key: str) -> StreamFullError:
    return StreamFullError(
        f"stream {key!r} of instance {instance_id!r} holds {MAX_STREAM_ENTRIES} entries, the most a stream "
        "holds: nothing was written; write on under another key"
    )


def next_attempt(writers: dict[str, tuple[str, int]], step_id: str, writer: str, attempt: int) -> int:
    """The attempt number a write of ``step_id`` by ``writer`` (one attempt's identity)
    carries, ``writers`` updated: the number that writer was given, else the engine's
    number raised above the step's last writer's (the SQL of ``storage.streams`` does the
    same in the statement)."""
    last = writers.get(step_id)
    if last is not None and last[0] == writer:
        return last[1]
    number = max(attempt, (last[1] if last is not None else 0) + 1)
    writers[step_id] = (writer, number)
    return number


# ``write_stream(..., publish=True)``: the CloudEvent the entry also becomes, through the
# outbox, in the entry's transaction (the relayer publishes it to its targets)
STREAM_EVENT_TYPE = "kenning.stream.entry"
_STREAM_EVENT_NAMESPACE = uuid.UUID("6f1d7c2e-5b0a-4e53-9a51-0c6b2a8e4d17")


@dataclass(frozen=True)
class StreamEvent:
    """The outbox row of a published entry: its id is derived from (instance, key,
    offset), so it names the entry wherever it goes."""

    event_id: str
    event_type: str
    source: str
    subject: str
    data_json: str


def stream_event(instance_id: str, key: str, entry: StreamEntry) -> StreamEvent:
    """A published entry as a CloudEvent: type ``kenning.stream.entry``, source
    ``kenning/instances/<id>``, subject the key, data ``{instance_id, key, offset,
    attempt, step, time, value}``."""
    data = {"instance_id": instance_id, "key": key, **entry_as_json(entry)}
    return StreamEvent(
        event_id=str(uuid.uuid5(_STREAM_EVENT_NAMESPACE, json.dumps([instance_id, key, entry.offset]))),
        event_type=STREAM_EVENT_TYPE,
        source=f"kenning/instances/{instance_id}",
        subject=key,
        data_json=json.dumps(data),
    )


def entry_as_json(entry: StreamEntry) -> dict[str, Any]:
    """An entry as readers outside Python get it (Server-Sent Events, ``kenning stream
    read``): ``offset``, ``attempt``, ``step``, ``time`` (ISO 8601), ``value``."""
    return {
        "offset": entry.offset,
        "attempt": entry.attempt,
        "step": entry.step,
        "time": entry.time.isoformat(),
        "value": entry.value,
    }


# The latest entries' events, by the entry object: the readers of one stream share its
# entries (kenning.client.streams), so 1,000 of them encode each entry once, not 1,000 times.
_ENCODED: OrderedDict[int, tuple[StreamEntry, bytes]] = OrderedDict()
_ENCODED_KEPT = 4096  # events, and bytes of them at most:
_ENCODED_BYTES = 16 * 1024 * 1024
_encoded_bytes = 0


def sse_entry(entry: StreamEntry) -> bytes:
    """An entry as a Server-Sent Event ``entry`` whose ``id`` is its offset (JSON escapes
    line breaks: ``data`` stays one line)."""
    known = _ENCODED.get(id(entry))
    if known is not None and known[0] is entry:
        return known[1]
    data = json.dumps(entry_as_json(entry), separators=(",", ":"))
    encoded = f"id: {entry.offset}\nevent: entry\ndata: {data}\n\n".encode()
    global _encoded_bytes
    _ENCODED[id(entry)] = (entry, encoded)  # the entry is kept with it: its id is not reused meanwhile
    _encoded_bytes += len(encoded)
    while len(_ENCODED) > _ENCODED_KEPT or _encoded_bytes > _ENCODED_BYTES:
        _encoded_bytes -= len(_ENCODED.popitem(last=False)[1][1])
    return encoded


# the event after a closed stream's last entry
SSE_CLOSE = b"event: close\ndata: {}\n\n"
# a comment line: keeps proxies from closing an idle response
SSE_KEEPALIVE = b": keep-alive\n\n"


def sse_start_offset(query_offset: str | None, last_event_id: str | None) -> int:
    """Where an event stream starts: after ``Last-Event-ID``, else at ``?offset=``, else
    0; ``ValueError`` naming the bad one."""
    if last_event_id is not None and last_event_id.strip():
        text = last_event_id.strip()
        if not text.isdigit():
            raise ValueError(f"Last-Event-ID must be an entry's offset (a non-negative integer), got {text[:40]!r}")
        return int(text) + 1
    if query_offset is not None:
        if not query_offset.strip().isdigit():
            raise ValueError(f"offset must be a non-negative integer, got {query_offset[:40]!r}")
        return int(query_offset)
    return 0
