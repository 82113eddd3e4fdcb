"""A connection handed to a task in the same loop turn as a cancel reaches it (Python 3.11's
asyncio.wait_for, in psycopg_pool's wait, swallows that cancel): a failed pool connect's
cancel leaves nothing counted, so the next failure surfaces as the connect error, never as a
bare CancelledError escaping into a long-lived loop (a worker's, while the database is down);
anyone else's cancel (a shutdown's) is honoured, and the connection given back."""

from __future__ import annotations

import asyncio

import psycopg

from kenning.db import Database, connect, statement
from kenning.db.errors import is_unavailable
from tests.ingress_support import TcpProxy
from tests.support import eventually


def _queued(db: Database) -> int:
    return db.pool.get_stats().get("requests_queued", 0)


async def test_a_connect_failure_racing_a_hand_over_leaves_no_cancellation_behind(database_url: str) -> None:
    proxy = TcpProxy(database_url)  # the way to PostgreSQL, which the test cuts
    await proxy.start()
    db = connect(proxy.url, pool_size=1, max_overflow=0, pgbouncer="off")
    try:
        async with db.connection():  # opens the pool and its one connection
            pass
        # White-box: the pool's only connection taken out past Database's gate, so the next
        # acquisition passes the gate and queues in psycopg_pool itself, as a worker does
        # when every connection is busy.
        held = await db.pool.getconn()
        cancelling: list[int] = []
        served = asyncio.Event()
        down = asyncio.Event()

        async def loop_body() -> None:  # a long-lived task's turns: one served, one while the DB is down
            task = asyncio.current_task()
            assert task is not None
            async with db.connection():
                cancelling.append(task.cancelling())
            served.set()
            await down.wait()
            async with db.connection():
                pass

        queued = _queued(db)
        user = asyncio.create_task(loop_body())
        await eventually(lambda: _queued(db) > queued, message="the acquisition queued in the pool")
        # The race: the connection is handed to the waiter and, in the same loop turn
        # (before the waiter runs again), another connect of the pool fails, as a pool
        # worker's would (the white-box step: _connect_failed is what that worker calls).
        await db.pool.putconn(held)
        assert list(db._waiting) == [user]  # still waiting: the failure reaches it
        db._connect_failed(psycopg.OperationalError("a connect of the pool failed"))
        async with asyncio.timeout(10):
            await served.wait()  # it got the connection (Python 3.11's wait_for swallowed the cancel)

        await proxy.stop()  # the database goes away...
        await db.pool.drain()  # ...and the idle connection with it: the next acquisition connects
        down.set()
        async with asyncio.timeout(10):  # not the 30 s pool timeout
            (outcome,) = await asyncio.gather(user, return_exceptions=True)
        assert isinstance(outcome, psycopg.OperationalError) and is_unavailable(outcome), repr(outcome)
        assert cancelling == [0]  # nothing left counted after the won race
    finally:
        await db.dispose()
        await proxy.stop()


async def test_a_cancel_racing_a_hand_over_is_honoured_and_the_connection_given_back(database_url: str) -> None:
    db = connect(database_url, pool_size=1, max_overflow=0, pgbouncer="off")
    try:
        async with db.connection():  # opens the pool and its one connection
            pass
        held = await db.pool.getconn()  # white-box, as above: the next acquisition queues in the pool
        ran_on = asyncio.Event()

        async def shut_down_task() -> None:
            async with db.connection():
                ran_on.set()  # what a cancelled task must not do

        queued = _queued(db)
        user = asyncio.create_task(shut_down_task())
        await eventually(lambda: _queued(db) > queued, message="the acquisition queued in the pool")
        # The race: the connection is handed to the waiter and, in the same loop turn, the
        # task is cancelled (a shutdown): Python 3.11's wait_for swallows that cancel.
        await db.pool.putconn(held)
        user.cancel()
        async with asyncio.timeout(10):
            (outcome,) = await asyncio.gather(user, return_exceptions=True)
        assert isinstance(outcome, asyncio.CancelledError) and not ran_on.is_set()
        async with asyncio.timeout(5), db.connection() as conn:  # the connection and its slot came back
            assert (await conn.execute(statement("SELECT 1 AS one")))[0].one == 1
    finally:
        await db.dispose()
