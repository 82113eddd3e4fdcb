"""The chaos run's cron schedules (``tests/chaos_cron.py``): only its schedulers import
this module, no worker does, so a tick's instance stays pending and costs the run no work;
what the checker counts is that each tick was started, once."""

from __future__ import annotations

from kenning import App, WorkflowContext, workflow

app = App("kenning-chaos-cron")


@workflow(schedule="* * * * * *")
async def chaos_cron_every_second(ctx: WorkflowContext) -> str:
    return "tick"


@workflow(schedule="*/2 * * * * *")
async def chaos_cron_every_two(ctx: WorkflowContext) -> str:
    return "tick"


SCHEDULED = (chaos_cron_every_second, chaos_cron_every_two)
