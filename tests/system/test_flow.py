"""Flow control per key through real processes (issue 35, items 1 and 2): debounced starts
from ``Client.start`` and from CloudEvents through a real ingress are one instance per
burst, run with the burst's last input; an event handler's batches hold every event once,
in arrival order."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import httpx
import psycopg

import tests.apps.flow as flow_app
from kenning import Client, Debounce
from kenning.db import Database
from tests.console_support import console_ready, spawn_console
from tests.ingress_support import binary, cloud_event, start_ingress
from tests.metrics_support import scrape, value
from tests.support import (
    REPO_ROOT,
    ProcessPool,
    check_invariants,
    eventually,
    free_port,
    kenning_command,
    workers_started,
)

APP = "tests.apps.flow"
Sql = psycopg.Connection[tuple[object, ...]]


def _rows(sql: Sql, query: str, *params: object) -> list[tuple[object, ...]]:
    return sql.execute(query, params).fetchall()


async def test_a_burst_of_client_starts_is_one_instance_with_the_last_input(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    worker = processes.worker(database_url, APP)
    await workers_started(processes, [worker])
    async with Client(database=database) as client:
        firsts = await asyncio.gather(
            client.start(flow_app.save_document, document_id="a", version=0),
            client.start(flow_app.save_document, document_id="b", version=0),
        )
        later_a = [await client.start(flow_app.save_document, document_id="a", version=v) for v in range(1, 8)]
        later_b = [await client.start(flow_app.save_document, document_id="b", version=v) for v in range(1, 3)]
        # a per-start override: another key field, its own burst
        other = await client.start(
            flow_app.save_document.options(debounce=Debounce(key="version", period=0.2)), document_id="c", version=42
        )
        assert [s.created for s in firsts] == [True, True]
        assert {s.instance_id for s in later_a} == {firsts[0].instance_id}  # each caller learns the one it joined
        assert {s.instance_id for s in later_b} == {firsts[1].instance_id}
        assert not any(s.created for s in later_a + later_b)
        assert await client.result(firsts[0], timeout=60) == {"document_id": "a", "version": 7}
        assert await client.result(firsts[1], timeout=60) == {"document_id": "b", "version": 2}
        assert await client.result(other, timeout=60) == {"document_id": "c", "version": 42}
        # the key quiet and its instance run: the next start is a new burst
        again = await client.start(flow_app.save_document, document_id="a", version=8)
        assert again.created and again.instance_id != firsts[0].instance_id
        assert await client.result(again, timeout=60) == {"document_id": "a", "version": 8}
    instances = _rows(sql, "SELECT count(*) FROM kenning_instances WHERE workflow_name = 'save_document'")
    assert instances == [(4,)]
    folded = _rows(sql, "SELECT flow_key, folded FROM kenning_bursts WHERE kind = 'debounce' ORDER BY opened_at")
    assert sorted(folded, key=str) == sorted([("a", 8), ("b", 3), ("42", 1), ("a", 1)], key=str)


async def test_debounced_cloudevents_through_the_ingress_start_one_instance_per_key(
    database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    worker = processes.worker(database_url, APP)
    ingress = start_ingress(processes, database_url)
    await workers_started(processes, [worker])
    with httpx.Client(timeout=10) as http:
        for n in range(6):
            for doc in ("x", "y") if n < 3 else ("x",):
                headers, body = binary(cloud_event("doc.edited", {"doc": doc, "n": n}))
                assert http.post(f"{ingress.url}/", headers=headers, content=body).status_code == 202

    def finished() -> bool:
        done = _rows(
            sql, "SELECT count(*) FROM kenning_instances WHERE workflow_name = 'doc.edited' AND status = 'completed'"
        )
        return done == [(2,)]

    await eventually(finished, timeout=60, message="one instance per document")
    results = _rows(sql, "SELECT result FROM kenning_instances WHERE workflow_name = 'doc.edited'")
    by_doc = {r[0]["result"]["doc"]: r[0]["result"] for r in results if isinstance(r[0], dict)}
    assert by_doc == {"x": {"doc": "x", "n": 5}, "y": {"doc": "y", "n": 2}}  # each burst's last event
    pending = _rows(sql, "SELECT count(*) FROM kenning_inbox WHERE status <> 'processed'")
    assert pending == [(0,)]  # every accepted event was taken, folded into its burst
    folded = _rows(sql, "SELECT flow_key, folded, cardinality(seqs) FROM kenning_bursts ORDER BY flow_key")
    assert folded == [("x", 6, 6), ("y", 3, 3)]
    check_invariants(sql)  # each event accounted for: in exactly one burst


async def test_batches_hold_every_event_once_in_arrival_order(
    database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    port = free_port()
    worker = processes.worker(database_url, APP, "--metrics-port", str(port))
    ingress = start_ingress(processes, database_url)
    await workers_started(processes, [worker])
    sent: dict[str, list[int]] = {"t1": [], "t2": []}
    with httpx.Client(timeout=10) as http:
        for n in range(15):
            tenant = "t2" if n % 5 == 4 else "t1"
            sent[tenant].append(n)
            headers, body = binary(cloud_event("reading.taken", {"tenant": tenant, "n": n}))
            assert http.post(f"{ingress.url}/", headers=headers, content=body).status_code == 202

    def batched() -> list[list[dict[str, Any]]] | None:
        rows = _rows(
            sql,
            "SELECT status, result FROM kenning_instances WHERE workflow_name = 'reading.taken' ORDER BY created_at",
        )
        if any(status != "completed" for status, _ in rows):
            return None
        batches = [r["result"] for _, r in rows if isinstance(r, dict)]
        return batches if sum(len(b) for b in batches) == 15 else None

    await eventually(lambda: batched() is not None, timeout=60, message="every event in a finished batch")
    batches = batched()
    assert batches is not None
    for batch in batches:
        assert 1 <= len(batch) <= 5
        tenants = {event["tenant"] for event in batch}
        assert len(tenants) == 1  # one key per batch
        numbers = [event["n"] for event in batch]
        assert numbers == sorted(numbers)  # arrival order
    for tenant, numbers in sent.items():
        got = sorted(e["n"] for b in batches for e in b if e["tenant"] == tenant)
        assert got == numbers  # none in two batches, none in no batch
    check_invariants(sql)  # each event in one batch, each batch its events' data in inbox order
    counted = await scrape(f"http://127.0.0.1:{port}/metrics")  # the worker counts what it folded
    folded = "kenning_folded_starts_total"
    assert value(counted, folded, kind="batch", outcome="opened") == len(batches)
    assert value(counted, folded, kind="batch", outcome="joined") == 15 - len(batches)


async def test_kenning_start_joins_a_burst_and_kenning_why_says_what_it_waits_for(database_url: str) -> None:
    # no worker: the burst stays open, its instance pending until a worker runs its workflow
    def start(version: int) -> dict[str, Any]:
        done = kenning_command(
            "start",
            "save_draft",
            "--app",
            APP,
            "--json",
            "--input",
            json.dumps({"document_id": "cli", "version": version}),
            url=database_url,
        )
        assert done.returncode == 0, done.stderr
        outcome: dict[str, Any] = json.loads(done.stdout)
        return outcome

    first, second = start(1), start(2)
    assert first["created"] and not second["created"]
    assert second["instance_id"] == first["instance_id"]
    why = kenning_command("why", first["instance_id"], url=database_url)
    assert why.returncode == 0, why.stderr
    assert "debouncing key 'cli' (2 start(s) folded)" in why.stdout
    assert "debounced key 'cli': 2 start(s)" in why.stdout
    explained = json.loads(kenning_command("why", first["instance_id"], "--json", url=database_url).stdout)
    assert explained["burst"]["kind"] == "debounce" and explained["burst"]["folded"] == 2
    refused = kenning_command(
        "start", "save_document", "--app", APP, "--input", json.dumps({"version": 3}), url=database_url
    )
    assert refused.returncode == 2
    assert "'document_id'" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


async def test_the_console_instance_page_says_what_a_burst_waits_for(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    token = "flow-console-token"
    url, proc = spawn_console(processes, database_url, app=APP, token=token)
    await console_ready(url, proc)
    async with Client(database=database) as client:
        first = await client.start(flow_app.save_document, document_id="page", version=1)
        await client.start(flow_app.save_document, document_id="page", version=2)
    async with httpx.AsyncClient(base_url=url, timeout=10, headers={"authorization": f"Bearer {token}"}) as http:
        page = (await http.get(f"/instances/{first.instance_id}")).text
    assert "data-burst" in page
    assert "<code>page</code>: 2 start(s) folded" in page
    assert "debouncing: runs once quiet for 2s" in page


async def test_the_flow_example_runs_as_its_docstring_says(database_url: str, processes: ProcessPool) -> None:
    worker = processes.worker(database_url, "examples.flow")
    await workers_started(processes, [worker])
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "KENNING_DATABASE_URL": database_url}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "examples.flow"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "10 saves joined 1 instance:" in done.stdout
    assert "indexed revision 9" in done.stdout


async def test_kenning_why_says_what_an_open_batch_gathers(database_url: str, sql: Sql, processes: ProcessPool) -> None:
    worker = processes.worker(database_url, APP)
    ingress = start_ingress(processes, database_url)
    await workers_started(processes, [worker])
    with httpx.Client(timeout=10) as http:
        for n in range(2):
            headers, body = binary(cloud_event("reading.gathered", {"tenant": "t9", "n": n}))
            assert http.post(f"{ingress.url}/", headers=headers, content=body).status_code == 202

    def gathered() -> bool:
        return _rows(sql, "SELECT folded FROM kenning_bursts WHERE kind = 'batch'") == [(2,)]

    await eventually(gathered, timeout=30, message="both events in one batch")
    (instance_id,) = _rows(sql, "SELECT instance_id FROM kenning_bursts")[0]
    why = kenning_command("why", str(instance_id), url=database_url)
    assert why.returncode == 0, why.stderr
    assert "gathering batch of key 't9' (2 of 100 events): a worker claims it when full, or" in why.stdout
    assert "batch of key 't9': 2 event(s) of at most 100" in why.stdout
