"""Kenning's own time per agent step (issue 34, item 5): the same Pydantic AI agent
(kenning_devtools/bench/agentflows.py: a model that answers at once, ``STEPS`` model
requests and tool calls per run) run bare in this process, and durably by a real worker
process, one run at a time from start to result. What the durable run takes beyond the
bare one, over its steps, is Kenning's time per step: the activities' commits, the replay
bookkeeping, the claim and the result's wake-up spread over the run. Measured with the
event stream (each model request's events and each tool call's written to the
instance's stream ``agent``) and without it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kenning.client import Client
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.stats import percentile, summary_ms

APP = "kenning_devtools.bench.agentflows"
WARM_UP = 3


async def _bare_ms(runs: int) -> list[float]:
    from kenning_devtools.bench import agentflows

    times = []
    for n in range(WARM_UP + runs):
        began = time.perf_counter()
        await agentflows.bare_run()
        if n >= WARM_UP:
            times.append(1000 * (time.perf_counter() - began))
    return times


async def _durable_ms(client: Client, workflow: str, runs: int) -> list[float]:
    times = []
    for n in range(WARM_UP + runs):
        began = time.perf_counter()
        instance = await client.start(workflow)
        result = await client.result(instance.instance_id, timeout=60)
        if n >= WARM_UP:
            times.append(1000 * (time.perf_counter() - began))
        if not str(result).startswith("done after"):
            raise RuntimeError(f"{workflow} returned {result!r}")
    return times


async def run_agent(url: str, runs: int) -> dict[str, Any]:
    try:
        from kenning_devtools.bench import agentflows
    except ImportError as missing:  # the pydantic-ai extra is not installed
        return {"skipped": f"needs the pydantic-ai extra ({missing})"}
    bare = await _bare_ms(runs)
    with fleet(url) as running:
        running.spawn(["worker", "--app", APP, "--no-migrate"], "worker.started")
        await asyncio.sleep(0.5)  # let it connect and LISTEN
        async with Client(url) as client:
            streamed = await _durable_ms(client, "bench_agent", runs)
            quiet = await _durable_ms(client, "bench_agent_quiet", runs)
    bare_p50 = percentile(bare, 50)

    def per_step(durable: list[float]) -> float:
        return round((percentile(durable, 50) - bare_p50) / agentflows.STEPS, 3)

    return {
        "steps_per_run": agentflows.STEPS,
        "bare": summary_ms(bare),
        "durable_with_events": summary_ms(streamed),
        "durable_without_events": summary_ms(quiet),
        "kenning_ms_per_step_with_events": per_step(streamed),
        "kenning_ms_per_step_without_events": per_step(quiet),
    }
