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

from kenning import Client, StreamEntry, WorkflowFailedError, WorkflowNotFoundError
from kenning.client.streams import StreamReaders
from kenning.core.limits import MAX_STREAM_ENTRIES, MAX_STREAM_ENTRY_CHARS
from kenning.db import Database
from kenning.storage import escapes as escapes_sql
from kenning.storage import instances as instances_sql
from kenning.storage import retention as retention_sql
from kenning.storage import streams as streams_sql
from tests.apps import streams
from tests.logguard import expect_log
from tests.support import check_invariants, eventually, running_worker

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
    check_invariants(sql)


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


async def test_many_readers_share_one_listener_and_one_feed_and_see_every_entry_live(
    database: Database, sql: Sql
) -> None:
    count = 6
    async with Client(database=database, result_poll_interval=30) as client, running_worker(database, streams.app):
        started = await client.start(streams.ticker, count=count)
        received: list[list[int]] = [[] for _ in range(50)]

        async def follow(n: int) -> None:
            async for entry in client.read_stream(started.instance_id, "ticks"):
                received[n].append(entry.value)

        readers = [asyncio.create_task(follow(n)) for n in range(50)]
        for tick in range(count):
            await client.send_message(started.instance_id, "tick")
            # every reader sees the entry while the instance runs on (woken, not polled: 30 s)
            expected = tick + 1

            def all_received(n: int = expected) -> bool:
                return all(len(r) == n for r in received)

            await eventually(all_received, timeout=10, message=f"tick {tick}")
            if tick == count - 1:
                break  # the instance ended with this one: the readers end
            await eventually(lambda: client.streams.feeds == 1, timeout=10, message="the readers share one feed")
            listeners = sql.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'kenning-results'"
                " AND datname = current_database()"
            ).fetchone()
            assert listeners == (1,)
        await asyncio.wait_for(asyncio.gather(*readers), 10)  # the end closed the stream
    assert received == [list(range(count))] * 50
    assert client.streams.feeds == 0


async def test_refusals_at_the_limits_and_retention_takes_the_streams(database: Database, sql: Sql) -> None:
    async with Client(database=database, result_poll_interval=30) as client, running_worker(database, streams.app):
        started = await client.start(streams.at_the_limits)

        async def written() -> bool:
            return sql.execute("SELECT count(*) FROM kenning_stream_entries").fetchone() == (1,)

        await eventually(cast(Any, written), message="the first entry", timeout=10)
        sql.execute("UPDATE kenning_streams SET length = %s", [MAX_STREAM_ENTRIES])
        await client.send_message(started.instance_id, "go")
        refused = await client.result(started, timeout=20)
    assert refused == {
        "full": f"stream 'full' of instance {started.instance_id!r} holds {MAX_STREAM_ENTRIES} entries, the most a "
        "stream holds: nothing was written; write on under another key",
        "big": f"stream 'big' entry cannot be stored: {MAX_STREAM_ENTRY_CHARS + 3} characters of JSON, "
        f"more than {MAX_STREAM_ENTRY_CHARS} a row holds: set KENNING_OBJECT_STORE (s3://bucket/prefix) to keep "
        "larger values in an object store",
    }
    sql.execute("UPDATE kenning_instances SET finished_at = now() - interval '2 days'")
    async with database.connection() as conn:
        await retention_sql.instances_expire(conn, default_seconds=3600, limit=10)
    assert sql.execute(
        "SELECT (SELECT count(*) FROM kenning_streams), (SELECT count(*) FROM kenning_stream_entries)"
    ).fetchone() == (0, 0)


async def test_a_taken_over_attempt_writes_under_a_higher_number_and_the_old_lease_writes_nothing(
    database: Database, sql: Sql
) -> None:
    """The statement's attempt numbering, as a takeover meets it: the worker that took the
    instance over runs the step's attempt 1 again (the crashed one was never counted)."""
    async with Client(database=database) as client:
        instance_id = (await client.start(streams.ticker, count=1)).instance_id

    def lease() -> str:
        row = sql.execute(
            "UPDATE kenning_instances SET status = 'running', lease_token = gen_random_uuid() WHERE id = %s"
            " RETURNING CAST(lease_token AS text)",
            [instance_id],
        ).fetchone()
        assert row is not None
        return str(row[0])

    async def write(token: str, value: str, attempt: int = 1) -> streams_sql.StreamWritten:
        async with database.connection() as conn:
            return await streams_sql.stream_write(
                conn,
                instance_id=instance_id,
                token=token,
                key="k",
                value=value,
                step_id="act:1",
                attempt=attempt,
                writer=f"{token}:{attempt}",
                max_entries=MAX_STREAM_ENTRIES,
            )

    crashed = lease()
    assert [(await write(crashed, v)).entry.attempt for v in ("a", "b")] == [1, 1]  # type: ignore[union-attr]
    taken_over = lease()
    lost = await write(crashed, "zombie")
    assert (lost.leased, lost.entry) == (False, None)  # the old lease adds nothing
    assert [(await write(taken_over, v)).entry.attempt for v in ("a", "b")] == [2, 2]  # type: ignore[union-attr]
    second = await write(taken_over, "retry", attempt=2)  # its own retry, counted: attempt 2 of the engine
    assert second.entry is not None and second.entry.attempt == 3
    assert sql.execute('SELECT array_agg(attempt ORDER BY "offset") FROM kenning_stream_entries').fetchone() == (
        [1, 1, 2, 2, 3],
    )


