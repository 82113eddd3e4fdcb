"""A client's starts wake the workers with few NOTIFYs (``kenning.starting.Starter``):
every listening worker pays a transaction per NOTIFY it receives, so a burst of
group-committed starts is announced at most once per spacing, plus once at its end; a
start alone in its batch is announced at once, and ``close`` announces what is left."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import psycopg

from kenning import Client
from kenning.core.names import CHANNEL_INSTANCES
from kenning.db import Database
from tests.apps import core
from tests.support import eventually, running_worker

Sql = psycopg.Connection[tuple[object, ...]]
STARTERS = 16  # concurrent callers, as the throughput bench's


@contextlib.asynccontextmanager
async def notifications(url: str) -> AsyncIterator[list[float]]:
    """The times the NOTIFYs of CHANNEL_INSTANCES arrive on a LISTEN connection of its own."""
    received: list[float] = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(f'LISTEN "{CHANNEL_INSTANCES}"')

        async def collect() -> None:
            async for _ in conn.notifies():
                received.append(time.monotonic())

        task = asyncio.create_task(collect())
        try:
            yield received
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def burst(client: Client, starts: int) -> None:
    """``starts`` starts by STARTERS concurrent callers: batches of several starts each."""
    queue = list(range(starts))

    async def caller() -> None:
        while queue:
            await client.start(core.three_steps, value=queue.pop())

    await asyncio.gather(*(caller() for _ in range(STARTERS)))


async def test_a_burst_of_starts_is_announced_once_not_once_per_insert(database: Database, database_url: str) -> None:
    async with notifications(database_url) as received:
        async with Client(database=database) as client:
            await client.start(core.three_steps, value=0)  # alone in its batch: announced at once
            await eventually(lambda: len(received) == 1)
            client.starter.announce_spacing = 60.0  # longer than the burst
            await burst(client, 160)
            inserts = client.starts.statements - 1
            await asyncio.sleep(0.2)  # NOTIFYs take a moment to arrive
            during = len(received) - 1
        # close() announced the starts the spacing held back
        await eventually(lambda: len(received) == during + 2, message=f"{during} NOTIFYs in the burst")
    assert inserts >= 5, f"the burst took {inserts} inserts: no batches to speak of"
    assert during <= 1, f"{during} NOTIFYs for {inserts} inserts of a burst"


async def test_the_end_of_a_burst_is_announced_after_the_spacing(database: Database, database_url: str) -> None:
    async with notifications(database_url) as received, Client(database=database) as client:
        client.starter.announce_spacing = 2.0  # longer than the burst
        await burst(client, 64)
        ended = time.monotonic()
        await eventually(lambda: received and received[-1] > ended, timeout=5)
        # one NOTIFY after the burst: the later inserts carry none, however many there were
        assert sum(1 for at in received if at > ended) == 1


async def test_a_lone_start_wakes_the_workers_at_once(database: Database, database_url: str) -> None:
    async with notifications(database_url) as received, Client(database=database) as client:
        client.starter.announce_spacing = 60.0
        for n in range(1, 4):  # one caller, one start at a time: each one's NOTIFY at once
            await client.start(core.three_steps, value=n)
            await eventually(lambda: len(received) >= n, timeout=5)  # noqa: B023 (awaited at once)


async def test_a_worker_runs_a_burst_without_waiting_for_its_poll(database: Database, sql: Sql) -> None:
    def completed() -> bool:
        return sql.execute("SELECT count(*) FROM kenning_instances WHERE status = 'completed'").fetchone() == (101,)

    async with running_worker(database, core.app, poll_interval=60.0), Client(database=database) as client:
        client.starter.announce_spacing = 0.05
        await client.start(core.three_steps, value=0)
        await burst(client, 100)
        await eventually(completed, timeout=10)
