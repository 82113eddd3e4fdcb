"""The workflows of ``kenning bench``'s offload section: a large step result stored, then
loaded back by the replay after a timer (the worker reads it from the object store); and
a ticker, another instance's small steps on the same worker, whose gaps show how long
a large value's store holds that worker's event loop."""

from __future__ import annotations

import time

from kenning import App, WorkflowContext, activity, wait_timer, workflow

app = App("kenning-bench-offload")


@activity
async def produce(ctx: WorkflowContext, size: int) -> str:
    return "x" * size


@activity
async def measure(ctx: WorkflowContext, text: str) -> int:
    return len(text)


@workflow
async def offload_roundtrip(ctx: WorkflowContext, size: int) -> int:
    text = await produce(ctx, size)  # stored: above --offload-bytes, written to the object store
    await wait_timer(ctx, 0.01)  # the instance suspends; its replay loads the value back
    return await measure(ctx, text)


@activity
async def tick(ctx: WorkflowContext) -> float:
    return time.monotonic()  # the worker's clock: one process runs every tick


@workflow
async def ticker(ctx: WorkflowContext, seconds: float) -> float:
    """Small steps, one after another, for ``seconds``: the longest gap between two."""
    first = last = await tick(ctx)
    longest = 0.0
    while last - first < seconds:
        now = await tick(ctx)
        longest, last = max(longest, now - last), now
    return longest
