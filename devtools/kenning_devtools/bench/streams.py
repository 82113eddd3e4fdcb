"""Durable streams through real processes: an entry written by an activity in a
``kenning worker`` -> received by a Server-Sent Events client of a ``kenning ingress``.

Three runs: one stream, ``many`` streams written at once (one instance each), and one
stream with ``readers`` SSE clients. The latency of an entry is the reader's wall clock
when its event arrives minus the writer's when it called ``write_stream`` (one machine,
one clock). During the last run the ingress's LISTEN connections are counted: its
readers share one per process (``kenning.client.streams``), however many there are.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import psutil
import psycopg

from kenning.client import Client
from kenning_devtools.bench import events
from kenning_devtools.bench.cehttp import start_ingress, tree_cpu_seconds
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.stats import summary_ms
from kenning_devtools.bench.streamflows import STREAM_KEY, bench_stream

APP = "kenning_devtools.bench.streamflows"


async def _read(http: httpx.AsyncClient, instance_id: str, connected: asyncio.Event, got: list[float]) -> int:
    """One SSE reader: each entry's latency into ``got``, until the close; the entries read."""
    entries = 0
    async with http.stream("GET", f"/instances/{instance_id}/streams/{STREAM_KEY}") as response:
        if response.status_code != 200:
            raise RuntimeError(f"the ingress answered {response.status_code}: {await response.aread()!r}")
        connected.set()
        event = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "entry":
                arrived = time.time()
                got.append(1000 * (arrived - json.loads(line[6:])["value"]["t"]))
                entries += 1
            elif line.startswith("data: ") and event == "close":
                return entries
    raise RuntimeError(f"the stream of {instance_id} ended without its close")


async def _listeners(url: str) -> int:
    """The database sessions listening for results (the ingress's; the bench's own
    client opens none: it never waits on a result)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'kenning-results' "
            "AND datname = current_database()"
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def _run(
    url: str,
    ingress: tuple[str, psutil.Popen],
    worker: psutil.Popen,
    streams: int,
    readers_per_stream: int,
    entries: int,
    interval: float,
) -> dict[str, Any]:
    """``streams`` instances, each read by ``readers_per_stream`` clients, all told to
    write at once."""
    got: list[float] = []
    ingress_url, ingress_proc = ingress
    limits = httpx.Limits(max_connections=streams * readers_per_stream + 10, max_keepalive_connections=0)
    async with Client(url) as client, httpx.AsyncClient(base_url=ingress_url, timeout=120, limits=limits) as http:
        ids = [(await client.start(bench_stream, count=entries, interval=interval)).instance_id for _ in range(streams)]
        connected = [asyncio.Event() for _ in range(streams * readers_per_stream)]
        readers = [
            asyncio.create_task(_read(http, ids[n // readers_per_stream], connected[n], got))
            for n in range(streams * readers_per_stream)
        ]
        await asyncio.wait_for(asyncio.gather(*(c.wait() for c in connected)), 120)
        listeners = await _listeners(url)
        began, own_cpu = time.monotonic(), time.process_time()
        ingress_cpu, worker_cpu = tree_cpu_seconds(ingress_proc), tree_cpu_seconds(worker)
        await asyncio.gather(*(client.send_message(i, "go", None) for i in ids))
        counts = await asyncio.wait_for(asyncio.gather(*readers), 600)
        seconds = time.monotonic() - began
        ingress_cpu, own_cpu = tree_cpu_seconds(ingress_proc) - ingress_cpu, time.process_time() - own_cpu
        worker_cpu = tree_cpu_seconds(worker) - worker_cpu
    if any(count != entries for count in counts):
        raise RuntimeError(f"readers missed entries: {sorted(set(counts))} of {entries}")
    return {
        "streams": streams,
        "readers": streams * readers_per_stream,
        "entries_per_stream": entries,
        "entries_per_second": round(streams * entries / seconds, 1),
        "ingress_listeners": listeners,
        # the worker's CPU per entry written (the activity, its statement), and per entry
        # delivered to a reader the ingress's and the readers' (this process)
        "worker_cpu_ms_per_entry": round(1000 * worker_cpu / (streams * entries), 3),
        "ingress_cpu_ms_per_delivery": round(1000 * ingress_cpu / len(got), 3),
        "reader_cpu_ms_per_delivery": round(1000 * own_cpu / len(got), 3),
        **summary_ms(got),
    }


async def run_stream_latency(
    url: str, entries: int, interval: float, many: int, readers: int, event_samples: int
) -> dict[str, Any]:
    """Entry written -> SSE event received, p50 and p99: one stream, ``many`` at once,
    one stream read by ``readers`` clients; the event latency measured beside (the
    caller passes its own when the event section ran)."""
    with fleet(url) as running:
        ingress = start_ingress(running, workers=1)
        worker = running.spawn(
            ["worker", "--app", APP, "--no-migrate", "--concurrency", str(max(many, 32))], "worker.started"
        )
        one = await _run(url, ingress, worker, 1, 1, entries, interval)
        together = await _run(url, ingress, worker, many, 1, entries, interval)
        fanout = await _run(url, ingress, worker, 1, readers, entries, interval)
    result: dict[str, Any] = {"interval_seconds": interval, "one": one, "many": together, "readers": fanout}
    if event_samples:
        result["event_latency"] = await events.run_event_latency(url, event_samples)
    return result
