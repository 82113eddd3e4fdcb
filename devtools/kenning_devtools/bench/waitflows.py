"""The waiting workflows the benchmark runs in real worker processes: one event, a
chain of events, and a timer."""

from __future__ import annotations

import time

from kenning import WorkflowContext, activity, wait_event, wait_timer, workflow

PING = "bench.ping"
CHAIN = "bench.chain"


@activity
async def stamp(ctx: WorkflowContext) -> float:
    """The wall clock when the activity started (same machine as the poster)."""
    return time.time()


@workflow
async def bench_event_wait(ctx: WorkflowContext, key: str) -> float:
    await wait_event(ctx, PING, match={"key": key})
    return await stamp(ctx)


@workflow
async def bench_event_chain(ctx: WorkflowContext, key: str, count: int) -> int:
    for _ in range(count):
        await wait_event(ctx, CHAIN, match={"key": key})
    return count


@workflow
async def bench_timer(ctx: WorkflowContext, seconds: float) -> None:
    await wait_timer(ctx, seconds)
