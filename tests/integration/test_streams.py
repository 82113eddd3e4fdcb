"""Durable streams on PostgreSQL (issue 34, item 1): entries written from workflow code
are recorded once (a replay writes nothing again), an activity's entries are visible at
once and carry the attempt (a retried attempt's under a higher number than the abandoned
one's), ``Client.read_stream`` yields every entry once, in order, woken by the writes'
NOTIFY (the fallback poll is 30 s here), and ends at the close: ``close_stream`` or the
instance's end, in the end's transaction. Writes after the close and at the limits are
refused with a clear error; retention deletes the streams with the instance.

Before the feature none of ``write_stream``, ``close_stream``, ``read_stream`` existed.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, cast

import psycopg
import pytest

from kenning import Client, StreamEntry, WorkflowNotFoundError
from kenning.db import Database
from tests.apps import streams
from tests.support import eventually, running_worker

Sql = psycopg.Connection[tuple[object, ...]]


async def _read_all(client: Client, instance_id: str, key: str, offset: int = 0) -> list[StreamEntry]:
    return [entry async for entry in client.read_stream(instance_id, key, offset)]


async def test_a_chat_stream_holds_workflow_and_activity_entries_in_order(database: Database, sql: Sql) -> None:
    async with Client(database=database, result_poll_interval=30) as client, running_worker(database, streams.app):
        started = await client.start(streams.chat, prompt="hello brave new world")
        reader = asyncio.create_task(_read_all(client, started.instance_id, "chat"))
        assert await client.result(started, timeout=20) == {"first": 0, "last": 7}
        entries = await asyncio.wait_for(reader, 20)
    values = [(e.offset, e.attempt, e.step, e.value) for e in entries]
    assert values == [
        (0, 0, None, {"event": "start"}),
        (1, 1, "generate:1", {"token": "hello"}),
        (2, 1, "generate:1", {"token": "brave"}),
        (3, 2, "generate:1", {"token": "hello"}),
        (4, 2, "generate:1", {"token": "brave"}),
        (5, 2, "generate:1", {"token": "new"}),
        (6, 2, "generate:1", {"token": "world"}),
        (7, 0, None, {"event": "end", "text": "hello brave new world"}),
    ]
    assert all(a.time <= b.time for a, b in itertools.pairwise(entries))
    # the instance's end closed the stream in its transaction
    (closed,) = sql.execute("SELECT closed_at IS NOT NULL FROM kenning_streams").fetchone() or (None,)
    assert closed is True
    # a reader after the end reads everything and ends; from an offset, the rest
    async with Client(database=database) as client:
        assert [e.offset for e in await _read_all(client, started.instance_id, "chat", 5)] == [5, 6, 7]
        assert await _read_all(client, started.instance_id, "never-written") == []
        with pytest.raises(WorkflowNotFoundError):
            await _read_all(client, "no-such-instance", "chat")
        with pytest.raises(ValueError, match="offset"):
            await _read_all(client, started.instance_id, "chat", -1)


async def test_close_stream_ends_readers_and_refuses_later_writes(database: Database) -> None:
    async with Client(database=database, result_poll_interval=30) as client, running_worker(database, streams.app):
        started = await client.start(streams.closes_early)

        async def waiting() -> bool:
            return (await client.status(started.instance_id)).status == "waiting_for_message"

        await eventually(cast(Any, waiting), message="closes_early waits", timeout=15)
        # closed while the instance runs on: the reader ends
        assert [e.value for e in await _read_all(client, started.instance_id, "a")] == [1]
        follower = asyncio.create_task(_read_all(client, started.instance_id, "b"))
        await asyncio.sleep(0.3)
        assert not follower.done()  # "b" is open: its reader waits
        await client.send_message(started.instance_id, "go")
        refused = await client.result(started, timeout=20)
        assert [e.value for e in await asyncio.wait_for(follower, 10)] == ["open"]
    assert refused == f"stream 'a' of instance {started.instance_id!r} is closed: nothing was written"
