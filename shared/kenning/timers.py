"""``wait_timer`` and ``wait_until``: durable sleeps that free the worker; ``sleep`` and
``sleep_until`` are the same under Edda's later names (the same steps: code may switch
names without breaking the replay of running instances).

The due time is computed once, on the database clock, when the timer is registered; the
scheduler records ``TimerExpired`` when it fires and the workflow resumes on any worker.
"""

from __future__ import annotations

from datetime import UTC, datetime

from kenning.context import WorkflowContext

__all__ = ["sleep", "sleep_until", "wait_timer", "wait_until"]


async def wait_timer(ctx: WorkflowContext, duration_seconds: float, timer_id: str | None = None) -> None:
    """Sleep durably for ``duration_seconds`` (milliseconds to months)."""
    if duration_seconds < 0:
        raise ValueError(f"wait_timer duration must not be negative, got {duration_seconds}")
    await ctx.runtime.wait_timer("wait_timer", timer_id, due_at=None, delay_seconds=float(duration_seconds))


async def wait_until(ctx: WorkflowContext, until_time: datetime, timer_id: str | None = None) -> None:
    """Sleep durably until ``until_time``; a naive datetime is taken as UTC (as in Edda)."""
    if until_time.tzinfo is None:
        until_time = until_time.replace(tzinfo=UTC)
    await ctx.runtime.wait_timer("wait_until", timer_id, due_at=until_time, delay_seconds=None)


async def sleep(ctx: WorkflowContext, seconds: float, timer_id: str | None = None) -> None:
    """Edda's later name of ``wait_timer``: sleep durably for ``seconds``."""
    await wait_timer(ctx, seconds, timer_id)


async def sleep_until(ctx: WorkflowContext, until_time: datetime, timer_id: str | None = None) -> None:
    """Edda's later name of ``wait_until``: sleep durably until ``until_time`` (naive: UTC)."""
    await wait_until(ctx, until_time, timer_id)
