"""Every-second schedules the scheduler's stall tests run (issue 33): a scheduler stopped
inside one tick's transaction, or another session holding one schedule's row, must hold
up no other schedule and lose no tick. Their runs end at once."""

from __future__ import annotations

from kenning import App, WorkflowContext, workflow

app = App("kenning-ticking-tests")


@workflow(schedule="* * * * * *")
async def tick_a(ctx: WorkflowContext) -> str:
    return "a"


@workflow(schedule="* * * * * *")
async def tick_b(ctx: WorkflowContext) -> str:
    return "b"


@workflow(schedule="* * * * * *")
async def tick_c(ctx: WorkflowContext) -> str:
    return "c"
