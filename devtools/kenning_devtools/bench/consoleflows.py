"""The workflow of the benchmark's console section (``kenning_devtools/bench/console.py``):
an instance that moves on all the time, for browsers to watch."""

from __future__ import annotations

from kenning import WorkflowContext, activity, wait_timer, workflow


@activity
async def bench_tick(ctx: WorkflowContext, n: int) -> int:
    return n


@workflow
async def bench_busy(ctx: WorkflowContext, ticks: int, pause: float) -> int:
    """A step and a short timer, ``ticks`` times: every timer's firing wakes the watchers."""
    for n in range(ticks):
        await bench_tick(ctx, n)
        await wait_timer(ctx, pause)
    return ticks
