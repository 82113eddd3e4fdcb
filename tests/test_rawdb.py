"""The psycopg autocommit pool against a real PostgreSQL: statements commit on their own,
errors arrive as SQLAlchemy's exception classes, broken or interrupted connections are
never handed out again, and the pool never opens more than its size."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError, MultipleResultsFound, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from kenning.db import Database
from kenning.rawdb import RawPool, compiled_sql
from kenning.storage import instances as instances_sql

Sql = psycopg.Connection[tuple[object, ...]]
_BACKEND_PID = text("SELECT pg_backend_pid()")


def test_statements_compile_to_psycopg_parameters_with_literal_percent_escaped() -> None:
    clause = text("SELECT CAST(:name AS text) LIKE 'a%' AS matched, CAST(:n AS int) AS n")
    assert compiled_sql(clause) == "SELECT CAST(%(name)s AS text) LIKE 'a%%' AS matched, CAST(%(n)s AS int) AS n"


async def test_each_statement_commits_and_rows_read_like_sqlalchemy_rows(database: Database, sql: Sql) -> None:
    async with database.autocommit.connect() as conn:
        await conn.execute(text("CREATE TABLE raw_probe (id int PRIMARY KEY, note text)"))
        inserted = await conn.execute(
            text("INSERT INTO raw_probe VALUES (1, :a), (2, :b) RETURNING id, note"), {"a": "x%", "b": None}
        )
        assert inserted.rowcount == 2
        rows = inserted.all()
        assert [(r.id, r.note) for r in rows] == [(1, "x%"), (2, None)] and rows[0][0] == 1
        # committed at once: another session sees it while this connection is still held
        assert sql.execute("SELECT count(*) FROM raw_probe").fetchone() == (2,)
        result = await conn.execute(text("SELECT id FROM raw_probe ORDER BY id"))
        assert result.scalar() == 1
        with pytest.raises(MultipleResultsFound):
            (await conn.execute(text("SELECT id FROM raw_probe"))).one()
        updated = await conn.execute(text("UPDATE raw_probe SET note = 'y' WHERE id > 5"))
        assert updated.rowcount == 0 and updated.first() is None


async def test_database_errors_arrive_as_sqlalchemy_exceptions(database: Database) -> None:
    async with database.autocommit.connect() as conn:
        await conn.execute(text("CREATE TABLE raw_unique (id int PRIMARY KEY)"))
        await conn.execute(text("INSERT INTO raw_unique VALUES (1)"))
        with pytest.raises(IntegrityError) as duplicate:
            await conn.execute(text("INSERT INTO raw_unique VALUES (1)"))
        assert getattr(duplicate.value.orig, "sqlstate", None) == "23505"
        # the failed statement rolled back on its own: the connection is usable
        assert (await conn.execute(text("SELECT count(*) FROM raw_unique"))).scalar() == 1


async def test_a_connection_killed_under_a_statement_is_dropped_not_reused(database: Database, sql: Sql) -> None:
    pool = RawPool(database.autocommit.url, 1)
    try:
        async with pool.connect() as conn:
            victim = (await conn.execute(_BACKEND_PID)).scalar()
        sql.execute("SELECT pg_terminate_backend(%s)", (victim,))
        with pytest.raises(DBAPIError) as lost:
            async with pool.connect() as conn:
                await conn.execute(_BACKEND_PID)
        assert lost.value.connection_invalidated
        async with pool.connect() as conn:  # a fresh connection replaces it
            assert (await conn.execute(_BACKEND_PID)).scalar() != victim
    finally:
        await pool.dispose()


async def test_a_statement_cancelled_mid_flight_does_not_leave_a_busy_connection(database: Database) -> None:
    pool = RawPool(database.autocommit.url, 1)
    try:

        async def slow() -> None:
            async with pool.connect() as conn:
                await conn.execute(text("SELECT pg_sleep(5)"))

        task = asyncio.create_task(slow())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(3):  # not stuck behind the sleeping statement
            async with pool.connect() as conn:
                assert (await conn.execute(text("SELECT 7"))).scalar() == 7
    finally:
        await pool.dispose()


async def test_the_pool_never_exceeds_its_size_and_times_out_waiters(database: Database, sql: Sql) -> None:
    pool = RawPool(database.autocommit.url, 2, timeout=0.3)
    try:
        pids: set[int] = set()

        async def use() -> None:
            async with pool.connect() as conn:
                pids.add(int((await conn.execute(_BACKEND_PID)).scalar()))
                await conn.execute(text("SELECT pg_sleep(0.05)"))

        await asyncio.gather(*(use() for _ in range(12)))
        assert len(pids) <= 2
        async with pool.connect(), pool.connect():
            with pytest.raises(PoolTimeoutError):
                async with pool.connect():
                    pass
    finally:
        await pool.dispose()


async def test_an_unreachable_server_is_an_operational_error() -> None:
    pool = RawPool("postgresql://postgres@127.0.0.1:1/nowhere", 1, connect_timeout=2)
    with pytest.raises(OperationalError):
        async with pool.connect():
            pass
    await pool.dispose()


async def test_an_empty_claim_says_when_the_next_instance_becomes_claimable(database: Database) -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    async with database.autocommit.connect() as conn:
        empty = await instances_sql.instance_claim(
            conn, owner="w", workflow_names=["later"], limit=5, lease_seconds=30, now=now
        )
        assert empty.instances == [] and empty.seconds_until_next is None  # nothing queued at all
        await conn.execute(
            text("INSERT INTO kenning_instances (id, workflow_name, available_at) VALUES ('i-later', 'later', :at)"),
            {"at": now + timedelta(seconds=42)},
        )
        waiting = await instances_sql.instance_claim(
            conn, owner="w", workflow_names=["later"], limit=5, lease_seconds=30, now=now
        )
        assert waiting.instances == [] and waiting.seconds_until_next == pytest.approx(42)
        due = await instances_sql.instance_claim(
            conn, owner="w", workflow_names=["later"], limit=5, lease_seconds=30, now=now + timedelta(seconds=43)
        )
        assert [c.id for c in due.instances] == ["i-later"] and due.seconds_until_next is None


async def test_a_waiter_cancelled_as_it_is_handed_a_connection_gives_it_back(database: Database) -> None:
    pool = RawPool(database.autocommit.url, 1, timeout=2)
    try:
        holder = pool.connect()
        await holder.__aenter__()

        async def wait_for_one() -> None:
            async with pool.connect():
                pass

        waiter = asyncio.create_task(wait_for_one())
        await asyncio.sleep(0.05)  # queued behind the holder
        await holder.__aexit__(None, None, None)  # hands the connection to the waiter...
        waiter.cancel()  # ...which is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await waiter
        async with asyncio.timeout(1):  # the slot is not lost
            async with pool.connect() as conn:
                assert (await conn.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await pool.dispose()


async def test_a_broken_connection_drops_the_idle_ones_too(database: Database, sql: Sql) -> None:
    pool = RawPool(database.autocommit.url, 3)
    try:

        async def pid() -> int:
            async with pool.connect() as conn:
                await conn.execute(text("SELECT pg_sleep(0.05)"))
                return int((await conn.execute(_BACKEND_PID)).scalar())

        old = set(await asyncio.gather(pid(), pid(), pid()))
        assert len(old) == 3
        sql.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (list(old),))
        with pytest.raises(DBAPIError):
            await pid()  # the first statement meets a dead connection
        assert await pid() not in old  # the other two dead ones were dropped with it
        assert await pid() not in old
    finally:
        await pool.dispose()


async def test_disposing_wakes_every_waiter_with_a_clear_error(database: Database) -> None:
    pool = RawPool(database.autocommit.url, 1, timeout=30)
    holder = pool.connect()
    await holder.__aenter__()

    async def wait_for_one() -> None:
        async with pool.connect():
            pass

    waiters = [asyncio.create_task(wait_for_one()) for _ in range(3)]
    await asyncio.sleep(0.05)
    await pool.dispose()
    async with asyncio.timeout(2):  # not the 30 s pool timeout
        outcomes = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(o, RuntimeError) and "closed" in str(o) for o in outcomes)
    await holder.__aexit__(None, None, None)
