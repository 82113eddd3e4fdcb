"""The workflow tests/system/test_tracing.py traces: started by an event, an activity that can hold
its first attempt until the worker is killed, an outbox event, and an optional wait."""

from __future__ import annotations

import asyncio
import os

from kenning import App, WorkflowContext, activity, wait_event, workflow
from kenning.outbox import send_event_transactional
from tests.sidechannel import executions, record_execution

app = App("kenning-tracing-tests")
ANNOUNCED = "trace.announced"
PAID = "trace.paid"


@activity
async def hold(ctx: WorkflowContext, order_id: str, crash: bool) -> None:
    """With ``crash``, the first attempt hangs: the test kills its worker meanwhile."""
    label = f"hold {order_id}"
    record_execution(label)
    path = os.environ.get("KENNING_TEST_SIDE_CHANNEL", "")
    if crash and path and executions(path)[label] == 1:
        await asyncio.sleep(600)


@activity
async def announce(ctx: WorkflowContext, order_id: str, stage: str) -> str:
    return await send_event_transactional(ctx, ANNOUNCED, "/tracing", {"order_id": order_id, "stage": stage})


@workflow(event_handler=True, name="trace.order")
async def traced_order(ctx: WorkflowContext, order_id: str, crash: bool = False, wait: bool = False) -> str:
    await hold(ctx, order_id, crash)
    await announce(ctx, order_id, "placed")
    if wait:
        await wait_event(ctx, PAID, match={"order_id": order_id}, timeout_seconds=120)
        await announce(ctx, order_id, "paid")
    return order_id
