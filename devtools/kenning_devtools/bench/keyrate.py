"""The flow section's per-key rate limit (issue 35, item 6): busy keys over a
``RateLimit`` start at the limit's pace, and a quiet key is not held up behind them.

``KEYS`` busy keys each get ``limit x windows`` instances of the three-activity workflow at
once, in a queue of ``limit`` starts per ``period`` for each key (declared as a worker
would), with one quiet key's instance started last. At the limit, a key's start lets the
``limit``-th after it start exactly ``period`` later (when it leaves the window); ``pace``
is ``period`` over the mean of those gaps measured, the share of its limit a key achieved
(the target: >= 0.95). The first window's own spread (how long its starts took to insert)
is not counted against it. ``most_in_a_window`` is the
most starts of one key in any period-long window (never above ``limit``), and
``quiet_waited_ms`` how long the quiet key's instance waited for its first claim."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from kenning.client import Client
from kenning.db import connect
from kenning.storage import queues as queues_sql
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.throughput import STARTERS, _reset, _wait_completed
from kenning_devtools.bench.workflows import bench_three

APP = "kenning_devtools.bench.workflows"
QUEUE = "bench-key-rate"
KEYS = 4


async def _declare(url: str, limit: int, period: float) -> None:
    database = connect(url, pool_size=1, max_overflow=0)
    try:
        async with database.connection() as conn:
            await queues_sql.queues_declare(
                conn, [queues_sql.QueueLimits(QUEUE, key_rate_limit=limit, key_rate_period_seconds=period)]
            )
    finally:
        await database.dispose()


async def _measure(url: str, limit: int, period: float) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        gaps = await (
            await conn.execute(
                "SELECT partition_key, avg(gap) FROM (SELECT partition_key, extract(epoch FROM started_at - "
                " lag(started_at, %s) OVER (PARTITION BY partition_key ORDER BY started_at)) AS gap "
                " FROM kenning_instances WHERE queue_name = %s AND partition_key LIKE 'busy-%%') AS g "
                "WHERE gap IS NOT NULL GROUP BY partition_key",
                (limit, QUEUE),
            )
        ).fetchall()
        most = await (
            await conn.execute(
                "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM kenning_instances AS a "
                "JOIN kenning_instances AS b ON b.queue_name = a.queue_name AND b.partition_key = a.partition_key "
                " AND b.started_at >= a.started_at AND b.started_at < a.started_at + make_interval(secs => %s) "
                "WHERE a.queue_name = %s GROUP BY a.id) AS w",
                (period, QUEUE),
            )
        ).fetchone()
        quiet = await (
            await conn.execute(
                "SELECT extract(epoch FROM started_at - created_at) FROM kenning_instances "
                "WHERE queue_name = %s AND partition_key = 'quiet'",
                (QUEUE,),
            )
        ).fetchone()
    paces = [period / float(gap) if gap else 0.0 for _key, gap in gaps]
    return {
        "pace": round(min(paces), 3) if paces else None,
        "pace_per_key": sorted(round(p, 3) for p in paces),
        "most_in_a_window": int(most[0]) if most else 0,
        "quiet_waited_ms": round(1000 * float(quiet[0]), 1) if quiet else None,
    }


async def run_key_rate(url: str, limit: int, period: float, windows: int) -> dict[str, Any]:
    """Busy keys at their rate limit, two workers racing for them, and one quiet key."""
    await _reset(url)
    await _declare(url, limit, period)
    total = KEYS * limit * windows + 1
    with fleet(url) as running:
        running.spawn_all([(["worker", "--app", APP, "--no-migrate", "--concurrency", "16"], "worker.started")] * 2)
        await asyncio.sleep(0.5)  # let them connect and LISTEN
        started = time.monotonic()
        async with Client(url) as client:
            pending = [(f"busy-{n % KEYS}", n) for n in range(KEYS * limit * windows)]

            async def starter() -> None:
                while pending:
                    key, value = pending.pop()
                    await client.start(bench_three, value=value, queue=QUEUE, partition_key=key)

            await asyncio.gather(*(starter() for _ in range(STARTERS)))
            await client.start(bench_three, value=-1, queue=QUEUE, partition_key="quiet")
            await _wait_completed(url, total, timeout=120.0 + windows * period * 4)
        elapsed = time.monotonic() - started
    measured = await _measure(url, limit, period)
    return {
        "keys": KEYS,
        "limit": limit,
        "period_seconds": period,
        "windows": windows,
        "workflows": total,
        "seconds": round(elapsed, 2),
        **measured,
    }
