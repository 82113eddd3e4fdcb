"""``GET /instances/{id}/streams/{key}``: a durable stream (``write_stream``) as
Server-Sent Events.

Each entry is an event ``entry`` whose ``id:`` is its offset and whose ``data:`` is one
line of JSON (``offset``, ``attempt``, ``step``, ``time``, ``value``); the stream's close
is an event ``close`` after the last entry, and the response ends (an entry this process
cannot open, a key it lacks: an event ``error`` with the line naming the key, and the
response ends without ``close``). A client that lost the
connection reconnects with ``Last-Event-ID`` (the last offset it got; EventSource sends
it by itself) and gets the entries after it, each once, in order; ``?offset=N`` starts at
N. A comment line every ``KEEPALIVE_SECONDS`` keeps proxies from closing an idle
response. The readers of a process share its one LISTEN connection and one read per
stream per wake (``kenning.client.streams``).

uvicorn waits for responses in flight before it stops, and an event stream never ends by
itself: when the process is asked to stop, every event stream ends where it is, without a
``close`` event, so its client reconnects (to another ingress) and resumes.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from types import FrameType
from typing import Any

import structlog

from kenning import codecs
from kenning.client.streams import StreamReaders
from kenning.core.streams import SSE_CLOSE, SSE_KEEPALIVE, check_stream_key, sse_entry
from kenning.errors import WorkflowNotFoundError

KEEPALIVE_SECONDS = 15.0
_log = structlog.get_logger("kenning.ingress")
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def checked_key(key: str) -> str:
    check_stream_key(key)
    return key


async def events(
    readers: StreamReaders, instance_id: str, key: str, offset: int, stopping: asyncio.Event
) -> AsyncIterator[bytes]:
    """The response's body: the entries, keep-alives, and the close (unless the process
    is stopping, or the instance was deleted between the request's check and the read)."""
    closed = True
    try:
        async with aclosing(readers.read(instance_id, key, offset, idle=KEEPALIVE_SECONDS)) as entries:
            async for entry in entries:
                yield SSE_KEEPALIVE if entry is None else sse_entry(entry)
    except WorkflowNotFoundError:
        closed = False
    except codecs.CodecError as error:  # this ingress's keys: one line, to the log and the client
        _log.error("ingress.payload_unreadable", instance_id=instance_id, stream=key, error=str(error))
        yield f"event: error\ndata: {json.dumps({'error': str(error)})}\n\n".encode()
        closed = False  # not the stream's close: a client may resume once the key is given
    if closed and not stopping.is_set():
        yield SSE_CLOSE


def on_exit_signals(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` (in the running loop) when SIGINT or SIGTERM arrives, before the
    handler in place (uvicorn's, which begins the graceful shutdown); returns what puts
    the handlers back. Outside the main thread (no signals there) it does nothing."""
    loop = asyncio.get_running_loop()
    restored: list[tuple[int, Any]] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: FrameType | None, previous: Callable[..., Any] = previous) -> None:
            loop.call_soon_threadsafe(callback)
            previous(signum, frame)

        try:
            signal.signal(sig, handler)
        except ValueError:  # not the main thread
            return lambda: None
        restored.append((sig, previous))

    def restore() -> None:
        for sig, previous in restored:
            signal.signal(sig, previous)

    return restore
