"""Workflows an operator's day in the console walks through (tests/system/test_console_day_browser.py):
an order waiting for its payment event, a parent waiting for its child, the child waiting for a
message, a saga whose refund fails for ever, a saga that compensated and failed, and a queue whose
partition key may start once an hour. Activities and compensations append ``name instance_id`` to
the side channel each time they really run."""

from __future__ import annotations

from kenning import (
    App,
    Queue,
    RateLimit,
    RetryPolicy,
    TerminalError,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    receive,
    register_compensation,
    start_child,
    wait_event,
    workflow,
)
from tests.sidechannel import record_execution

# a compensation retried without end, a few times a second: "fails for ever"
FOREVER = RetryPolicy(initial_interval=0.1, max_interval=0.2, max_attempts=None, max_duration=None)
app = App("kenning-console-day", default_retry_policy=FOREVER)
HOURLY = Queue("day-hourly", partition_rate_limit=RateLimit(limit=1, period=3600, key="account"))


@workflow(name="day.order")
async def order(ctx: WorkflowContext, order_id: str) -> str:
    """Waits an hour at most for its payment."""
    await wait_event(ctx, "payment.received", match={"order_id": order_id}, timeout_seconds=3600)
    return f"paid {order_id}"


@workflow(name="day.approval")
async def approval(ctx: WorkflowContext, order_id: str) -> str:
    """A child: waits for a message on topic ``approval``."""
    answer = await receive(ctx, "approval")
    return f"{order_id}: {answer}"


@workflow(name="day.parent")
async def parent(ctx: WorkflowContext, order_id: str) -> str:
    """Starts its approval as a child and waits for its end."""
    handle = await start_child(ctx, approval, order_id=order_id, child_id=f"{ctx.instance_id}-approval")
    return await handle.result()


@compensation
async def release(ctx: WorkflowContext, order_id: str) -> None:
    record_execution(f"release {ctx.instance_id}")


@compensation
async def refund(ctx: WorkflowContext, amount: int) -> None:
    record_execution(f"refund {ctx.instance_id}")
    raise RuntimeError("the bank refuses the refund")


@activity
async def reserve(ctx: WorkflowContext, order_id: str) -> str:
    record_execution(f"reserve {ctx.instance_id}")
    return order_id


@workflow(name="day.stuck_saga")
async def stuck_saga(ctx: WorkflowContext, order_id: str) -> str:
    """Reserves, then waits: a cancel runs ``refund`` (which never succeeds), then ``release``."""
    await reserve(ctx, order_id)
    await register_compensation(ctx, release, order_id, activity_id="release")
    await register_compensation(ctx, refund, 5, activity_id="refund")
    await wait_event(ctx, "day.paid", match={"order_id": order_id}, timeout_seconds=3600)
    return "paid"


@compensation
async def unbook(ctx: WorkflowContext, order_id: str) -> None:
    record_execution(f"unbook {ctx.instance_id}")


@activity
@on_failure(unbook)
async def book(ctx: WorkflowContext, order_id: str) -> str:
    record_execution(f"book {ctx.instance_id}")
    return order_id


@activity
async def charge(ctx: WorkflowContext, order_id: str) -> str:
    raise TerminalError(f"the card for {order_id} was declined")


@workflow(name="day.compensated")
async def compensated(ctx: WorkflowContext, order_id: str) -> str:
    """Books, then fails for good at the charge: the booking is undone and it ends failed."""
    await book(ctx, order_id)
    return await charge(ctx, order_id)


@workflow(name="day.hourly", queue=HOURLY)
async def hourly(ctx: WorkflowContext, account: str, n: int) -> int:
    """At most one start an hour per account: a second one waits in the queue."""
    return n
