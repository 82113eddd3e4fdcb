"""Group commit (as the ingress uses it): concurrent requests share inserts against a real
PostgreSQL, each is answered with its own events' outcome, and one request's bad data
does not fail the others in its batch."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

import psycopg
import pytest

from kenning.db import Database, connect
from kenning.db.errors import may_be_one_callers_fault
from kenning.db.groupcommit import GroupCommit
from kenning.storage import inbox as inbox_sql
from kenning.storage.inbox import NewEvent
from kenning_ingress import responses

Sql = psycopg.Connection[tuple[object, ...]]


class CountedInsert:
    """The real inbox insert, counting the statements and the events each carried."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.sizes: list[int] = []

    async def __call__(self, events: Sequence[NewEvent]) -> list[bool]:
        self.sizes.append(len(events))
        async with self.database.connection() as conn:
            # a slow round trip, so that requests pile up behind the one in flight
            await asyncio.sleep(0.02)
            return await inbox_sql.inbox_insert_events(conn, events)


def event(event_id: str, *, source: str = "tests/batching") -> NewEvent:
    attributes = {"specversion": "1.0", "type": "batching.test", "source": source, "id": event_id}
    return NewEvent(source=source, event_id=event_id, event_type="batching.test", attributes=attributes, data={})


def batcher(insert: CountedInsert, max_events: int = 500) -> GroupCommit[NewEvent, bool]:
    return GroupCommit(
        write=insert,
        retry_alone=may_be_one_callers_fault,
        max_items=max_events,
    )


def stored_ids(sql: Sql, source: str = "tests/batching") -> list[str]:
    rows = sql.execute("SELECT event_id FROM kenning_inbox WHERE source = %s ORDER BY event_id", (source,))
    return [str(row[0]) for row in rows]


async def test_concurrent_requests_share_statements_and_get_their_own_answers(database: Database, sql: Sql) -> None:
    insert = CountedInsert(database)
    inbox = batcher(insert)
    # 40 requests: 30 distinct single events, and 10 that repeat one of them concurrently
    requests = [[event(f"e{n:02}")] for n in range(30)] + [[event(f"e{n:02}")] for n in range(10)]
    answers = await asyncio.gather(*(inbox.store(r) for r in requests))

    assert len(insert.sizes) < len(requests) / 2, insert.sizes  # grouped, not one statement each
    assert sum(insert.sizes) == len(requests)
    assert stored_ids(sql) == [f"e{n:02}" for n in range(30)]
    # the first copy of each repeated event is stored, the later one is the duplicate
    assert [a[0] for a in answers[:30]] == [True] * 30
    assert [a[0] for a in answers[30:]] == [False] * 10


async def test_a_request_is_never_split_and_batches_respect_the_size_cap(database: Database, sql: Sql) -> None:
    insert = CountedInsert(database)
    inbox = batcher(insert, max_events=5)
    requests = [[event(f"r{n}-{k}") for k in range(3)] for n in range(6)] + [[event(f"big-{k}") for k in range(8)]]
    answers = await asyncio.gather(*(inbox.store(r) for r in requests))

    assert answers == [[True] * len(r) for r in requests]
    # a batch holds whole requests: at most 5 events unless one request alone is larger
    assert all(size <= 5 or size == 8 for size in insert.sizes), insert.sizes
    assert len(stored_ids(sql)) == 6 * 3 + 8


async def test_one_bad_request_fails_alone_and_its_batch_mates_are_stored(database: Database, sql: Sql) -> None:
    insert = CountedInsert(database)
    inbox = batcher(insert)
    bad = NewEvent(source="tests/batching", event_id="bad\x00id", event_type="batching.test")  # PostgreSQL refuses NUL
    requests = [[event(f"ok{n}")] for n in range(8)] + [[bad]] + [[event(f"ok{n}")] for n in range(8, 16)]
    answers = await asyncio.gather(*(inbox.store(r) for r in requests), return_exceptions=True)

    failed = [a for a in answers if isinstance(a, BaseException)]
    assert len(failed) == 1 and answers[8] is failed[0]
    assert responses.failure(failed[0])[0].status_code in (400, 500)
    assert [a for i, a in enumerate(answers) if i != 8] == [[True]] * 16
    assert stored_ids(sql) == sorted(f"ok{n}" for n in range(16))


async def test_an_unreachable_database_fails_the_whole_batch_without_retrying_each() -> None:
    unreachable = connect("postgresql://postgres@127.0.0.1:1/nowhere")
    insert = CountedInsert(unreachable)
    inbox = batcher(insert)
    try:
        answers = await asyncio.gather(*(inbox.store([event(f"x{n}")]) for n in range(10)), return_exceptions=True)
    finally:
        await unreachable.dispose()
    assert all(isinstance(a, BaseException) for a in answers)
    assert all(responses.failure(a)[0].status_code == 503 for a in answers if isinstance(a, BaseException))
    assert sum(insert.sizes) == 10  # each request tried once, not once more on its own


@pytest.mark.parametrize("cancelled", [0, 3])
async def test_a_cancelled_request_does_not_cancel_its_batch(database: Database, sql: Sql, cancelled: int) -> None:
    insert = CountedInsert(database)
    inbox = batcher(insert)
    tasks = [asyncio.create_task(inbox.store([event(f"c{n}")])) for n in range(10)]
    await asyncio.sleep(0)  # every request queued; the first statement is in flight
    for task in tasks[:cancelled]:
        task.cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert sum(isinstance(d, asyncio.CancelledError) for d in done) == cancelled
    assert stored_ids(sql) == sorted(f"c{n}" for n in range(10))  # the cancelled ones were stored all the same


async def test_an_id_too_long_for_its_index_fails_alone_as_the_events_fault(database: Database, sql: Sql) -> None:
    insert = CountedInsert(database)
    inbox = batcher(insert)
    huge = event(os.urandom(4500).hex())  # over the btree row limit: SQLSTATE 54000, an OperationalError
    answers = await asyncio.gather(
        *(inbox.store([e]) for e in [event("fine-1"), huge, event("fine-2")]), return_exceptions=True
    )
    assert answers[0] == [True] and answers[2] == [True]
    assert isinstance(answers[1], BaseException)
    assert responses.failure(answers[1])[0].status_code == 400  # not 503: retrying cannot help
    assert stored_ids(sql) == ["fine-1", "fine-2"]
