"""The workflows the benchmark runs in real worker processes."""

from __future__ import annotations

from kenning import WorkflowContext, activity, workflow


@activity
async def bump(ctx: WorkflowContext, value: int) -> int:
    return value + 1


@workflow
async def bench_three(ctx: WorkflowContext, value: int) -> int:
    value = await bump(ctx, value)
    value = await bump(ctx, value)
    return await bump(ctx, value)


@workflow
async def bench_long(ctx: WorkflowContext, steps: int) -> int:
    value = 0
    for _ in range(steps):
        value = await bump(ctx, value)
    return value
