"""Kenning's sessions bound their silence (issue 33, item 2): the pool's sessions, which
run Kenning's statements only, are ended by the server when idle inside a transaction
past the bound; code of the user's that holds a transaction open for longer (an activity
idle in its ``ctx.session``, an ``on_event`` handler) is never ended by it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from kenning import Client
from kenning.db import Database, Executor, connect, executor_of, statement
from kenning.db.bounds import SessionBounds
from kenning.db.errors import is_unavailable
from kenning.db.listener import Listener
from kenning.storage import inbox as inbox_sql
from kenning.storage.inbox import NewEvent
from tests.apps import bounds as bounds_app
from tests.support import eventually, executions, running_worker

IDLE = 0.5  # the bound under test, seconds
LONGER = 1.5  # what user code takes inside its transaction
_SETTING = statement("SELECT current_setting(:name) AS value")


@pytest.fixture
async def bounded(database_url: str) -> AsyncIterator[Database]:
    db = connect(database_url, bounds=SessionBounds(idle_in_transaction=IDLE, lock=2.0, statement=30.0))
    yield db
    await db.dispose()


async def _setting(conn: Executor, name: str) -> str:
    return str((await conn.execute(_SETTING, {"name": name})).one().value)


async def test_the_pools_sessions_are_bounded_and_an_idle_transaction_is_ended(bounded: Database) -> None:
    async with bounded.connection() as conn:
        assert await _setting(conn, "idle_in_transaction_session_timeout") == "500ms"
        assert await _setting(conn, "lock_timeout") == "2s"
        assert await _setting(conn, "statement_timeout") == "30s"
    # ctx.session's sessions run user code: no idle, lock or statement bound of Kenning's
    async with bounded.engine.connect() as session:
        conn = await executor_of(session)
        assert await _setting(conn, "idle_in_transaction_session_timeout") == "0"
        assert await _setting(conn, "statement_timeout") == "0"
        await session.rollback()
    # a transaction of Kenning's left idle past the bound is ended by the server
    with pytest.raises(psycopg.Error, match="idle-in-transaction timeout") as ended:
        async with bounded.transaction() as conn:
            await _setting(conn, "lock_timeout")
            await asyncio.sleep(LONGER)
            await _setting(conn, "lock_timeout")
    assert is_unavailable(ended.value)  # a run in such a transaction hands its instance back


def _inbox(sql: psycopg.Connection[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return sql.execute("SELECT event_id, status, attempts FROM kenning_inbox ORDER BY event_id").fetchall()


async def test_user_code_idle_in_its_transaction_past_the_bound_is_not_ended(
    bounded: Database, sql: psycopg.Connection[tuple[object, ...]], side_channel: str
) -> None:
    async with Client(database=bounded) as client, running_worker(bounded, bounds_app.app):
        started = await client.start(bounds_app.idles_in_session, seconds=LONGER)
        async with bounded.connection() as conn:
            await inbox_sql.inbox_insert_events(
                conn,
                [
                    NewEvent("test", "e-1", "bounds.slow", {"specversion": "1.0"}, data={"seconds": LONGER}),
                    NewEvent("test", "e-2", "bounds.slow_session", {"specversion": "1.0"}, data={"seconds": LONGER}),
                ],
            )
        assert await client.result(started.instance_id, timeout=20) == 7
        await eventually(
            lambda: {row[1] for row in _inbox(sql)} == {"processed"}, timeout=20, message="both events processed"
        )
    assert _inbox(sql) == [("e-1", "processed", 1), ("e-2", "processed", 1)]
    counts = executions(side_channel)
    # each ran once: none was ended and run again
    assert (counts[f"idled {started.instance_id}"], counts["slow e-1"], counts["slow_session e-2"]) == (1, 1, 1)


def _listening_pid(sql: psycopg.Connection[tuple[object, ...]]) -> int | None:
    row = sql.execute(
        "SELECT pid FROM pg_stat_activity WHERE query = %s AND datname = current_database()", (f'LISTEN "{_CHANNEL}"',)
    ).fetchone()
    return None if row is None else int(str(row[0]))


_CHANNEL = "kenning_bounds_test"


async def test_a_listen_connection_quiet_for_longer_than_every_bound_stays(
    database_url: str, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    """A LISTEN connection is never in a transaction, and a live server answers its
    keepalives: however long it hears nothing, it is not dropped."""
    db = connect(database_url, bounds=SessionBounds(idle_in_transaction=IDLE, lock=IDLE, statement=IDLE, silence=2.0))
    heard: list[str] = []
    listener = Listener(db.listen_url, [_CHANNEL], heard.append, db.client_parameters)
    await listener.start()
    try:
        before = await eventually(lambda: _listening_pid(sql), message="listening")
        await asyncio.sleep(3 * 2.0)  # quiet for three silence bounds: what is under test
        heard.clear()
        sql.execute(f'NOTIFY "{_CHANNEL}"')
        await eventually(lambda: heard, message="the notification heard")
        assert _listening_pid(sql) == before  # the same session: never dropped and made again
    finally:
        await listener.stop()
        await db.dispose()
