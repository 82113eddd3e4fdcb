"""An instance's durable streams, live on its page (``write_stream``).

``GET /stream?instance=ID&key=KEY`` is the stream as Server-Sent Events, the ingress's
format (``kenning.core.streams``: an ``entry`` event per entry, ``id:`` its offset, a
``close`` event at the end): the page's script shows each entry as it comes, and a
reconnecting ``EventSource`` resumes after ``Last-Event-ID``. The console's readers share
one LISTEN connection and one read per stream per wake (``kenning.client.streams``),
opened by the first reader; its streams count toward ``--console-max-streams`` with the
live-update ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from kenning.client.results import ResultWaits
from kenning.client.streams import StreamReaders
from kenning.core.streams import SSE_CLOSE, SSE_KEEPALIVE, check_stream_key, sse_entry, sse_start_offset
from kenning.errors import WorkflowNotFoundError
from kenning.storage import streams as streams_sql
from kenning_console.state import Console, console_of

KEEPALIVE_SECONDS = 15.0
# entries of a stream the page shows at most (the newest): the script drops older ones
SHOWN_ENTRIES = 200


@contextlib.asynccontextmanager
async def reading(console: Console) -> AsyncIterator[None]:
    """The console's stream readers, for the app's lifespan."""
    assert console.database is not None
    waits = ResultWaits(console.database.listen_url)
    console.readers = StreamReaders(console.database, waits)
    try:
        yield
    finally:
        await console.readers.close()
        await waits.close()
        console.readers = None


def entries_url(instance_id: str, key: str) -> str:
    return "/stream?" + urlencode({"instance": instance_id, "key": key})


async def stream(request: Request) -> Response:
    console = console_of(request)
    instance_id = request.query_params.get("instance", "")
    key = request.query_params.get("key", "")
    try:
        check_stream_key(key)
        offset = sse_start_offset(request.query_params.get("offset"), request.headers.get("last-event-id"))
    except ValueError as error:
        raise HTTPException(400, str(error)) from None
    if not instance_id:
        raise HTTPException(400, "instance= names the instance whose stream to read")
    found = await console.read(lambda conn: streams_sql.stream_read(conn, instance_id, key, offset=0, limit=0))
    if found is None:
        raise HTTPException(404, f"no instance {instance_id!r}")
    readers = console.readers
    assert readers is not None, "the console is not started"
    if console.streams_open + (console.watchers.count if console.watchers else 0) >= console.settings.max_streams:
        raise HTTPException(503, "the most live streams this console serves are open")

    async def body() -> AsyncIterator[bytes]:
        console.streams_open += 1
        try:
            closed = True
            try:
                async with contextlib.aclosing(readers.read(instance_id, key, offset, idle=KEEPALIVE_SECONDS)) as got:
                    async for entry in got:
                        yield SSE_KEEPALIVE if entry is None else sse_entry(entry)
            except WorkflowNotFoundError:
                closed = False
            if closed:
                yield SSE_CLOSE
        finally:
            console.streams_open -= 1

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={"cache-control": "no-store", "x-accel-buffering": "no"}
    )


def routes() -> list[BaseRoute]:
    return [Route("/stream", stream, methods=["GET"])]
