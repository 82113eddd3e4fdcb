"""kenning.db against a real PostgreSQL: statements on the pool commit on their own and
raise psycopg's errors, transactions commit or roll back as one, Kenning's statements run
inside a SQLAlchemy transaction, broken or interrupted connections are never handed out
again, an unreachable server fails a request at once, and the pool never opens more
connections than its size."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import errors
from psycopg_pool import PoolTimeout
from sqlalchemy import text

from kenning.db import Database, connect, executor_of, statement
from kenning.db.errors import is_unavailable, sqlstate
from kenning.storage import claims as claims_sql
from kenning.storage import instances as instances_sql
from tests.support import backend_pid, backend_pids_held_together

Sql = psycopg.Connection[tuple[object, ...]]
_BACKEND_PID = statement("SELECT pg_backend_pid() AS pid")


def small_pool(database: Database, size: int, *, timeout: float = 30.0) -> Database:
    return Database(url=database.url, autocommit_pool_size=size, pool_timeout=timeout)


def test_statements_take_psycopg_parameters_with_literal_percent_escaped() -> None:
    written = statement("SELECT CAST(:name AS text) LIKE 'a%' AS matched, CAST(:n AS int) AS n, x::int AS x")
    assert written.sql == "SELECT CAST(%(name)s AS text) LIKE 'a%%' AS matched, CAST(%(n)s AS int) AS n, x::int AS x"


async def test_each_statement_commits_and_rows_are_read_by_name(database: Database, sql: Sql) -> None:
    async with database.connection() as conn:
        await conn.execute(statement("CREATE TABLE raw_probe (id int PRIMARY KEY, note text)"))
        inserted = await conn.execute(
            statement("INSERT INTO raw_probe VALUES (1, :a), (2, :b) RETURNING id, note"), {"a": "x%", "b": None}
        )
        assert inserted.rowcount == 2
        assert [(r.id, r.note) for r in inserted] == [(1, "x%"), (2, None)]
        # committed at once: another session sees it while this connection is still held
        assert sql.execute("SELECT count(*) FROM raw_probe").fetchone() == (2,)
        assert (await conn.execute(statement("SELECT note FROM raw_probe WHERE note LIKE 'x%'"))).one().note == "x%"
        with pytest.raises(LookupError):
            (await conn.execute(statement("SELECT id FROM raw_probe"))).one()
        updated = await conn.execute(statement("UPDATE raw_probe SET note = 'y' WHERE id > 5"))
        assert updated.rowcount == 0 and updated.first() is None


async def test_database_errors_are_psycopgs_own(database: Database) -> None:
    async with database.connection() as conn:
        await conn.execute(statement("CREATE TABLE raw_unique (id int PRIMARY KEY)"))
        await conn.execute(statement("INSERT INTO raw_unique VALUES (1)"))
        with pytest.raises(errors.UniqueViolation) as duplicate:
            await conn.execute(statement("INSERT INTO raw_unique VALUES (1)"))
        assert sqlstate(duplicate.value) == "23505" and not is_unavailable(duplicate.value)
        # the failed statement rolled back on its own: the connection is usable
        assert (await conn.execute(statement("SELECT count(*) AS n FROM raw_unique"))).one().n == 1


async def test_a_transaction_commits_or_rolls_back_as_one(database: Database, sql: Sql) -> None:
    async with database.connection() as conn:
        await conn.execute(statement("CREATE TABLE raw_tx (id int PRIMARY KEY)"))
    async with database.transaction() as conn:
        await conn.execute(statement("INSERT INTO raw_tx VALUES (1)"))
        assert sql.execute("SELECT count(*) FROM raw_tx").fetchone() == (0,)  # not yet committed
        await conn.execute(statement("INSERT INTO raw_tx VALUES (2)"))
    assert sql.execute("SELECT count(*) FROM raw_tx").fetchone() == (2,)
    with pytest.raises(errors.UniqueViolation):
        async with database.transaction() as conn:
            await conn.execute(statement("INSERT INTO raw_tx VALUES (3)"))
            await conn.execute(statement("INSERT INTO raw_tx VALUES (1)"))
    assert sql.execute("SELECT count(*) FROM raw_tx").fetchone() == (2,)  # 3 rolled back with it


async def test_kenning_statements_run_inside_a_sqlalchemy_transaction(database: Database, sql: Sql) -> None:
    async with database.engine.connect() as user:
        transaction = await user.begin()
        await user.execute(text("CREATE TABLE raw_user (id int)"))
        conn = await executor_of(user)
        await instances_sql.instance_insert(
            conn, instance_id="i-sa", workflow_name="wf", source_hash="", input_json={}, idempotency_key=None
        )
        assert sql.execute("SELECT count(*) FROM kenning_instances").fetchone() == (0,)
        await transaction.rollback()  # the user's statement and Kenning's go together
    assert sql.execute("SELECT count(*) FROM kenning_instances").fetchone() == (0,)


async def test_a_connection_killed_under_a_statement_is_dropped_not_reused(database: Database, sql: Sql) -> None:
    db = small_pool(database, 1)
    try:
        victim = await backend_pid(db)
        sql.execute("SELECT pg_terminate_backend(%s)", (victim,))
        with pytest.raises(psycopg.OperationalError) as lost:
            async with db.connection() as conn:
                try:
                    await conn.execute(_BACKEND_PID)
                finally:
                    assert conn.driver.broken  # what the ingress checks before trying once more
        assert is_unavailable(lost.value)
        assert await backend_pid(db) != victim  # a fresh connection replaces it
    finally:
        await db.close_pool()


async def test_a_statement_cancelled_mid_flight_does_not_leave_a_busy_connection(database: Database) -> None:
    db = small_pool(database, 1)
    try:

        async def slow() -> None:
            async with db.connection() as conn:
                await conn.execute(statement("SELECT pg_sleep(5)"))

        task = asyncio.create_task(slow())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(3):  # not stuck behind the sleeping statement
            async with db.connection() as conn:
                assert (await conn.execute(statement("SELECT 7 AS seven"))).one().seven == 7
    finally:
        await db.close_pool()


async def test_the_pool_never_exceeds_its_size_and_times_out_waiters(database: Database) -> None:
    # Twelve users queue behind two connections: on a loaded machine a waiter may wait
    # seconds, so this pool's timeout is generous; the timeout itself is shown on a second
    # pool whose slots are all held, where nothing but the timeout can end the wait.
    db = small_pool(database, 2, timeout=30)
    try:
        pids: set[int] = set()

        async def use() -> None:
            async with db.connection() as conn:
                pids.add(int((await conn.execute(_BACKEND_PID)).one().pid))
                await conn.execute(statement("SELECT pg_sleep(0.05)"))

        await asyncio.gather(*(use() for _ in range(12)))
        assert len(pids) <= 2
    finally:
        await db.close_pool()
    impatient = small_pool(database, 2, timeout=0.3)
    try:
        async with impatient.connection(), impatient.connection():
            started = time.monotonic()
            with pytest.raises(PoolTimeout) as waited:
                async with impatient.connection():
                    pass
            assert time.monotonic() - started >= 0.25  # it waited (about) its timeout, then gave up
            assert is_unavailable(waited.value)
    finally:
        await impatient.close_pool()


async def test_an_unreachable_server_fails_each_request_at_once() -> None:
    db = connect("postgresql://postgres@127.0.0.1:1/nowhere")
    try:
        for _ in range(3):  # every request tries again, none waits for the pool timeout
            started = time.monotonic()
            with pytest.raises(psycopg.OperationalError) as refused:
                async with db.connection():
                    pass
            assert time.monotonic() - started < 5 and is_unavailable(refused.value)
    finally:
        await db.dispose()


async def test_a_waiter_cancelled_as_it_is_handed_a_connection_gives_it_back(database: Database) -> None:
    db = small_pool(database, 1, timeout=2)
    try:
        for turns in range(6):  # cancelled at different points of the hand-over
            holder = db.connection()
            await holder.__aenter__()

            async def wait_for_one() -> None:
                async with db.connection():
                    pass

            waiter = asyncio.create_task(wait_for_one())
            await asyncio.sleep(0.02)  # queued behind the holder
            await holder.__aexit__(None, None, None)  # hands the connection to the waiter...
            for _ in range(turns):
                await asyncio.sleep(0)
            waiter.cancel()  # ...which is cancelled before or after it runs again
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
            async with asyncio.timeout(1):  # the slot is not lost
                assert await backend_pid(db) > 0
    finally:
        await db.close_pool()


async def test_a_broken_connection_drops_the_idle_ones_too(database: Database, sql: Sql) -> None:
    db = small_pool(database, 3)
    try:
        old = await backend_pids_held_together(db, 3)
        assert len(old) == 3
        sql.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (list(old),))
        with pytest.raises(psycopg.OperationalError):
            await backend_pid(db)  # the first statement meets a dead connection
        assert await backend_pid(db) not in old  # the other two dead ones were dropped with it
        assert await backend_pid(db) not in old
    finally:
        await db.close_pool()


async def test_an_empty_claim_says_when_the_next_instance_becomes_claimable(database: Database) -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    async with database.connection() as conn:
        empty = await claims_sql.instance_claim(
            conn, owner="w", workflow_names=["later"], limit=5, lease_seconds=30, now=now
        )
        assert empty.instances == [] and empty.seconds_until_next is None  # nothing queued at all
        await conn.execute(
            statement(
                "INSERT INTO kenning_instances (id, workflow_name, available_at) VALUES ('i-later', 'later', :at)"
            ),
            {"at": now + timedelta(seconds=42)},
        )
        waiting = await claims_sql.instance_claim(
            conn, owner="w", workflow_names=["later"], limit=5, lease_seconds=30, now=now
        )
        assert waiting.instances == [] and waiting.seconds_until_next == pytest.approx(42)
        due = await claims_sql.instance_claim(
            conn, owner="w", workflow_names=["later"], limit=5, lease_seconds=30, now=now + timedelta(seconds=43)
        )
        assert [c.id for c in due.instances] == ["i-later"] and due.seconds_until_next is None


async def test_a_claim_that_took_some_says_when_the_next_becomes_claimable(database: Database) -> None:
    """A worker that claimed the instances due now wakes when the next comes due (a
    debounced burst's quiet period ending), not a poll interval later."""
    now = datetime(2030, 1, 1, tzinfo=UTC)
    async with database.connection() as conn:
        for instance_id, seconds in (("i-now", -1), ("i-soon", 0.2)):
            await conn.execute(
                statement("INSERT INTO kenning_instances (id, workflow_name, available_at) VALUES (:id, 'soon', :at)"),
                {"id": instance_id, "at": now + timedelta(seconds=seconds)},
            )
        claim = await claims_sql.instance_claim(
            conn, owner="w", workflow_names=["soon"], limit=5, lease_seconds=30, now=now
        )
        assert [c.id for c in claim.instances] == ["i-now"]
        assert claim.seconds_until_next == pytest.approx(0.2)


async def test_disposing_wakes_every_waiter_with_a_clear_error(database: Database) -> None:
    db = small_pool(database, 1, timeout=30)
    holder = db.connection()
    await holder.__aenter__()

    async def wait_for_one() -> None:
        async with db.connection():
            pass

    waiters = [asyncio.create_task(wait_for_one()) for _ in range(3)]
    await asyncio.sleep(0.05)
    await db.close_pool()
    async with asyncio.timeout(2):  # not the 30 s pool timeout
        outcomes = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(o, psycopg.OperationalError) and "closed" in str(o) for o in outcomes), outcomes
    await holder.__aexit__(None, None, None)
