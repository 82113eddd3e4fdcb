"""The event path with real processes only: ingress and worker processes sharing one
database, CloudEvents sent with the official SDK (docs/ingress.md's curl commands run in
tests/system/test_docs.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import psycopg

from tests.ingress_support import batch, binary, cloud_event, start_ingresses, structured
from tests.support import ProcessPool, check_invariants, eventually

Sql = psycopg.Connection[tuple[object, ...]]
APP = "tests.apps.events"
EVENTS = 1000


def count(sql: Sql, query: str) -> int:
    row = sql.execute(query).fetchone()
    assert row is not None
    return int(str(row[0]))


async def test_two_ingress_and_two_worker_processes_deliver_1000_events_once(
    database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    workers = [processes.worker(database_url, APP, "--concurrency", "32") for _ in range(2)]
    ingresses = start_ingresses(processes, database_url, ["--workers", "2"], [])
    events = [cloud_event("bulk.item", {"n": n}, source="bulk", id=f"item-{n}") for n in range(EVENTS)]
    requests: list[tuple[dict[str, str], bytes]] = []
    requests += [binary(e) for e in events[:100]]
    requests += [structured(e) for e in events[100:200]]
    requests += [batch(events[i : i + 50]) for i in range(200, EVENTS, 50)]
    limit = asyncio.Semaphore(8)

    async with httpx.AsyncClient(timeout=60) as http:

        async def send(position: int, request: tuple[dict[str, str], bytes]) -> dict[str, Any]:
            url = ingresses[position % 2].url
            async with limit:
                response = await http.post(f"{url}/events", headers=request[0], content=request[1])
            assert response.status_code == 202, response.text
            answer: dict[str, Any] = response.json()
            return answer

        answers = await asyncio.gather(*(send(i, r) for i, r in enumerate(requests)))
        assert sum(1 if "id" in a else a["accepted"] for a in answers) == EVENTS
        assert all(a.get("duplicate") is False or a.get("duplicates") == 0 for a in answers)
        # the broker retries some through the other ingress: acknowledged, not stored again
        again = [binary(e) for e in events[:10]] + [batch(events[i : i + 50]) for i in (200, 950)]
        answers = await asyncio.gather(*(send(i + 1, r) for i, r in enumerate(again)))
        assert [a.get("duplicate", a.get("duplicates")) for a in answers] == [True] * 10 + [50, 50]

    await eventually(
        lambda: count(sql, "SELECT count(*) FROM kenning_instances WHERE status = 'completed'") == EVENTS,
        timeout=120,
        message=f"{EVENTS} instances completed",
    )
    assert count(sql, "SELECT count(*) FROM kenning_inbox") == EVENTS
    assert count(sql, "SELECT count(*) FROM kenning_inbox WHERE status = 'processed' AND attempts = 1") == EVENTS
    assert count(sql, "SELECT count(*) FROM kenning_instances") == EVENTS
    assert count(sql, "SELECT count(DISTINCT idempotency_key) FROM kenning_instances") == EVENTS
    results = sql.execute("SELECT result ->> 'result' FROM kenning_instances").fetchall()
    assert sorted(int(str(r)) for (r,) in results) == list(range(EVENTS))
    for worker in workers:
        assert '"inbox.started"' in processes.log_of(worker)
    check_invariants(sql)
