"""The workflow the recovery section runs in real worker processes: one activity that
takes a set time, so a run's length is known when its worker is killed mid-way."""

from __future__ import annotations

import asyncio

from kenning import WorkflowContext, activity, workflow


@activity
async def bench_nap(ctx: WorkflowContext, seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@workflow
async def bench_recovery(ctx: WorkflowContext, seconds: float) -> float:
    return await bench_nap(ctx, seconds)
