"""Start -> result: how long a caller waits from ``client.start`` to ``client.result``
returning, for the three-activity workflow run by real worker processes; one caller at a
time (sequential) and several at once; and the commits one sequential workflow costs
(every process's, from ``pg_stat_database``: the start, the claims, the steps, the
completion, each listening backend woken by a NOTIFY, the caller's result read)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from kenning.client import Client
from kenning_devtools.bench.limits import commits, commits_when_alone
from kenning_devtools.bench.processes import Fleet, fleet
from kenning_devtools.bench.stats import summary_ms
from kenning_devtools.bench.workflows import bench_three

APP = "kenning_devtools.bench.workflows"
WORKERS = 2
WARM_UP = 5  # workflows run first: connections opened, statements prepared


async def _start_to_result(client: Client, value: int) -> float:
    """Milliseconds from the start call to the result in hand."""
    began = time.perf_counter()
    instance = await client.start(bench_three, value=value)
    result = await client.result(instance.instance_id, timeout=60)
    elapsed = 1000 * (time.perf_counter() - began)
    if result != value + 3:
        raise RuntimeError(f"bench_three({value}) returned {result!r}")
    return elapsed


async def _workers(running: Fleet) -> None:
    running.spawn_all([(["worker", "--app", APP, "--no-migrate"], "worker.started")] * WORKERS)
    await asyncio.sleep(0.5)  # let them connect and LISTEN


async def _sequential_commits(url: str, samples: int) -> float:
    """Commits per workflow, one caller at a time, on workers and a client of their own:
    counted from before they run any workflow until after they have exited, because a
    listening backend's own transactions (one per NOTIFY it is woken by) are flushed to
    the statistics only when it runs a statement or exits, and a listener runs none."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        with fleet(url) as running:
            await _workers(running)
            before = await commits(conn, settle=True)
            async with Client(url) as client:
                for n in range(samples):
                    await _start_to_result(client, n)
        after = await commits_when_alone(url, conn)
    return (after - before - 1) / samples  # less the first counter read's own


async def _concurrent(client: Client, callers: int, samples: int) -> list[float]:
    """Latencies of ``samples`` workflows, ``callers`` of them in flight at any time."""
    queue = list(range(samples))
    latencies: list[float] = []

    async def caller() -> None:
        while queue:
            latencies.append(await _start_to_result(client, queue.pop()))

    await asyncio.gather(*(caller() for _ in range(callers)))
    return latencies


async def run_result_latency(url: str, samples: int, callers: int, concurrent_samples: int) -> dict[str, Any]:
    with fleet(url) as running:
        await _workers(running)
        async with Client(url) as client:
            for n in range(WARM_UP):
                await _start_to_result(client, n)
            sequential = [await _start_to_result(client, n) for n in range(samples)]
            concurrent = await _concurrent(client, callers, concurrent_samples)
    return {
        "workers": WORKERS,
        "sequential": summary_ms(sequential),
        "concurrent": {"callers": callers, **summary_ms(concurrent)},
        # the workers' and the client's start and stop included: a few commits spread
        # over the samples
        "commits_per_sequential_workflow": round(await _sequential_commits(url, samples), 2),
    }