async def test_reads_are_bounded_in_entries_and_bytes_and_still_yield_every_entry(database: Database) -> None:
    """Tiny bounds (a read of 3 entries or 40 bytes, a feed keeping 2 entries or 30
    bytes): every entry still comes once, in order, from a finished stream read in pieces
    and from a live one whose feed keeps less than a slow reader lags behind."""
    async with Client(database=database, result_poll_interval=30) as client, running_worker(database, streams.app):
        chat = await client.start(streams.chat, prompt="hello brave new world")
        await client.result(chat, timeout=20)
        tiny = StreamReaders(database, client.results, batch=3, batch_bytes=40, tail=2, tail_bytes=30)
        whole = [e async for e in client.read_stream(chat.instance_id, "chat")]
        pieces = [e async for e in tiny.read(chat.instance_id, "chat") if e is not None]
        assert pieces == whole and len(whole) == 8

        ticker = await client.start(streams.ticker, count=8)
        fast: list[int] = []
        slow: list[int] = []

        async def read(into: list[int], pause: float) -> None:
            async for entry in tiny.read(ticker.instance_id, "ticks"):
                if entry is not None:
                    into.append(entry.value)
                    await asyncio.sleep(pause)  # the slow one falls behind the feed's tail

        readers = [asyncio.create_task(read(fast, 0)), asyncio.create_task(read(slow, 0.2))]
        for _ in range(8):
            await client.send_message(ticker.instance_id, "tick")
        await asyncio.wait_for(asyncio.gather(*readers), 30)
        await tiny.close()
    assert fast == slow == list(range(8))


async def test_a_retried_instance_writes_on_to_the_streams_its_end_closed(database: Database, sql: Sql) -> None:
    expect_log("instance.failed")
    async with Client(database=database, result_poll_interval=30) as client, running_worker(database, streams.app):
        started = await client.start(streams.retried_writer)
        with pytest.raises(WorkflowFailedError):
            await client.result(started, timeout=20)
        # the failure closed the stream
        assert [e.value for e in await _read_all(client, started.instance_id, "log")] == ["before"]
        async with database.connection() as conn:
            assert (await instances_sql.instance_retry(conn, started.instance_id))["retried"] is True
        assert await client.result(started, timeout=20) == "done"
        assert [e.value for e in await _read_all(client, started.instance_id, "log")] == ["before", "after"]
    assert sql.execute("SELECT closed_at IS NOT NULL, ended FROM kenning_streams").fetchall() == [(True, True)]
    check_invariants(sql)


async def test_after_continue_as_new_a_runs_steps_are_labelled_with_its_run(database: Database) -> None:
    """A run's step ids start again: its activity's first attempt is attempt 1 of
    ``says_its_run:1@2``, not a retry of run 1's ``says_its_run:1``, and the stream goes on."""
    async with Client(database=database, result_poll_interval=30) as client, running_worker(database, streams.app):
        started = await client.start(streams.chained_writer, runs=3)
        assert await client.result(started, timeout=20) == 3
        entries = await _read_all(client, started.instance_id, "runs")
    assert [(e.offset, e.attempt, e.step, e.value) for e in entries] == [
        (0, 1, "says_its_run:1", {"run": 1}),
        (1, 1, "says_its_run:1@2", {"run": 2}),
        (2, 1, "says_its_run:1@3", {"run": 3}),
    ]


async def test_a_cancel_and_a_terminate_close_the_streams_and_end_their_readers(database: Database, sql: Sql) -> None:
    expect_log("instance.failed")
    async with Client(database=database, result_poll_interval=30) as client, running_worker(database, streams.app):
        ids = [(await client.start(streams.ticker, count=5)).instance_id for _ in range(2)]
        for instance_id in ids:
            await client.send_message(instance_id, "tick")
        readers = [asyncio.create_task(_read_all(client, i, "ticks")) for i in ids]

        async def both_written() -> bool:
            return sql.execute("SELECT count(*) FROM kenning_stream_entries").fetchone() == (2,)

        await eventually(cast(Any, both_written), message="an entry each", timeout=10)
        await asyncio.sleep(0.2)
        assert not any(r.done() for r in readers)  # open: their readers wait
        cancelled, terminated = ids
        await client.cancel(cancelled)
        async with database.connection() as conn:
            assert await escapes_sql.instances_terminate(conn, [terminated], "enough") == [terminated]
        done = await asyncio.wait_for(asyncio.gather(*readers), 20)
    assert [[e.value for e in entries] for entries in done] == [[0], [0]]
    closed = sql.execute("SELECT instance_id, closed_at IS NOT NULL, ended FROM kenning_streams ORDER BY 1").fetchall()
    assert sorted(closed) == sorted([(cancelled, True, True), (terminated, True, True)])
    check_invariants(sql)
