"""The console's inbox links each event to the instances it started (an ``event_handler``
workflow) or woke (an instance waiting for it), and says when nothing received it. Against
a real ``kenning console`` and ``kenning worker`` on a real PostgreSQL."""

from __future__ import annotations

import html
import re

import httpx
import psycopg

from kenning.client import Client
from kenning.db import Database
from kenning.storage.inbox import NewEvent, inbox_insert_events
from tests.console_support import became, console_ready, spawn_console
from tests.support import ProcessPool, eventually

APP = "tests.apps.events"

Sql = psycopg.Connection[tuple[object, ...]]


def _row(page: str, inbox_id: int) -> str:
    found = re.search(rf'<tr id="inbox-{inbox_id}">(.*?)</tr>', page, re.S)
    assert found is not None, f"inbox row {inbox_id} is not on the page"
    return html.unescape(found[1])


def _inbox_id(sql: Sql, event_id: str) -> int:
    row = sql.execute("SELECT id FROM kenning_inbox WHERE event_id = %s", [event_id]).fetchone()
    assert row is not None
    return int(str(row[0]))


async def test_an_inbox_row_links_the_instances_it_started_or_woke(
    processes: ProcessPool, database: Database, database_url: str, sql: Sql, side_channel: str
) -> None:
    url, console = spawn_console(processes, database_url, app=APP)
    processes.worker(database_url, APP, env={"KENNING_TEST_SIDE_CHANNEL": side_channel})
    async with Client(database_url) as client:
        waiting = [(await client.start("waits_any")).instance_id for _ in range(2)]
    for instance_id in waiting:
        await became(sql, instance_id, "waiting_for_event")
    await console_ready(url, console)
    async with database.connection() as conn:
        await inbox_insert_events(
            conn,
            [
                NewEvent("/shop", "placed-1", "order.placed", {"specversion": "1.0"}, {"order_id": "o-1", "amount": 5}),
                NewEvent("/ops", "all-1", "test.broadcast", {"specversion": "1.0"}, {"n": 1}),
                NewEvent("/ops", "lost-1", "nobody.listens", {"specversion": "1.0"}, {"n": 2}),
            ],
        )
    await eventually(
        lambda: sql.execute("SELECT count(*) FROM kenning_inbox WHERE status = 'processed'").fetchone() == (3,),
        timeout=20,
        message="the three events delivered",
    )
    started = sql.execute("SELECT id FROM kenning_instances WHERE workflow_name = 'order.placed'").fetchall()
    assert len(started) == 1

    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        page = (await http.get("/events/inbox")).text

    placed = _row(page, _inbox_id(sql, "placed-1"))
    assert f'started</span> <a href="/instances/{started[0][0]}" data-started>' in placed
    broadcast = _row(page, _inbox_id(sql, "all-1"))
    for instance_id in waiting:
        assert f'woke</span> <a href="/instances/{instance_id}" data-woke>' in broadcast
    assert "data-started" not in broadcast
    lost = _row(page, _inbox_id(sql, "lost-1"))
    assert "no receiver" in lost and "data-woke" not in lost and "data-started" not in lost
    assert "no receiver" not in placed and "no receiver" not in broadcast
