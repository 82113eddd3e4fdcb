"""Timer lateness through real worker and scheduler processes: fired time minus due
time, both from the database clock (the ``TimerExpired`` payload)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from kenning.client import Client
from kenning.core.names import TIMER_EXPIRED
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.stats import summary_ms
from kenning_devtools.bench.waitflows import bench_timer

APP = "kenning_devtools.bench.waitflows"


async def run_timer_lateness(url: str, timers: int, seconds: float) -> dict[str, Any]:
    """``timers`` instances each wait ``seconds``, started at an even pace over one such
    period, so timers keep being registered while others fire."""
    with fleet(url) as running:
        running.spawn_all(
            [
                (["worker", "--app", APP, "--no-migrate"], "worker.started"),
                (["scheduler", "--no-migrate"], "scheduler.started"),
            ]
        )
        await asyncio.sleep(0.3)
        pace = seconds / timers
        async with Client(url) as client:
            begun = time.monotonic()
            ids = []
            for i in range(timers):
                await asyncio.sleep(max(0.0, begun + i * pace - time.monotonic()))
                ids.append((await client.start(bench_timer, seconds=seconds)).instance_id)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 60 + 2 * seconds
            while True:
                cur = await conn.execute(
                    "SELECT count(*) FROM kenning_instances WHERE id = ANY(%s) AND status = 'completed'", (ids,)
                )
                row = await cur.fetchone()
                if row is not None and row[0] == timers:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {row[0] if row else 0} of {timers} timer workflows completed")
                await asyncio.sleep(0.05)
            cur = await conn.execute(
                "SELECT 1000 * extract(epoch FROM CAST(payload ->> 'fired_at' AS timestamptz) "
                "- CAST(payload ->> 'due_at' AS timestamptz)) FROM kenning_history "
                "WHERE instance_id = ANY(%s) AND kind = %s",
                (ids, TIMER_EXPIRED),
            )
            lateness = [float(r[0]) for r in await cur.fetchall()]
    if len(lateness) != timers:
        raise RuntimeError(f"{len(lateness)} TimerExpired records for {timers} timers")
    return {
        "timer_seconds": seconds,
        **summary_ms(lateness),
        "min_ms": round(min(lateness), 2),
        "early": sum(1 for v in lateness if v < 0),
    }
