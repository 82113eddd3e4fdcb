"""Durable streams: ``write_stream`` appends JSON values to a named stream of the
running instance, ``close_stream`` ends it, and readers follow it
(``Client.read_stream``, ``kenning stream read``, the ingress's Server-Sent Events).

From workflow code a write is a step: recorded once, a replay writes nothing again. From
an activity the entry is committed at once, before the activity's own transaction, and
carries the attempt that wrote it (``StreamEntry.attempt``). Every stream of an instance
closes when the instance ends, however it ends. docs/streams.md says what a reader may
rely on.
"""

from __future__ import annotations

from typing import Any

from kenning.context import WorkflowContext
from kenning.core.streams import StreamEntry


async def write_stream(ctx: WorkflowContext, key: str, value: Any, *, publish: bool = False) -> int:
    """Append ``value`` (JSON, or a pydantic model) to the instance's stream ``key`` and
    return its offset (0 for the first entry). ``publish=True`` also sends the entry
    through the outbox as a CloudEvent to the relayer's targets, in the same transaction.

    Raises ``StreamClosedError`` once the stream was closed, ``StreamFullError`` at
    ``MAX_STREAM_ENTRIES`` entries, ``UnstorableValueError`` for an entry larger than
    ``MAX_STREAM_ENTRY_CHARS`` characters of JSON that no object store takes
    (``KENNING_OBJECT_STORE``): nothing is written then."""
    return await ctx.runtime.write_stream(key, value, publish)


async def close_stream(ctx: WorkflowContext, key: str) -> None:
    """End the instance's stream ``key``: its readers finish once they have read every
    entry, and later writes raise ``StreamClosedError``. Closing a closed stream does
    nothing; one never written is closed empty."""
    await ctx.runtime.close_stream(key)


__all__ = ["StreamEntry", "close_stream", "write_stream"]
