"""Event data sealed in the inbox (issue 36): ``wait_event(match=...)`` takes exactly the
events it takes from plain data, whichever way they come (before the wait, after it, a
plain row among sealed ones, more non-matching candidates than a page); the worker's
containment test agrees with PostgreSQL's ``@>``; a worker without the key parks no event
and fails no instance, and delivers all once it has the key."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from kenning import Client, codecs
from kenning.commands.encryption import rotate
from kenning.db import Database
from kenning.events import data_contains
from kenning.storage import inbox as inbox_sql
from kenning.storage.inbox import NewEvent
from kenning.testing import WorkflowEnvironment
from kenning.testing.memorystate import contains
from kenning_worker.inbox import InboxSettings
from tests.apps import sealed_events
from tests.apps.sealed_events import EVENT
from tests.logguard import expect_log
from tests.support import eventually, running_worker

Sql = psycopg.Connection[tuple[object, ...]]
KEY = "t1:" + base64.b64encode(b"\x05" * 32).decode()
OTHER = "t9:" + base64.b64encode(b"\x06" * 32).decode()  # a worker's key set without t1
WRONG = "t1:" + base64.b64encode(b"\x08" * 32).decode()  # t1's id with other bytes
ROTATED = "t2:" + base64.b64encode(b"\x04" * 32).decode()
MARKER = "MARKER-7700-0000-0000-0036"


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(codecs.KEYS_VARIABLE, raising=False)
    codecs.configure(keys=KEY)
    yield
    codecs.reset()


CONTAINMENT_CASES: list[tuple[Any, Any]] = [
    ({"order": "a", "n": 1}, {"order": "a"}),
    ({"order": "a"}, {"order": "b"}),
    ({"order": "a"}, {}),
    ([1, 2], {}),
    ("text", {}),
    (None, {"order": "a"}),
    ({"n": 1}, {"n": 1.0}),
    ({"n": 1}, {"n": True}),
    ({"n": True}, {"n": 1}),
    ({"n": "1"}, {"n": 1}),
    ({"n": None}, {"n": None}),
    ({"n": None}, {"n": False}),
    ({"a": {"b": {"c": 1, "d": 2}}}, {"a": {"b": {"c": 1}}}),
    ({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}),
    ({"tags": ["x", "y", "z"]}, {"tags": ["z", "x"]}),
    ({"tags": ["x", "y"]}, {"tags": "x"}),
    ({"tags": "x"}, {"tags": ["x"]}),
    ({"tags": ["x", ["y"]]}, {"tags": [["y"]]}),
    ({"tags": ["x", ["y"]]}, {"tags": ["y"]}),
    ({"items": [{"id": 1, "q": 2}, {"id": 2}]}, {"items": [{"id": 1}]}),
    ({"items": [{"id": 1, "q": 2}]}, {"items": [{"id": 3}]}),
    ({"items": []}, {"items": []}),
    ({"items": [1]}, {"items": []}),
    ({"items": {}}, {"items": []}),
    ({"a": [1, 1]}, {"a": [1, 1, 1]}),
    ({"a": 12345678901234567890}, {"a": 12345678901234567890}),
    ({"a": 0.1}, {"a": 0.10}),
    ({"é": "ü"}, {"é": "ü"}),
]


def test_the_workers_containment_test_agrees_with_postgresql(sql: Sql) -> None:
    """The worker tests ``match`` on opened data where SQL did before: any case where they
    differ would deliver an event SQL would not have (or miss one)."""
    for data, match in CONTAINMENT_CASES:
        (expected,) = sql.execute(
            "SELECT CAST(%s AS jsonb) @> CAST(%s AS jsonb)", (json.dumps(data), json.dumps(match))
        ).fetchone() or (None,)
        assert data_contains(data, match) is expected, (data, match)
        assert contains(data, match) is expected, ("kenning.testing's memory inbox", data, match)


@pytest.mark.parametrize("backend", ["memory", "postgresql"])
async def test_match_takes_the_same_events_when_their_data_is_sealed(
    backend: str, database_url: str, sql: Sql, keys: None
) -> None:
    url = database_url if backend == "postgresql" else None
    async with WorkflowEnvironment(sealed_events.app, database_url=url, migrate=False) as env:
        codecs.configure(keys="")  # received before encryption was turned on: a plain row
        await env.send_event(EVENT, {"order": "a", "n": 1})
        codecs.configure(keys=KEY)
        # more non-matching sealed candidates than the worker reads in a page, then the match
        for n in range(105):
            await env.send_event(EVENT, {"order": "b", "n": n, "card": MARKER})
        await env.send_event(EVENT, {"order": "a", "n": 2, "card": MARKER})
        await env.send_event(EVENT, {"order": "a", "n": 3, "card": MARKER})

        # before the wait: the plain row first, then the oldest sealed one it matches
        early = await env.start(sealed_events.takes_two, order="a")
        assert await early.result() == [1, 2]
        # nothing matches: the timeout, not a wrong event
        never = await env.start(sealed_events.times_out, order="z")
        await env.sleep(31)
        assert await never.result() == "timed out"
        # after the wait: a delivery matched on the opened data
        late = await env.start(sealed_events.takes_two, order="c")
        await env.send_event(EVENT, {"order": "d", "n": 0, "card": MARKER})
        await env.send_event(EVENT, {"order": "c", "n": 7, "card": MARKER})
        await env.send_event(EVENT, {"order": "c", "n": 8, "card": MARKER})
        assert await late.result() == [7, 8]
    if backend == "postgresql":
        rows = sql.execute("SELECT CAST(data AS text) FROM kenning_inbox WHERE kind = 'event'").fetchall()
        assert len(rows) == 1 + 105 + 2 + 3
        assert not any(MARKER in str(row) for row in rows)
        (sealed,) = sql.execute("SELECT count(*) FROM kenning_inbox WHERE data ? '$enc'").fetchone() or (0,)
        assert sealed == 105 + 2 + 3


def inbox_row(sql: Sql, event_id: str) -> tuple[Any, ...]:
    row = sql.execute(
        "SELECT status, attempts, last_error FROM kenning_inbox WHERE event_id = %s", (event_id,)
    ).fetchone()
    assert row is not None
    return tuple(row)


async def send(database: Database, event_id: str, data: Any) -> None:
    """Store an event as an ingress with the key does (``data`` sealed already)."""
    event = NewEvent("tests/sealed", event_id, EVENT, {"specversion": "1.0"}, data)
    async with database.connection() as conn:
        assert await inbox_sql.inbox_insert_events(conn, [event]) == [True]


def status(sql: Sql, instance_id: str) -> str:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    return str(row[0]) if row else ""


@pytest.mark.parametrize("worker_keys", [OTHER, WRONG, ""], ids=["key-missing", "wrong-key", "no-keys"])
async def test_a_worker_without_the_key_parks_no_event_fails_no_instance_and_catches_up(
    database: Database, sql: Sql, keys: None, worker_keys: str
) -> None:
    """The worker's keys are wrong, not the events nor the workflows: an event it cannot
    open is given back uncounted (never parked), an instance whose input it cannot open is
    released (never failed nor compensated), a new subscription whose earlier event it
    cannot open stays unchecked; given the key, every one of them is delivered."""
    expect_log("event.unreadable")
    expect_log("instance.payload_unreadable")
    first, second = (
        codecs.seal({"order": order, "n": n, "card": MARKER}) for order, n in (("earlier", 1), ("later", 2))
    )
    codecs.configure(keys="")
    async with Client(database=database) as client:
        # plain input: the worker runs it, subscribes, and meets a sealed event from before
        earlier = (await client.start(sealed_events.takes_one, order="earlier")).instance_id
        later = (await client.start(sealed_events.takes_one, order="later")).instance_id
        await send(database, "e-1", first)
        codecs.configure(keys=KEY)
        # sealed input the worker cannot open
        sealed_input = (await client.start(sealed_events.takes_one, order="sealed-input")).instance_id
        codecs.configure(keys=worker_keys)
        inbox = InboxSettings(retry_seconds=0.02, max_attempts=2)
        async with running_worker(database, sealed_events.app, inbox=inbox):
            both_wait = (earlier, later)
            await eventually(
                lambda: all(status(sql, i) == "waiting_for_event" for i in both_wait), timeout=30, message="subscribed"
            )
            await send(database, "e-2", second)  # after the wait: the delivery meets it
            await eventually(lambda: inbox_row(sql, "e-2")[2], timeout=30, message="the event given back")
            await asyncio.sleep(1.0)  # dozens of the worker's passes, each at the rows again
            for event_id in ("e-1", "e-2"):
                state, attempts, error = inbox_row(sql, event_id)
                # at most the claim in hand counts one; counted, two would have parked it long ago
                assert state == "pending" and attempts <= 1, "an event it cannot open is neither counted nor parked"
                assert "'t1'" in error and "KENNING_ENCRYPTION_KEYS" in error and "\n" not in error
            assert status(sql, earlier) == status(sql, later) == "waiting_for_event"
            assert status(sql, sealed_input) == "pending"
            assert sql.execute(
                "SELECT count(*) FROM kenning_history WHERE instance_id = %s", (sealed_input,)
            ).fetchone() == (0,)
            codecs.configure(keys=KEY)  # the key given: everything goes through
            assert await client.result(earlier, timeout=30) == 1  # the new subscription's look back
            assert await client.result(later, timeout=30) == 2  # the event's delivery
            await eventually(
                lambda: status(sql, sealed_input) == "waiting_for_event", timeout=30, message="sealed input read"
            )
            await eventually(lambda: inbox_row(sql, "e-2")[0] == "processed", timeout=30, message="e-2 processed")
        assert inbox_row(sql, "e-1")[0] == "processed"


async def test_a_childs_end_reaches_its_parent_through_the_inbox_sealed(
    database_url: str, sql: Sql, keys: None
) -> None:
    """The child's end is an inbox row written in SQL (its result sealed inside, its ids
    plain for the parent's wait): the parent takes it, its data opened, the result whole."""
    async with WorkflowEnvironment(sealed_events.app, database_url=database_url, migrate=False) as env:
        started = await env.start(sealed_events.parent, card=MARKER)
        assert await started.result() == f"child saw {MARKER}"
    rows = sql.execute("SELECT CAST(data AS text) FROM kenning_inbox").fetchall()
    assert rows and not any(MARKER in str(row) for row in rows)


async def test_a_childs_end_rotated_whole_in_the_inbox_is_still_found_by_its_parent(
    database_url: str, database: Database, sql: Sql, keys: None
) -> None:
    """``kenning encryption rotate`` seals an inbox row whole (a child's end, plain around
    its sealed result): a parent that waits for it afterwards finds it by its opened data."""
    async with WorkflowEnvironment(sealed_events.app, database_url=database_url, migrate=False) as env:
        started = await env.start(sealed_events.parent, card=f"later {MARKER}")
        await env.settle()  # the child ended, its parent waits for the timer
        codecs.configure(keys=f"{ROTATED},{KEY}")
        assert (await rotate(database, batch_size=10))["kenning_inbox.data"] == 1
        (sealed,) = sql.execute("SELECT data ? '$enc' FROM kenning_inbox").fetchone() or (None,)
        assert sealed is True
        await env.sleep(61)
        assert await started.result() == f"child saw later {MARKER}"
