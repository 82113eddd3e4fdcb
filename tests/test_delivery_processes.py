"""The event path with real processes only: ingress and worker processes sharing one
database, CloudEvents sent with the official SDK and with curl."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from kenning import Client
from kenning.db import Database
from tests.ingress_support import batch, binary, cloud_event, start_ingress, start_ingresses, structured
from tests.support import REPO_ROOT, ProcessPool, check_invariants, eventually

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


def _doc_commands() -> list[str]:
    """The curl commands of docs/ingress.md that post events, as written there."""
    text = (REPO_ROOT / "docs" / "ingress.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [b.strip() for b in blocks if b.lstrip().startswith("curl -i -X POST")]


@pytest.mark.smoke
async def test_the_curl_commands_of_the_docs_start_a_workflow_and_resume_it(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, tmp_path: Path
) -> None:
    commands = _doc_commands()
    assert len(commands) == 2 and shutil.which("curl")
    processes.worker(database_url, APP)
    ingress = start_ingress(processes, database_url)
    outputs = []
    for command in commands:
        shell = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            command.replace("http://localhost:8000", ingress.url),
            stdout=asyncio.subprocess.PIPE,
            cwd=tmp_path,
        )
        stdout, _ = await shell.communicate()
        assert shell.returncode == 0
        outputs.append(stdout.decode())
        if len(outputs) == 1:  # the order has started and waits for its payment
            await eventually(
                lambda: count(sql, "SELECT count(*) FROM kenning_instances WHERE status = 'waiting_for_event'") == 1
            )
    assert all(o.startswith("HTTP/1.1 202") for o in outputs), outputs
    assert '{"status":"accepted","source":"/shop","id":"order-1001","duplicate":false}' in outputs[0]
    row = sql.execute("SELECT id FROM kenning_instances WHERE workflow_name = 'order.placed'").fetchone()
    assert row is not None
    async with Client(database=database) as client:
        result = await client.result(str(row[0]), timeout=20)
    assert result == {"order_id": "1001", "amount": 30, "paid": 30, "payment_source": "/payments"}
    check_invariants(sql)
