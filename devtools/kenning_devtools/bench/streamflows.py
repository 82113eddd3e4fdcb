"""The streaming workflow the benchmark runs in a real worker process: it waits for
``go`` (its readers are connected by then), then an activity writes entries stamped
with the wall clock (same machine as the readers), as a model call streams its tokens."""

from __future__ import annotations

import asyncio
import time

from kenning import WorkflowContext, activity, receive, workflow, write_stream

STREAM_KEY = "bench"


@activity
async def bench_write_entries(ctx: WorkflowContext, count: int, interval: float) -> int:
    for n in range(count):
        await write_stream(ctx, STREAM_KEY, {"n": n, "t": time.time()})
        await asyncio.sleep(interval)
    return count


@workflow
async def bench_stream(ctx: WorkflowContext, count: int, interval: float) -> int:
    await receive(ctx, "go")
    return await bench_write_entries(ctx, count, interval)  # its end closes the stream
