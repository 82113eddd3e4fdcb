"""Throughput: N three-activity workflows started through the client, run by W worker
processes; workflows/s, steps/s, commits per workflow and CPU per workflow."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psutil
import psycopg

from kenning.client import Client
from kenning_devtools.bench.limits import commits, commits_when_alone
from kenning_devtools.bench.pgcpu import other_work, postmaster_of, shared, tree_cpu_seconds
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.workflows import bench_three

APP = "kenning_devtools.bench.workflows"
# concurrent client.start() calls, as from a web app's concurrent requests: the client
# group-commits starts made at the same time
STARTERS = 16


async def _reset(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "DELETE FROM kenning_history WHERE instance_id IN "
            "(SELECT id FROM kenning_instances WHERE workflow_name = 'bench_three')"
        )
        await conn.execute("DELETE FROM kenning_instances WHERE workflow_name = 'bench_three'")
        await conn.execute("VACUUM ANALYZE kenning_instances")
        await conn.execute("VACUUM ANALYZE kenning_history")


async def _wait_completed(url: str, total: int, timeout: float) -> int:
    """Poll until ``total`` bench instances completed; returns the polls made (their
    commits are subtracted from the count)."""
    polls = 0
    deadline = time.monotonic() + timeout
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            polls += 1
            cur = await conn.execute(
                "SELECT count(*) FROM kenning_instances WHERE workflow_name = 'bench_three' AND status = 'completed'"
            )
            row = await cur.fetchone()
            if row is not None and row[0] >= total:
                return polls
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {row[0] if row else 0} of {total} workflows completed in {timeout} s")
            await asyncio.sleep(0.02)


def _busy_share(before: Any, after: Any) -> float:
    """Share of all CPUs not idle between two ``psutil.cpu_times()`` readings."""
    total = sum(after) - sum(before)
    idle = (after.idle + getattr(after, "iowait", 0.0)) - (before.idle + getattr(before, "iowait", 0.0))
    return round(1 - idle / total, 2) if total > 0 else 0.0


async def run_throughput(
    url: str, workflows: int, workers: int, concurrency: int, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """``env``: the workers' extra variables (the encryption section's keys)."""
    await _reset(url)
    postmaster = postmaster_of(url)  # None: not on this machine, so its CPU is not measured
    with fleet(url) as running:
        procs = running.spawn_all(
            [(["worker", "--app", APP, "--no-migrate", "--concurrency", str(concurrency)], "worker.started")] * workers,
            env,
        )
        await asyncio.sleep(0.5)  # let them connect and LISTEN
        cpu_before = running.cpu_seconds(procs)
        others_before = other_work(url)
        pg_before = tree_cpu_seconds(postmaster) if postmaster is not None else None
        me = psutil.Process()
        client_before, machine_before = sum(me.cpu_times()[:2]), psutil.cpu_times()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            commits_before = await commits(conn, settle=True)
        started = time.monotonic()
        async with Client(url) as client:
            queue = list(range(workflows))

            async def starter() -> None:
                while queue:
                    await client.start(bench_three, value=queue.pop())

            await asyncio.gather(*(starter() for _ in range(STARTERS)))
            start_seconds = time.monotonic() - started
            polls = await _wait_completed(url, workflows, timeout=max(120.0, workflows / 5))
        elapsed = time.monotonic() - started
        cpu = running.cpu_seconds(procs) - cpu_before
        pg_after = tree_cpu_seconds(postmaster) if postmaster is not None else None
        if shared(others_before, other_work(url)):
            pg_after = None  # the tree holds other clients' CPU too (pgcpu's docstring)
        client_cpu, machine_after = sum(me.cpu_times()[:2]) - client_before, psutil.cpu_times()
    # read once the workers have stopped: a busy backend defers its counters for up to
    # 10 s (PGSTAT_IDLE_INTERVAL) and flushes them when it exits
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        commits_after = await commits_when_alone(url, conn)
    # subtract the monitor's own polls and the two counter reads; worker heartbeats and
    # idle polls stay in: they are part of what running Kenning costs
    kenning_commits = commits_after - commits_before - polls - 1
    return {
        "workers": workers,
        "workflows": workflows,
        "seconds": round(elapsed, 3),
        "workflows_per_second": round(workflows / elapsed, 1),
        "steps_per_second": round(3 * workflows / elapsed, 1),
        # how fast the client started them: when workflows/s is about this, the workers
        # kept up and the starting client (on the same CPUs) set the pace
        "starts_per_second": round(workflows / start_seconds, 1),
        "commits_per_workflow": round(kenning_commits / workflows, 2),
        "worker_cpu_ms_per_workflow": round(1000 * cpu / workflows, 3),
        # the starting client runs in this process, on the same CPUs
        "client_cpu_ms_per_workflow": round(1000 * client_cpu / workflows, 3),
        "machine_cpu_busy": _busy_share(machine_before, machine_after),
        "postgres_cpu_ms_per_workflow": (
            None if pg_before is None or pg_after is None else round(1000 * (pg_after - pg_before) / workflows, 3)
        ),
    }
