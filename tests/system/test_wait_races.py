"""Races between a wait's outcomes: an event already received versus a zero timeout."""

from __future__ import annotations

import psycopg
import pytest

from kenning import Client
from kenning.db import Database
from kenning.storage import timers as timers_sql
from kenning.storage.inbox import NewEvent, inbox_insert_events
from kenning_worker.inbox import InboxSettings
from tests.apps import core, events
from tests.support import ProcessPool, check_invariants, eventually, executions, running_worker


async def test_event_received_before_a_zero_timeout_wait_is_delivered_not_timed_out(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    async with database.connection() as conn:
        await inbox_insert_events(
            conn, [NewEvent(source="tests", event_id="r-1", event_type="reply.sent", data={"order_id": "o-5", "n": 7})]
        )
    async with Client(database=database) as client:
        # a worker that runs workflows but does not look at the inbox yet
        async with running_worker(database, core.app, inbox=InboxSettings(enabled=False)):
            started = await client.start(core.early_reply, order_id="o-5")

            def waiting() -> bool:
                row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (started.instance_id,))
                return row.fetchone() == ("waiting_for_event",)

            await eventually(waiting, timeout=10)
        # its timeout is due at once, but the reply is already in the inbox: a scheduler
        # pass now must leave the subscription to the worker's catch-up check
        async with database.connection() as conn:
            assert await timers_sql.subscription_timeout_fire_due(conn, limit=10) == []
        async with running_worker(database, core.app):
            assert await client.result(started.instance_id, timeout=15) == 7
    kinds = sql.execute("SELECT kind FROM kenning_history WHERE instance_id = %s", (started.instance_id,)).fetchall()
    assert kinds == [("EventReceived",)]
    check_invariants(sql)


@pytest.mark.parametrize("wait", ["event", "timer"])
async def test_a_cancel_during_the_step_before_a_wait_ends_cancelled_and_compensated(
    wait: str,
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
) -> None:
    """Issue 12.1: the cancel lands while the activity before ``wait_event`` runs; the
    suspend then finds it pending. Before the fix the suspend's row could not be read
    (two unnamed columns), the run failed and the instance ended ``failed``."""
    processes.worker(database_url, "tests.apps.events", env={"KENNING_TEST_SIDE_CHANNEL": side_channel})
    async with Client(database=database) as client:
        started = await client.start(events.reserves_slowly_then_waits, key=wait, wait=wait, seconds=1.5)
        instance_id = started.instance_id
        await eventually(lambda: executions(side_channel)[f"slow_step:{wait} {instance_id}"] == 1, timeout=30)
        assert await client.cancel(instance_id)
        await eventually(lambda: instance_status(sql, instance_id) in ("cancelled", "failed"), timeout=30)
    assert instance_status(sql, instance_id) == "cancelled"
    counts = executions(side_channel)
    assert counts[f"unreserve:{wait} {instance_id}"] == 1
    check_invariants(sql)


def instance_status(sql: psycopg.Connection[tuple[object, ...]], instance_id: str) -> str:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    return str(row[0]) if row else ""
