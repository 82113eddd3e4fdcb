"""``send_event_transactional``: the outbox row commits with the activity, or not at all."""

from __future__ import annotations

import psycopg
import pytest

from kenning import Client, WorkflowFailedError
from kenning.db import Database
from tests.apps import outbox as app
from tests.logguard import expect_log
from tests.support import executions, running_worker

INLINE = {"inline_retry_seconds": 0.1}  # pause_once's 0.2 s back-off releases the instance


def outbox_rows(sql: psycopg.Connection[tuple[object, ...]], instance_id: str) -> list[dict[str, object]]:
    cursor = sql.execute(
        "SELECT CAST(id AS text) AS id, instance_id, event_type, source, subject, content_type, data, data_bytes, "
        "extensions, status, attempts FROM kenning_outbox WHERE instance_id = %s ORDER BY created_seq",
        (instance_id,),
    )
    names = [d.name for d in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@pytest.fixture
def app_orders(sql: psycopg.Connection[tuple[object, ...]]) -> None:
    sql.execute("CREATE TABLE app_orders (id text PRIMARY KEY, attempt integer NOT NULL)")


async def test_events_are_recorded_in_the_activity_transaction_once_despite_replay(
    database: Database, database_url: str, sql: psycopg.Connection[tuple[object, ...]], side_channel: str
) -> None:
    app.hooks.sent.clear()
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as listener:
        await listener.execute("LISTEN kenning_outbox")
        async with Client(database=database) as client, running_worker(database, app.app, **INLINE):
            started = await client.start(app.outbox_announce, order_id="o-1")
            ids = await client.result(started.instance_id, timeout=15)
        notified = [n.channel async for n in listener.notifies(timeout=5, stop_after=1)]
    assert notified == ["kenning_outbox"]
    counts = executions(side_channel)
    assert counts[f"pause_once {started.instance_id}"] == 2  # so the workflow was replayed ...
    assert counts[f"announce {started.instance_id}"] == 1  # ... and announce was not re-run
    rows = outbox_rows(sql, started.instance_id)
    assert [r["id"] for r in rows] == ids and len(set(ids)) == 3
    placed, blob, note = rows
    assert placed == {
        "id": ids[0],
        "instance_id": started.instance_id,
        "event_type": "order.placed",
        "source": "/shop/orders",
        "subject": "o-1",
        "content_type": "application/json",
        "data": {"order_id": "o-1", "total": 42},
        "data_bytes": None,
        "extensions": {"tenant": "acme", "priority": 5, "urgent": True},
        "status": "pending",
        "attempts": 0,
    }
    assert (blob["data"], blob["data_bytes"], blob["content_type"]) == (None, app.BINARY, "application/octet-stream")
    assert (note["data"], note["content_type"], note["subject"]) == ("thank you", "text/plain", None)
    # on_event_sent fires once per recorded event, with the data as the activity passed it
    assert [(t, s) for t, s, _ in app.hooks.sent] == [
        ("order.placed", "/shop/orders"),
        ("order.label", "/shop/labels"),
        ("order.note", "/shop/notes"),
    ]
    assert app.hooks.sent[0][2] == app.OrderPlaced(order_id="o-1", total=42)


async def test_rolled_back_attempts_leave_no_event_and_the_committed_one_leaves_one(
    database: Database, sql: psycopg.Connection[tuple[object, ...]], side_channel: str, app_orders: None
) -> None:
    async with Client(database=database) as client, running_worker(database, app.app):
        started = await client.start(app.outbox_order, order_id="o-2", fail_times=2)
        event_id = await client.result(started.instance_id, timeout=15)
    assert executions(side_channel)[f"record_order {started.instance_id}"] == 3
    rows = outbox_rows(sql, started.instance_id)
    # two attempts sent an event and raised: both rolled back with their order row
    assert [(r["id"], r["data"]) for r in rows] == [(event_id, {"order_id": "o-2", "attempt": 3})]
    assert sql.execute("SELECT id, attempt FROM app_orders").fetchall() == [("o-2", 3)]
    # on_event_sent reports the committed event only, not the two rolled back
    reported = [d for _, _, d in app.hooks.sent if isinstance(d, dict) and d.get("order_id") == "o-2"]
    assert reported == [{"order_id": "o-2", "attempt": 3}]


async def test_an_activity_that_fails_for_good_leaves_no_event(
    database: Database, sql: psycopg.Connection[tuple[object, ...]], side_channel: str, app_orders: None
) -> None:
    expect_log("instance.failed", workflow="outbox_give_up")
    async with Client(database=database) as client, running_worker(database, app.app):
        started = await client.start(app.outbox_give_up, order_id="o-3")
        with pytest.raises(WorkflowFailedError, match="payment declined"):
            await client.result(started.instance_id, timeout=15)
    assert executions(side_channel)[f"record_then_give_up {started.instance_id}"] == 1
    assert sql.execute("SELECT count(*) FROM kenning_outbox").fetchone() == (0,)
    assert sql.execute("SELECT count(*) FROM app_orders").fetchone() == (0,)


async def test_sending_from_workflow_code_fails_the_workflow_with_a_clear_error(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    expect_log("instance.failed", workflow="outbox_from_workflow")
    async with Client(database=database) as client, running_worker(database, app.app):
        started = await client.start(app.outbox_from_workflow)
        with pytest.raises(WorkflowFailedError) as failed:
            await client.result(started.instance_id, timeout=15)
    assert failed.value.error is not None
    assert failed.value.error["type"] == "builtins.RuntimeError"
    assert "must be called inside an activity" in str(failed.value.error["message"])
    assert "every replay" in str(failed.value.error["message"])
    assert sql.execute("SELECT count(*) FROM kenning_outbox").fetchone() == (0,)


async def test_invalid_events_are_refused_before_anything_is_written(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    async with Client(database=database) as client, running_worker(database, app.app):
        started = await client.start(app.outbox_invalid)
        messages = await client.result(started.instance_id, timeout=15)
    expected = [
        "event_type must be a non-empty string",
        "extension name 'Bad-Name' is invalid",
        "'subject' is a CloudEvents attribute, not an extension",
        "outside the CloudEvents integer range",
        "extension 'when' must be str, int or bool, got float",
        "contains a NUL character",
        "data for content type 'text/plain' must be str or bytes",
        "cannot be stored as JSON",
        "event_type contains a NUL character",
    ]
    assert len(messages) == len(expected)
    for message, fragment in zip(messages, expected, strict=True):
        assert fragment in message, (fragment, message)
    assert sql.execute("SELECT count(*) FROM kenning_outbox").fetchone() == (0,)


async def test_events_of_sequential_activities_get_increasing_creation_order(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    async with Client(database=database) as client, running_worker(database, app.app):
        started = await client.start(app.outbox_sequence, count=5)
        ids = await client.result(started.instance_id, timeout=15)
    rows = sql.execute(
        "SELECT CAST(id AS text), data FROM kenning_outbox WHERE instance_id = %s ORDER BY created_seq",
        (started.instance_id,),
    ).fetchall()
    assert [r[0] for r in rows] == ids
    assert [r[1] for r in rows] == [{"seq": n} for n in range(5)]


async def test_a_compensation_sends_its_event_when_it_is_recorded(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    expect_log("instance.failed", workflow="outbox_saga")
    async with Client(database=database) as client, running_worker(database, app.app):
        started = await client.start(app.outbox_saga, order_id="o-4")
        with pytest.raises(WorkflowFailedError, match="card declined"):
            await client.result(started.instance_id, timeout=15)
    rows = outbox_rows(sql, started.instance_id)
    assert [(r["event_type"], r["data"]) for r in rows] == [
        ("order.reserved", {"order_id": "o-4"}),
        ("order.cancelled", {"order_id": "o-4"}),
    ]
