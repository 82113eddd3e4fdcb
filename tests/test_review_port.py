"""The worker's port when the connection of an activity's own transaction dies (a
PostgreSQL restart, a terminated backend): Kenning's statements run on the psycopg
connection under SQLAlchemy's, so SQLAlchemy never sees the disconnect itself. The run
must end as the database being away (the instance handed back and resumed), never as
the workflow's failure."""

from __future__ import annotations

from collections import Counter

import psycopg

from kenning import App, Client, RetryPolicy, WorkflowContext, activity, workflow
from kenning.context import current_step
from kenning.db import Database
from kenning.outbox import send_event_transactional
from kenning_worker.port import StepTransaction
from tests.support import running_worker

app = App("kenning-review-port-tests")
CALLS: Counter[str] = Counter()
TARGET = {"url": ""}
ONCE = RetryPolicy(max_attempts=1)  # any attempt counted against it would fail the workflow


async def _terminate_own_backend() -> None:
    """End the server process under the current step's transaction."""
    step = current_step.get()
    assert isinstance(step, StepTransaction)
    raw = await (await step.connection()).get_raw_connection()
    driver = raw.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)
    async with await psycopg.AsyncConnection.connect(TARGET["url"], autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (driver.info.backend_pid,))


@activity(retry_policy=ONCE)
async def send_then_lose_connection(ctx: WorkflowContext) -> str:
    """The connection dies after the event is written: the step's record fails."""
    CALLS["record"] += 1
    event_id = await send_event_transactional(ctx, "review.sent", "/review", {"n": 1})
    if CALLS["record"] == 1:
        await _terminate_own_backend()
    return event_id


@activity(retry_policy=ONCE)
async def lose_connection_then_send(ctx: WorkflowContext) -> str:
    """The connection dies between two events: the attempt's second write fails."""
    CALLS["attempt"] += 1
    await send_event_transactional(ctx, "review.first", "/review", {"n": 1})
    if CALLS["attempt"] == 1:
        await _terminate_own_backend()
    return await send_event_transactional(ctx, "review.second", "/review", {"n": 2})


@workflow
async def review_connection_lost(ctx: WorkflowContext) -> list[str]:
    return [await send_then_lose_connection(ctx), await lose_connection_then_send(ctx)]


async def test_a_step_transaction_whose_connection_died_is_resumed_not_failed(
    database: Database, database_url: str, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    CALLS.clear()
    TARGET["url"] = database_url
    async with Client(database=database) as client, running_worker(database, app):
        started = await client.start(review_connection_lost)
        ids = await client.result(started.instance_id, timeout=20)
    assert CALLS == {"record": 2, "attempt": 2}
    rows = sql.execute(
        "SELECT CAST(id AS text), event_type FROM kenning_outbox WHERE instance_id = %s ORDER BY created_seq",
        (started.instance_id,),
    ).fetchall()
    # the attempts whose transaction died left nothing behind
    assert [t for _, t in rows] == ["review.sent", "review.first", "review.second"]
    assert [rows[0][0], rows[2][0]] == ids
