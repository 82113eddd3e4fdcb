"""Workflows the escape-hatch and bulk-action tests run (tests/system/test_escapes.py):
a saga whose compensation fails for ever (no retry limit), and a workflow that waits for
an event nobody sends."""

from __future__ import annotations

from kenning import (
    App,
    RetryPolicy,
    WorkflowContext,
    activity,
    compensation,
    register_compensation,
    wait_event,
    workflow,
)
from tests.sidechannel import record_execution

# every compensation retried without end, a few times a second: "fails for ever"
FOREVER = RetryPolicy(initial_interval=0.1, max_interval=0.2, max_attempts=None, max_duration=None)
app = App("kenning-escapes-tests", default_retry_policy=FOREVER)


@compensation
async def release(ctx: WorkflowContext, order: str) -> None:
    record_execution(f"release {ctx.instance_id}")


@compensation
async def refund(ctx: WorkflowContext, amount: int) -> None:
    record_execution(f"refund {ctx.instance_id}")
    raise RuntimeError("the bank refuses the refund")


@activity
async def reserve(ctx: WorkflowContext, order: str) -> str:
    record_execution(f"reserve {ctx.instance_id}")
    return order


@workflow(name="escapes.stuck_saga")
async def stuck_saga(ctx: WorkflowContext, order: str) -> str:
    """Reserves, then waits: a cancel runs ``refund`` (which never succeeds), then ``release``.
    (Named ids: a replayed registration without one is saved again under a new id.)"""
    await reserve(ctx, order)
    await register_compensation(ctx, release, order, activity_id="release")
    await register_compensation(ctx, refund, 5, activity_id="refund")
    await wait_event(ctx, "escapes.paid", match={"order": order}, timeout_seconds=3600)
    return "paid"


@workflow(name="escapes.waiter")
async def waiter(ctx: WorkflowContext, n: int) -> int:
    await wait_event(ctx, "escapes.go", match={"n": n}, timeout_seconds=3600)
    return n
