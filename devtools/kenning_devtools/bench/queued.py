"""Queued throughput: the throughput section's three-activity workflows in no queue, in a
queue without limits, and in a queue with limits (a global concurrency below the workers'
slots and 64 partition keys of at most 4 each), so the cost of the limits is known."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psutil

from kenning.client import Client
from kenning.db import connect
from kenning.storage import queues as queues_sql
from kenning_devtools.bench.processes import Fleet, fleet
from kenning_devtools.bench.throughput import STARTERS, _reset, _wait_completed
from kenning_devtools.bench.workflows import bench_three

APP = "kenning_devtools.bench.workflows"
PARTITIONS = 64
MODES = ("no queue", "queue, no limits", "queue, limits on")


async def _declare(url: str, concurrency: int) -> None:
    database = connect(url, pool_size=1, max_overflow=0)
    try:
        async with database.connection() as conn:
            await queues_sql.queues_declare(
                conn,
                [
                    queues_sql.QueueLimits("bench-open"),
                    queues_sql.QueueLimits("bench-limited", concurrency=concurrency, partition_concurrency=4),
                ],
            )
    finally:
        await database.dispose()


async def _workers(running: Fleet, workers: int, concurrency: int) -> list[psutil.Popen]:
    procs = running.spawn_all(
        [(["worker", "--app", APP, "--no-migrate", "--concurrency", str(concurrency)], "worker.started")] * workers
    )
    await asyncio.sleep(0.5)  # let them connect and LISTEN
    return procs


async def _one(url: str, running: Fleet, procs: list[psutil.Popen], mode: str, workflows: int) -> dict[str, Any]:
    cpu_before = running.cpu_seconds(procs)
    started = time.monotonic()
    async with Client(url) as client:
        pending = list(range(workflows))

        async def starter() -> None:
            while pending:
                value = pending.pop()
                if mode == "no queue":
                    await client.start(bench_three, value=value)
                elif mode == "queue, no limits":
                    await client.start(bench_three, value=value, queue="bench-open")
                else:
                    key = f"tenant-{value % PARTITIONS}"
                    await client.start(bench_three, value=value, queue="bench-limited", partition_key=key)

        await asyncio.gather(*(starter() for _ in range(STARTERS)))
        await _wait_completed(url, workflows, timeout=max(120.0, workflows / 5))
    elapsed = time.monotonic() - started
    cpu = running.cpu_seconds(procs) - cpu_before
    return {
        "mode": mode,
        "workflows_per_second": round(workflows / elapsed, 1),
        "worker_cpu_ms_per_workflow": round(1000 * cpu / workflows, 3),
    }


async def run_queued(
    url: str, workflows: int, workers: int, concurrency: int, fresh_workers: bool = True
) -> dict[str, Any]:
    """Each mode once, in turn; the limited queue's global concurrency is half the workers'
    slots, so it binds (its figure is lower by design: it says what a binding limit costs
    on top of running fewer at once). Each mode gets workers of its own, so none runs on
    workers another warmed; without ``fresh_workers`` (the quick run, where the start-ups
    would be most of its time) the modes share one set."""
    limit = max(1, workers * concurrency // 2)
    await _declare(url, limit)
    runs = []
    with fleet(url) as shared:
        shared_procs = None if fresh_workers else await _workers(shared, workers, concurrency)
        for mode in MODES:
            await _reset(url)
            if shared_procs is not None:
                runs.append(await _one(url, shared, shared_procs, mode, workflows))
                continue
            with fleet(url) as running:
                procs = await _workers(running, workers, concurrency)
                runs.append(await _one(url, running, procs, mode, workflows))
    return {"workers": workers, "workflows": workflows, "limited_concurrency": limit, "runs": runs}
