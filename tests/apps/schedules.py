"""Scheduled workflows the schedules tests run: each overlap policy, and one that ends at
once for triggers and backfills. ``held_*`` wait for a message on their ``release``
topic, so a test decides when a run finishes."""

from __future__ import annotations

from kenning import App, WorkflowContext, receive, workflow

app = App("kenning-schedule-tests")


@workflow(schedule="* * * * * *", overlap="skip")
async def held_skip(ctx: WorkflowContext) -> str:
    await receive(ctx, "release")
    return "released"


@workflow(schedule="* * * * * *", overlap="buffer_one")
async def held_buffer(ctx: WorkflowContext) -> str:
    await receive(ctx, "release")
    return "released"


@workflow(schedule="*/15 * * * *")
async def quarter_hourly(ctx: WorkflowContext) -> str:
    return "ran"


@workflow(schedule="*/5 * * * *", overlap="skip")
async def five_minutes_skip(ctx: WorkflowContext) -> str:
    return "ran"


@workflow(schedule="*/5 * * * *", overlap="buffer_one")
async def five_minutes_buffer(ctx: WorkflowContext) -> str:
    return "ran"
