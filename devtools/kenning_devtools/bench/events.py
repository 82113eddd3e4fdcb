"""Events through real processes: POST -> resumed activity latency, and one workflow
waiting on many events in sequence (its time must grow linearly)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import psycopg

from kenning.client import Client
from kenning_devtools.bench.cehttp import binary_event, start_ingress
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.stats import summary_ms
from kenning_devtools.bench.waitflows import CHAIN, PING, bench_event_chain, bench_event_wait

APP = "kenning_devtools.bench.waitflows"
WORKER = (["worker", "--app", APP, "--no-migrate"], "worker.started")
Conn = psycopg.AsyncConnection[tuple[Any, ...]]


async def _count_subscribed(conn: Conn, workflow: str) -> int:
    cur = await conn.execute(
        "SELECT count(*) FROM kenning_event_subscriptions s JOIN kenning_instances i ON i.id = s.instance_id "
        "WHERE i.workflow_name = %s",
        (workflow,),
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _finished(conn: Conn, instance_id: str, timeout: float = 60.0) -> Any:
    """The result of an instance once completed (polled every few milliseconds)."""
    deadline = time.monotonic() + timeout
    while True:
        cur = await conn.execute(
            "SELECT status, result -> 'result' FROM kenning_instances WHERE id = %s", (instance_id,)
        )
        row = await cur.fetchone()
        if row is not None and row[0] == "completed":
            return row[1]
        if row is not None and row[0] in ("failed", "cancelled"):
            raise RuntimeError(f"benchmark instance {instance_id} ended {row[0]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"instance {instance_id} still {row[0] if row else '?'} after {timeout} s")
        await asyncio.sleep(0.003)


async def _post(http: httpx.AsyncClient, event_type: str, data: Any) -> httpx.Response:
    headers, body = binary_event(event_type, data)
    response = await http.post("/", headers=headers, content=body)
    if response.status_code != 202:
        raise RuntimeError(f"ingress answered {response.status_code}: {response.text}")
    return response


async def run_event_latency(url: str, samples: int) -> dict[str, Any]:
    """``samples`` instances wait on ``bench.ping`` correlated by key; events are posted
    one at a time, each after the previous instance finished; latency is the POST (client
    clock) to the next activity's first line (worker clock, same machine)."""
    latencies: list[float] = []
    responses: list[float] = []
    with fleet(url) as running:
        ingress_url, _ = start_ingress(running, others=[WORKER])
        run = uuid.uuid4().hex[:8]
        keys = [f"{run}-{i}" for i in range(samples)]
        async with Client(url) as client:
            ids = [(await client.start(bench_event_wait, key=key)).instance_id for key in keys]
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while await _count_subscribed(conn, bench_event_wait.name) < samples:
                if time.monotonic() > deadline:
                    raise TimeoutError("the event-latency instances did not all subscribe")
                await asyncio.sleep(0.05)
            async with httpx.AsyncClient(base_url=ingress_url, timeout=30) as http:
                await http.get("/healthz")  # open the connection before timing
                for key, instance_id in zip(keys, ids, strict=True):
                    posted, started = time.time(), time.perf_counter()
                    await _post(http, PING, {"key": key})
                    responses.append(1000 * (time.perf_counter() - started))
                    stamp = float(await _finished(conn, instance_id))
                    latencies.append(1000 * (stamp - posted))
    return {
        **summary_ms(latencies),
        "min_ms": round(min(latencies), 2),
        "post_response": {k: v for k, v in summary_ms(responses).items() if k != "samples"},
    }


async def _next_subscription(conn: Conn, instance_id: str, seen: set[str], timeout: float = 60.0) -> str:
    """Wait (LISTEN kenning_subscriptions, re-checked on each notification or every
    20 ms) until the instance waits on a step it has not waited on before."""
    deadline = time.monotonic() + timeout
    while True:
        cur = await conn.execute(
            "SELECT step_id FROM kenning_event_subscriptions WHERE instance_id = %s", (instance_id,)
        )
        fresh = [row[0] for row in await cur.fetchall() if row[0] not in seen]
        if fresh:
            seen.add(fresh[0])
            return str(fresh[0])
        if time.monotonic() > deadline:
            raise TimeoutError(f"instance {instance_id} did not wait for its next event")
        async for _ in conn.notifies(timeout=0.02, stop_after=1):
            pass


async def _chain(client: Client, conn: Conn, http: httpx.AsyncClient, count: int) -> tuple[float, float]:
    """Total seconds from the start, and seconds from the first wait to the end (the
    per-event part, without the instance's start)."""
    key = uuid.uuid4().hex
    started = time.monotonic()
    instance = await client.start(bench_event_chain, key=key, count=count)
    seen: set[str] = set()
    first_wait = 0.0
    for n in range(count):
        await _next_subscription(conn, instance.instance_id, seen)
        if n == 0:
            first_wait = time.monotonic()
        await _post(http, CHAIN, {"key": key})
    result = await _finished(conn, instance.instance_id, timeout=600)
    if result != count:
        raise RuntimeError(f"event chain returned {result}, expected {count}")
    ended = time.monotonic()
    return ended - started, ended - first_wait


async def run_event_chain(url: str, short_count: int, long_count: int) -> dict[str, Any]:
    """One workflow waiting on ``count`` events in sequence, each posted as soon as it
    waits for the next: total seconds from the start, and milliseconds per event from
    its first wait to its end, at two sizes."""
    timings: dict[int, tuple[float, float]] = {}
    with fleet(url) as running:
        ingress_url, _ = start_ingress(running, others=[WORKER])
        async with (
            Client(url) as client,
            await psycopg.AsyncConnection.connect(url, autocommit=True) as conn,
            httpx.AsyncClient(base_url=ingress_url, timeout=30) as http,
        ):
            await conn.execute("LISTEN kenning_subscriptions")
            await http.get("/healthz")
            for count in (short_count, long_count):
                timings[count] = await _chain(client, conn, http, count)
    per_short = timings[short_count][1] / short_count
    per_long = timings[long_count][1] / long_count
    return {
        "events": {str(k): round(total, 3) for k, (total, _) in timings.items()},
        "ms_per_event": {str(short_count): round(1000 * per_short, 3), str(long_count): round(1000 * per_long, 3)},
        # 1.0 is perfectly linear; quadratic growth would give long/short
        "growth_ratio": round(per_long / per_short, 2),
    }
