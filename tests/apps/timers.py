"""Workflows the scheduler tests run: timers, event timeouts, cron schedules.

Activities append ``label instance_id`` to the side channel each time they really run.
"""

from __future__ import annotations

from datetime import datetime

from kenning import (
    App,
    EventTimeoutError,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    wait_event,
    wait_timer,
    wait_until,
    workflow,
)
from tests.sidechannel import record_execution

app = App("kenning-timer-tests")


def side(label: str, ctx: WorkflowContext) -> None:
    record_execution(f"{label} {ctx.instance_id}")


@compensation
async def unbook(ctx: WorkflowContext, slot: str, *, booking: str) -> None:
    side(f"unbook:{slot}:{booking}", ctx)


@activity
@on_failure(unbook)
async def book(ctx: WorkflowContext, slot: str) -> dict[str, str]:
    side(f"book:{slot}", ctx)
    return {"booking": f"b-{slot}"}


@activity
async def woke(ctx: WorkflowContext, label: str) -> str:
    side(f"woke:{label}", ctx)
    return label


# ------------------------------------------------------------------ timers


@workflow
async def nap(ctx: WorkflowContext, seconds: float) -> str:
    """A timer first (so instances made in SQL as 'waiting_for_timer' replay), then a step."""
    await wait_timer(ctx, seconds)
    return await woke(ctx, "nap")


@workflow
async def nap_until(ctx: WorkflowContext, until: str) -> str:
    await wait_until(ctx, datetime.fromisoformat(until))
    return await woke(ctx, "nap_until")


@workflow
async def booked_nap(ctx: WorkflowContext, seconds: float) -> str:
    await book(ctx, "nap")
    await wait_timer(ctx, seconds)
    return await woke(ctx, "booked_nap")


# ------------------------------------------------------------------ event timeouts


@workflow
async def patient(ctx: WorkflowContext, timeout: float) -> str:
    """Catches the timeout and carries on: no compensation runs."""
    await book(ctx, "patient")
    try:
        await wait_event(ctx, "never.sent", timeout_seconds=timeout)
    except EventTimeoutError:
        return await woke(ctx, "timed_out")
    return "event"


@workflow
async def impatient(ctx: WorkflowContext, timeout: float) -> str:
    """Does not catch the timeout: the workflow fails and ``unbook`` runs."""
    await book(ctx, "impatient")
    await wait_event(ctx, "never.sent", timeout_seconds=timeout)
    return "event"


# ------------------------------------------------------------------ cron


@workflow(schedule="* * * * * *")
async def every_second(ctx: WorkflowContext) -> str:
    return await woke(ctx, "tick")


@workflow(schedule="30 2 * * *", timezone="Europe/Paris")
async def nightly(ctx: WorkflowContext) -> str:
    return "night"


@workflow(schedule="*/5 * * * *")
async def every_five_minutes(ctx: WorkflowContext, label: str = "five") -> str:
    return label
