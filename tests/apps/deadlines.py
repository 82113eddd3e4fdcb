"""Workflows with a timeout (issue 29, item 2): one that waits for a payment that never
comes, one busy in an activity when its deadline passes, one that ends in time. Each
activity and compensation appends ``name instance_id`` to the side channel."""

from __future__ import annotations

import asyncio

from kenning import (
    App,
    ChildWorkflowFailed,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    start_child,
    wait_event,
    workflow,
)
from tests.sidechannel import record_execution

app = App("kenning-deadlines")


@compensation
async def release_stock(ctx: WorkflowContext, order_id: str) -> None:
    record_execution(f"release_stock {ctx.instance_id}")


@activity
@on_failure(release_stock)
async def reserve_stock(ctx: WorkflowContext, order_id: str) -> dict[str, str]:
    record_execution(f"reserve_stock {ctx.instance_id}")
    return {"reservation": f"r-{order_id}"}


@activity
async def slow_step(ctx: WorkflowContext, seconds: float) -> None:
    record_execution(f"slow_step {ctx.instance_id}")
    await asyncio.sleep(seconds)


@workflow(timeout=1.0)
async def awaiting_payment(ctx: WorkflowContext, order_id: str) -> str:
    await reserve_stock(ctx, order_id)
    await wait_event(ctx, "payment.completed", match={"order_id": order_id})  # never sent
    return "paid"


@workflow
async def unbounded_order(ctx: WorkflowContext, order_id: str) -> str:
    """No timeout of its own: a start gives it one (``wf.options(timeout=...)``)."""
    await reserve_stock(ctx, order_id)
    await wait_event(ctx, "payment.completed", match={"order_id": order_id})
    return "paid"


@workflow(timeout=1.0)
async def busy_at_deadline(ctx: WorkflowContext, order_id: str) -> str:
    await reserve_stock(ctx, order_id)
    await slow_step(ctx, 2.0)  # running when the deadline passes: stopped at the next step
    await reserve_stock(ctx, f"{order_id}-2")
    return "done"


@workflow(timeout=1.0)
async def in_time(ctx: WorkflowContext, order_id: str) -> str:
    await reserve_stock(ctx, order_id)
    return "done"


@workflow
async def parent_of_a_bounded_child(ctx: WorkflowContext, order_id: str) -> str:
    """Its child (awaiting_payment, 1 s) times out from its own start; the parent has none."""
    child = await start_child(ctx, awaiting_payment, order_id=order_id)
    try:
        return await child.result()
    except ChildWorkflowFailed as failed:
        return f"child {failed.status}: {failed.error['type'] if failed.error else None}"
