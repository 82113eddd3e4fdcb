"""The worker's port when the connection of an activity's own transaction dies (a
PostgreSQL restart, a terminated backend): Kenning's statements run on the psycopg
connection under SQLAlchemy's, so SQLAlchemy never sees the disconnect itself. The run
must end as the database being away (the instance handed back and resumed), never as
the workflow's failure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import psycopg
import pytest
from sqlalchemy import text

from kenning import App, Client, RetryPolicy, WorkflowContext, activity, workflow
from kenning.context import current_step
from kenning.core.names import ACTIVITY_COMPLETED
from kenning.db import Database
from kenning.db.errors import may_be_one_callers_fault
from kenning.db.groupcommit import GroupCommit
from kenning.engine.commands import RecordStep
from kenning.engine.history import StepRecord
from kenning.engine.outcomes import RunOutcome
from kenning.engine.run import WorkflowRun
from kenning.errors import LeaseLostError, NonDeterminismError, UnstorableValueError
from kenning.outbox import send_event_transactional
from kenning.storage import claims as claims_sql
from kenning.storage import instances as instances_sql
from kenning.storage import writes as writes_sql
from kenning.storage.writes import InstanceWrite
from kenning_worker.port import PgInstancePort, StepTransaction
from tests.logguard import expect_log
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


async def test_a_step_transaction_is_rolled_back_when_the_write_before_its_record_fails(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    """The deferred record written before the step's own fails (here: the lease was
    lost): the step's transaction, with its ctx.session writes and row locks, ends too."""

    async def apply(writes: Sequence[InstanceWrite]) -> list[bool | None]:
        async with database.connection() as conn:
            return await writes_sql.writes_apply(conn, writes)

    async with database.transaction() as conn:
        await instances_sql.instance_insert(
            conn, instance_id="i", workflow_name="wf", source_hash="h", input_json={}, idempotency_key=None
        )
        (claimed,) = (
            await claims_sql.instance_claim(conn, owner="a", workflow_names=["wf"], limit=1, lease_seconds=30)
        ).instances
    port = PgInstancePort(
        database=database, claimed=claimed, writes=GroupCommit(write=apply, retry_alone=may_be_one_callers_fault)
    )
    # a record held back, of a shape written on its own (it clears attempts)
    await port.record_step(RecordStep(StepRecord("a:1", ACTIVITY_COMPLETED, "a", {}, clear_attempts=True), defer=True))
    sql.execute("UPDATE kenning_instances SET lease_token = gen_random_uuid() WHERE id = 'i'")
    step = port.open_step()
    await step.session.execute(text("SELECT 1 FROM kenning_instances WHERE id = 'i' FOR UPDATE"))
    with pytest.raises(LeaseLostError):
        await port.record_step(RecordStep(StepRecord("b:1", ACTIVITY_COMPLETED, "b", {})), step)
    assert not step.in_transaction
    # the row lock went with it
    sql.execute("SELECT 1 FROM kenning_instances WHERE id = 'i' FOR UPDATE NOWAIT")


@workflow
async def review_plain(ctx: WorkflowContext) -> str:
    return "done"


async def test_a_control_signal_escaping_a_run_is_logged_and_the_instance_handed_back(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine bug that lets a control signal out of ``WorkflowRun.run`` must not end the
    run's task unseen (asyncio's 'exception was never retrieved'): it is a crashed run,
    logged, and the instance is handed back at once (with a 60 s lease, only that release
    lets the instance complete within the test)."""
    expect_log("instance.run_crashed")
    original = WorkflowRun.run
    escaped: list[str] = []

    async def escapes_once(self: WorkflowRun) -> RunOutcome:
        if not escaped:
            escaped.append(self.instance_id)
            raise NonDeterminismError("escaped run()")
        return await original(self)

    monkeypatch.setattr(WorkflowRun, "run", escapes_once)
    async with Client(database=database) as client, running_worker(database, app, lease_seconds=60.0):
        started = await client.start(review_plain)
        assert await client.result(started.instance_id, timeout=15) == "done"
    assert escaped == [started.instance_id]


async def test_a_value_over_a_program_limit_is_the_steps_unstorable_value(database: Database) -> None:
    """A payload too large for jsonb (SQLSTATE 54000, program limit exceeded) is refused on
    every try, as a data exception is: the step's ``UnstorableValueError``, not a crash."""
    async with database.transaction() as conn:
        await instances_sql.instance_insert(
            conn, instance_id="big", workflow_name="wf", source_hash="h", input_json={}, idempotency_key=None
        )
        (claimed,) = (
            await claims_sql.instance_claim(conn, owner="a", workflow_names=["wf"], limit=1, lease_seconds=30)
        ).instances

    async def apply(writes: Sequence[InstanceWrite]) -> list[bool | None]:
        raise psycopg.errors.ProgramLimitExceeded(
            "total size of jsonb array elements exceeds the maximum of 268435455 bytes"
        )

    port = PgInstancePort(
        database=database, claimed=claimed, writes=GroupCommit(write=apply, retry_alone=may_be_one_callers_fault)
    )
    await port.record_step(RecordStep(StepRecord("big:1", ACTIVITY_COMPLETED, "big", {"result": "..."}), defer=True))
    with pytest.raises(UnstorableValueError, match="jsonb"):
        await port.flush()
