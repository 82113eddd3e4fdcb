"""A debounced burst's instance runs when its quiet period ends, even when another run ends
on the worker meanwhile: the claim pass that run's end wakes keeps the wake-up the last
claim asked for, instead of falling back to the poll interval (here 30 s)."""

from __future__ import annotations

from kenning import Client, Debounce
from kenning.db import Database
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
