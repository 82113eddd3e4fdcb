"""A fleet on two versions of the app (issue 25, item 1): a rolling deploy or a canary
runs workers whose apps differ in their ``event_handler`` workflows and ``on_event``
handlers. Whichever worker claims an event, every receiver any running version declared
gets it once; events that arrive while only old workers run wait for a new one; an event
nothing receives is marked, counted and logged once per type."""

from __future__ import annotations

import asyncio
import signal

import httpx
import psutil
import psycopg

from kenning.db import Database
from tests.ingress_support import binary, cloud_event, new_id, start_ingress
from tests.metrics_support import scrape_until, value
from tests.support import ProcessPool, check_invariants, eventually, executions, free_port, workers_started

OLD, NEW = "tests.apps.versions_old", "tests.apps.versions_new"


async def _post(client: httpx.AsyncClient, url: str, event_type: str, data: dict[str, str]) -> None:
    headers, body = binary(cloud_event(event_type, data, id=new_id()))
    response = await client.post(url, headers=headers, content=body)
    assert response.status_code == 202, response.text


def _count(sql: psycopg.Connection[tuple[object, ...]], query: str) -> int:
    row = sql.execute(query).fetchone()
    return int(str(row[0])) if row else 0


async def test_every_receiver_of_any_version_gets_each_event_once(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
) -> None:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    metrics_port = free_port()
    old = processes.worker(database_url, OLD, "--metrics-port", str(metrics_port), env=env)
    new = processes.worker(database_url, NEW, env=env)
    await workers_started(processes, [old, new])
    ingress = start_ingress(processes, database_url)
    parcels = "SELECT count(*) FROM kenning_instances WHERE workflow_name = 'parcel.registered'"

    def audits() -> int:
        return sum(n for line, n in executions(side_channel).items() if line.startswith("audit "))

    # both versions running: the old worker claims as eagerly as the new one, yet every
    # event reaches the receivers only the new version has
    async with httpx.AsyncClient(timeout=30) as client:
        for n in range(40):
            await _post(client, ingress.url, "parcel.registered", {"parcel": f"p{n}"})
            await _post(client, ingress.url, "audit.logged", {"entry": f"e{n}"})
        await eventually(lambda: _count(sql, parcels) == 40 and audits() == 40, timeout=60, message="all received")
        assert "no_receiver" not in processes.log_of(old)

        # only the old version runs (the new one stopped mid-deploy): the events wait
        new.send_signal(signal.SIGTERM)
        assert new.wait(timeout=30) == 0
        for n in range(40, 50):
            await _post(client, ingress.url, "parcel.registered", {"parcel": f"p{n}"})
            await _post(client, ingress.url, "audit.logged", {"entry": f"e{n}"})
        # events nothing receives: processed by the old worker, marked, logged once
        for n in range(3):
            await _post(client, ingress.url, "nobody.listens", {"n": str(n)})
        unreceived = "SELECT count(*) FROM kenning_inbox WHERE no_receiver AND event_type = 'nobody.listens'"
        await eventually(lambda: _count(sql, unreceived) == 3, message="marked no receiver")
        pending = "SELECT count(*) FROM kenning_inbox WHERE status = 'pending' AND event_type <> 'nobody.listens'"
        assert _count(sql, pending) == 20  # left, never consumed by a worker that lacks their receivers
        assert (_count(sql, parcels), audits()) == (40, 40)
        assert processes.log_of(old).count('"event.no_receiver"') == 1
        figures = await scrape_until(
            f"http://127.0.0.1:{metrics_port}/metrics",
            lambda f: value(f, "kenning_events_no_receiver_total", event_type="nobody.listens") == 3,
            "no-receiver events counted",
        )
        assert value(figures, "kenning_events_no_receiver_total", event_type="nobody.listens") == 3

        # a worker of the new version comes up: the events that waited are received once
        again = processes.worker(database_url, NEW, env=env)
        await workers_started(processes, [again])
        await eventually(lambda: _count(sql, parcels) == 50 and audits() == 50, timeout=60, message="caught up")
    lines = executions(side_channel)
    assert all(lines[f"audit e{n}"] == 1 for n in range(50)), lines
    # an on_event handler runs before its row is marked processed: the last mark may lag its record
    unprocessed = "SELECT count(*) FROM kenning_inbox WHERE status <> 'processed'"
    await eventually(lambda: _count(sql, unprocessed) == 0, message="every inbox row processed")
    await eventually(
        lambda: _count(sql, "SELECT count(*) FROM kenning_instances WHERE status <> 'completed'") == 0,
        message="parcels done",
    )
    check_invariants(sql)
    assert isinstance(old, psutil.Popen) and old.poll() is None
    await asyncio.sleep(0)
