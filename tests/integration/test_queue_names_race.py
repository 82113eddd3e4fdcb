"""Two starts of different workflows into one new queue at once both name their workflow
in it (kenning_queues.workflow_names), which is what workers claim by.

The first start's statement creates the queue row and has not committed; the second's
INSERT of the row waits for that commit and then does nothing, and its UPDATE adding its
workflow runs under the statement's snapshot, taken before that commit: it sees no row
and names nothing. Without the follow-up statement (queue_rows.queues_name) the second
workflow is never named in the queue, and a worker running only that workflow (not
declaring the queue) never claims its instance. The race is forced with an open
transaction, as in tests/integration/test_wake_races.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from kenning.core.names import CHANNEL_QUEUES
from kenning.core.records import NewInstance, StartOutcome
from kenning.db import Database, Executor, statement
from kenning.storage import children as children_sql
from kenning.storage import claims as claims_sql
from kenning.storage import instances as instances_sql
from tests.support import eventually

Sql = psycopg.Connection[tuple[object, ...]]

# A blocked statement must be seen blocked, and released, well within these
BLOCKED_WITHIN = 5.0
DONE_WITHIN = 5.0
QUEUE = "q-race"

_BACKEND_PID = statement("SELECT pg_backend_pid() AS pid")


async def _backend_pid(conn: Executor) -> int:
    return int((await conn.execute(_BACKEND_PID)).one().pid)


def _blocked_by(sql: Sql, holder: int) -> bool:
    """Whether some backend waits for ``holder`` (and for it only)."""
    rows = sql.execute(
        "SELECT pg_blocking_pids(pid) FROM pg_stat_activity WHERE datname = current_database()"
    ).fetchall()
    return any(blockers == [holder] for (blockers,) in rows)


def _workflow_names(sql: Sql) -> object:
    row = sql.execute("SELECT workflow_names FROM kenning_queues WHERE name = %s", (QUEUE,)).fetchone()
    assert row is not None
    return row[0]


async def _start_b(conn: Executor) -> None:
    (outcome,) = await instances_sql.instances_start(conn, [NewInstance("b-1", "wf-b", "h", {}, queue_name=QUEUE)])
    assert outcome is StartOutcome.STARTED


async def _parent_token(database: Database) -> str:
    """A claimed parent's lease token (the parent in no queue)."""
    async with database.connection() as conn:
        await instances_sql.instance_insert(
            conn, instance_id="p", workflow_name="parent", source_hash="h", input_json={}, idempotency_key=None
        )
        claim = await claims_sql.instance_claim(
            conn, owner="test-worker", workflow_names=["parent"], limit=1, lease_seconds=60
        )
    (parent,) = claim.instances
    return parent.lease_token


async def _child_start_b(conn: Executor, parent_token: str) -> None:
    """``wf-b`` started into the queue as the parent's child."""
    started = await children_sql.child_start_and_record(
        conn,
        parent_id="p",
        token=parent_token,
        step_id="start_child:1",
        step_name="start_child",
        child=NewInstance("b-1", "wf-b", "h", {}, queue_name=QUEUE),
        on_parent_cancel="cancel",
    )
    assert started is not None and started.recorded


@pytest.fixture
async def tasks() -> AsyncIterator[list[asyncio.Task[None]]]:
    """Tasks started while a transaction is held open; cancelled if the test left them."""
    started: list[asyncio.Task[None]] = []
    yield started
    for task in started:
        task.cancel()
    await asyncio.gather(*started, return_exceptions=True)


@pytest.mark.parametrize("second", ["start", "start_in_transaction", "child_start"])
async def test_two_workflows_started_into_one_new_queue_at_once_are_both_named_in_it(
    database: Database, sql: Sql, database_url: str, tasks: list[asyncio.Task[None]], second: str
) -> None:
    """T1 starts wf-a into the new queue and holds its transaction open; T2 starts wf-b
    into it (a start on an autocommit connection, one inside a transaction, or a child
    start, as the worker makes it, in a transaction): T2 waits for T1's row, T1
    commits, T2 ends. Both workflows are named, and workers were told both times."""
    listener = psycopg.connect(database_url, autocommit=True)
    try:
        listener.execute(f"LISTEN {CHANNEL_QUEUES}")

        parent_token = await _parent_token(database) if second == "child_start" else ""

        async def run_second() -> None:
            if second == "start":
                async with database.connection() as conn:
                    await _start_b(conn)
            elif second == "start_in_transaction":
                async with database.transaction() as conn:
                    await _start_b(conn)
            else:
                async with database.transaction() as conn:
                    await _child_start_b(conn, parent_token)

        async with database.transaction() as first:
            holder = await _backend_pid(first)
            (outcome,) = await instances_sql.instances_start(
                first, [NewInstance("a-1", "wf-a", "h", {}, queue_name=QUEUE)]
            )
            assert outcome is StartOutcome.STARTED
            tasks.append(asyncio.create_task(run_second()))
            await eventually(
                lambda: _blocked_by(sql, holder), timeout=BLOCKED_WITHIN, interval=0.01, message="T2 waits for T1"
            )
            assert not tasks[0].done()
        await asyncio.wait_for(tasks[0], DONE_WITHIN)

        assert _workflow_names(sql) == ["wf-a", "wf-b"]
        # one NOTIFY per naming transaction: T1's creation, then T2's naming of wf-b
        notices = list(listener.notifies(timeout=DONE_WITHIN, stop_after=2))
        assert [n.channel for n in notices] == [CHANNEL_QUEUES, CHANNEL_QUEUES]
    finally:
        listener.close()
