"""``wait_timer`` and ``wait_until``: durable sleeps that free the worker.

The due time is computed once, on the database clock, when the timer is registered; the
scheduler records ``TimerExpired`` when it fires and the workflow resumes on any worker.
"""

from __future__ import annotations

from datetime import UTC, datetime

from kenning.context import WorkflowContext
from kenning.storage import timers as timers_sql

TIMER_EXPIRED = "TimerExpired"


async def _wait(
    ctx: WorkflowContext, step_name: str, timer_id: str | None, due_at: datetime | None, delay: float | None
) -> None:
    replayer = ctx._replayer
    step_id = timer_id or replayer.next_step_id(step_name)
    record = replayer.take_recorded(step_id, step_name)
    if record is not None:
        return
    await replayer.before_new_step(step_id, step_name, flush=False)
    await replayer.suspend(
        lambda conn, folded: timers_sql.timer_register_and_suspend(
            conn,
            folded=folded,
            instance_id=replayer.instance_id,
            token=replayer.token,
            step_id=step_id,
            step_name=step_name,
            due_at=due_at,
            delay_seconds=delay,
        )
    )


async def wait_timer(ctx: WorkflowContext, duration_seconds: float, timer_id: str | None = None) -> None:
    """Sleep durably for ``duration_seconds`` (milliseconds to months)."""
    if duration_seconds < 0:
        raise ValueError(f"wait_timer duration must not be negative, got {duration_seconds}")
    await _wait(ctx, "wait_timer", timer_id, None, float(duration_seconds))


async def wait_until(ctx: WorkflowContext, until_time: datetime, timer_id: str | None = None) -> None:
    """Sleep durably until ``until_time``; a naive datetime is taken as UTC (as in Edda)."""
    if until_time.tzinfo is None:
        until_time = until_time.replace(tzinfo=UTC)
    await _wait(ctx, "wait_until", timer_id, until_time, None)
