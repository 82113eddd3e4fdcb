"""Workflow timeouts through a real worker and scheduler (issue 29, item 2): at its
deadline an unfinished instance is cancelled by the scheduler, its compensations run and
it ends ``failed`` with ``WorkflowTimeoutError``; one that ends in time is left alone.

Before the feature, ``@workflow(timeout=...)`` did not exist: the app failed to import in
the worker and every test here failed (and, without the scheduler's firing, an instance
waiting for an event that never comes would wait for ever).
"""

from __future__ import annotations

import time

import psycopg
import pytest

from kenning import Client, WorkflowFailedError
from kenning.db import Database
from tests.apps import deadlines
from tests.logguard import expect_log
from tests.support import ProcessPool, check_invariants, eventually, executions, workers_started

APP = "tests.apps.deadlines"
Sql = psycopg.Connection[tuple[object, ...]]


async def _stack(processes: ProcessPool, database_url: str, side_channel: str) -> None:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    worker = processes.worker(database_url, APP, env=env)
    scheduler = processes.spawn(
        ["scheduler", "--no-migrate", "--poll-interval", "0.2"],
        env={"KENNING_DATABASE_URL": database_url},
        name="scheduler",
    )
    await workers_started(processes, [worker])
    await eventually(lambda: "scheduler.started" in processes.log_of(scheduler), message="scheduler started")


async def _fails_by_timeout(client: Client, instance_id: str) -> float:
    began = time.monotonic()
    with pytest.raises(WorkflowFailedError) as failed:
        await client.result(instance_id, timeout=20)
    assert failed.value.status == "failed"
    assert failed.value.error is not None
    assert failed.value.error["type"] == "kenning.errors.WorkflowTimeoutError", failed.value.error
    assert "timed out: its deadline" in str(failed.value.error["message"])
    return time.monotonic() - began


async def test_a_waiting_instance_fails_at_its_deadline_after_its_compensations(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    expect_log("instance.timed_out", workflow="awaiting_payment")
    await _stack(processes, database_url, side_channel)
    async with Client(database=database) as client:
        started = await client.start(deadlines.awaiting_payment, order_id="o-1")
        await _fails_by_timeout(client, started.instance_id)
    iid = started.instance_id
    counts = executions(side_channel)
    assert (counts[f"reserve_stock {iid}"], counts[f"release_stock {iid}"]) == (1, 1)
    row = sql.execute(
        "SELECT finished_at >= deadline_at, deadline_at - created_at FROM kenning_instances WHERE id = %s", (iid,)
    ).fetchone()
    assert row is not None and row[0] is True  # never early
    assert row[1].total_seconds() == pytest.approx(1.0)  # type: ignore[attr-defined]
    check_invariants(sql)


async def test_a_busy_instance_stops_at_its_next_step(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    expect_log("instance.timed_out", workflow="busy_at_deadline")
    await _stack(processes, database_url, side_channel)
    async with Client(database=database) as client:
        busy = await client.start(deadlines.busy_at_deadline, order_id="o-3")
        await _fails_by_timeout(client, busy.instance_id)
    counts = executions(side_channel)
    # the slow step ran out; the step after it never started; the first one was undone
    assert (counts[f"reserve_stock {busy.instance_id}"], counts[f"release_stock {busy.instance_id}"]) == (1, 1)
    check_invariants(sql)


async def test_an_instance_that_ends_in_time_is_left_alone(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    await _stack(processes, database_url, side_channel)
    async with Client(database=database) as client:
        started = await client.start(deadlines.in_time, order_id="o-4")
        assert await client.result(started.instance_id, timeout=20) == "done"
        row = sql.execute("SELECT deadline_at FROM kenning_instances WHERE id = %s", (started.instance_id,)).fetchone()
        assert row is not None and row[0] is not None
        # past its deadline, the scheduler fires nothing for a finished instance
        await eventually(
            lambda: sql.execute("SELECT now() > %s", (row[0],)).fetchone() == (True,), message="deadline passed"
        )
        assert (await client.status(started.instance_id)).status == "completed"


async def test_a_start_sets_its_own_timeout(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    expect_log("instance.timed_out", workflow="unbounded_order")
    await _stack(processes, database_url, side_channel)
    async with Client(database=database) as client:
        own = await client.start(deadlines.unbounded_order.options(timeout=0.5), order_id="o-2")
        await _fails_by_timeout(client, own.instance_id)
    assert executions(side_channel)[f"release_stock {own.instance_id}"] == 1
    check_invariants(sql)


async def test_a_child_takes_its_workflows_timeout(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    expect_log("instance.timed_out", workflow="awaiting_payment")
    await _stack(processes, database_url, side_channel)
    async with Client(database=database) as client:
        parent = await client.start(deadlines.parent_of_a_bounded_child, order_id="o-5")
        result = await client.result(parent.instance_id, timeout=20)
    assert result == "child failed: kenning.errors.WorkflowTimeoutError"
    child = sql.execute(
        "SELECT id, deadline_at - created_at FROM kenning_instances WHERE parent_id = %s", (parent.instance_id,)
    ).fetchone()
    assert child is not None and child[1].total_seconds() == pytest.approx(1.0)  # type: ignore[attr-defined]
    assert executions(side_channel)[f"release_stock {child[0]}"] == 1
    check_invariants(sql)
