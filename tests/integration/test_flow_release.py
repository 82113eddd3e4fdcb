"""A debounced burst's instance runs when its quiet period ends, even when another run ends
on the worker meanwhile: the claim pass that run's end wakes keeps the wake-up the last
claim asked for, instead of falling back to the poll interval (here 30 s)."""

from __future__ import annotations

import asyncio

from kenning import Client, Debounce
from kenning.db import Database
from kenning.storage import flow as flow_sql
from tests.apps import flow as flow_app
from tests.support import running_worker

POLL = 30.0  # a wake-up left to the poll would blow the result's deadline


async def test_a_burst_due_after_another_run_ends_is_released_without_waiting_for_the_poll(
    database: Database,
) -> None:
    debounced = flow_app.save_document.options(debounce=Debounce(key="document_id", period=0.6))
    async with Client(database=database) as client, running_worker(database, flow_app.app, poll_interval=POLL):
        quick = await client.start(flow_app.flow_quick, seconds=0.2)
        burst = await client.start(debounced, document_id="soon", version=1)
        assert await client.result(quick, timeout=10) == 0.2
        assert await client.result(burst, timeout=10) == {"document_id": "soon", "version": 1}


async def test_a_burst_that_never_goes_quiet_runs_at_its_max_wait(database: Database) -> None:
    """Starts every 0.2 s never leave the key quiet for 1 s: the burst runs 1.5 s after its
    first start all the same, with the input of its last start by then; the starts after
    it open the next burst."""
    chatty = flow_app.save_document.options(debounce=Debounce(key="document_id", period=1.0, max_wait=1.5))
    async with Client(database=database) as client, running_worker(database, flow_app.app):
        first = await client.start(chatty, document_id="chatty", version=0)
        joined = [first]
        for version in range(1, 101):  # 20 s at most
            await asyncio.sleep(0.2)
            status = (await client.status(first.instance_id)).status
            if status == "completed":
                break
            joined.append(await client.start(chatty, document_id="chatty", version=version))
        assert status == "completed", "the burst never ran while its key kept chattering"
        result = await client.result(first, timeout=10)
        in_first = [s for s in joined if s.instance_id == first.instance_id]
        assert result == {"document_id": "chatty", "version": len(in_first) - 1}  # its last start's input
        later = await client.start(chatty, document_id="chatty", version=-1)
        assert later.instance_id != first.instance_id


async def test_concurrent_starts_of_one_key_from_two_clients_are_one_burst(database_url: str) -> None:
    """Two clients (two pools: starts in concurrent transactions) start one key 40 times at
    once: the key's lock makes them join one at a time, so all are one instance, opened by
    exactly one of them, every start counted once."""
    slow = flow_app.save_document.options(debounce=Debounce(key="document_id", period=30))
    async with Client(database_url) as one, Client(database_url) as two:
        started = await asyncio.gather(
            *((one if n % 2 else two).start(slow, document_id="contended", version=n) for n in range(40))
        )
        assert len({s.instance_id for s in started}) == 1
        assert sum(s.created for s in started) == 1
        async with one.database.connection() as conn:
            burst = await flow_sql.burst_get(conn, started[0].instance_id)
    assert burst is not None and burst.folded == 40 and burst.open
