"""Workflows in queues with per-key strategies and a per-key rate limit (issue 35;
tests/system/test_key_limits.py). ``held`` reserves a seat (an activity compensated by
``free_seat``) and waits for a ``go`` message: an open instance of its key until told.
Activities and compensations append ``name instance_id`` to the side channel."""

from __future__ import annotations

from kenning import App, Queue, RateLimit, WorkflowContext, activity, compensation, on_failure, receive, workflow
from tests.sidechannel import record_execution

app = App("kenning-key-limits")

SINGLETON = Queue("test-singleton", partition_strategy="singleton")
CANCEL_NEWEST = Queue("test-cancel-newest", partition_strategy="cancel_newest", partition_concurrency=2)
CANCEL_IN_PROGRESS = Queue("test-cancel-in-progress", partition_strategy="cancel_in_progress")
HOURLY = Queue("test-hourly", partition_rate_limit=RateLimit(limit=1, period=3600, key="account"))
PER_CUSTOMER = Queue("test-per-customer", partition_rate_limit=RateLimit(limit=3, period=2.0, key="customer"))


@compensation
async def free_seat(ctx: WorkflowContext, n: int) -> None:
    record_execution(f"free_seat {ctx.instance_id}")


@activity
@on_failure(free_seat)
async def take_seat(ctx: WorkflowContext, n: int) -> int:
    record_execution(f"take_seat {ctx.instance_id}")
    return n


async def _held(ctx: WorkflowContext, n: int) -> int:
    await take_seat(ctx, n)
    await receive(ctx, "go")
    return n


@workflow(queue=SINGLETON)
async def singleton_job(ctx: WorkflowContext, n: int) -> int:
    return await _held(ctx, n)


@workflow(queue=CANCEL_NEWEST)
async def newest_job(ctx: WorkflowContext, n: int) -> int:
    return await _held(ctx, n)


@workflow(queue=CANCEL_IN_PROGRESS)
async def in_progress_job(ctx: WorkflowContext, n: int) -> int:
    return await _held(ctx, n)


@workflow(queue=PER_CUSTOMER)
async def customer_job(ctx: WorkflowContext, customer: str, n: int) -> int:
    return n


@workflow(queue=HOURLY)
async def hourly_job(ctx: WorkflowContext, account: str, n: int) -> int:
    return n
