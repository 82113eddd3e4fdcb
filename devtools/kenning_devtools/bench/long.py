"""Long workflows: total time must grow linearly with the number of steps."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kenning.client import Client
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.workflows import bench_long


async def run_long(url: str, short_steps: int, long_steps: int) -> dict[str, Any]:
    timings: dict[int, float] = {}
    with fleet(url) as running:
        running.spawn(["worker", "--app", "kenning_devtools.bench.workflows", "--no-migrate"], ready="worker.started")
        await asyncio.sleep(0.3)
        async with Client(url) as client:
            for steps in (short_steps, long_steps):
                started = time.monotonic()
                instance = await client.start(bench_long, steps=steps)
                assert await client.result(instance.instance_id, timeout=600) == steps
                timings[steps] = time.monotonic() - started
    per_step_short = timings[short_steps] / short_steps
    per_step_long = timings[long_steps] / long_steps
    return {
        "activities": {str(k): round(v, 3) for k, v in timings.items()},
        "ms_per_step": {
            str(short_steps): round(1000 * per_step_short, 3),
            str(long_steps): round(1000 * per_step_long, 3),
        },
        # 1.0 is perfectly linear; quadratic growth would give long/short
        "growth_ratio": round(per_step_long / per_step_short, 2),
    }
