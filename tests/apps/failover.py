"""The failover test's app (``tests/system/test_failover.py``): each ``failover.order``
event starts a workflow of three steps; every step appends ``step <instance id> <step id>``
to the side channel each time it really runs, so the test checks each committed once."""

from __future__ import annotations

from kenning import App, WorkflowContext, activity, workflow
from tests.sidechannel import record_execution

app = App("kenning-failover")


@activity
async def effect(ctx: WorkflowContext, n: int) -> int:
    record_execution(f"step {ctx.instance_id} effect:{n}")
    return n


@workflow(event_handler=True, name="failover.order")
async def failover_order(ctx: WorkflowContext, n: int) -> int:
    total = 0
    for step in (1, 2, 3):
        total += await effect(ctx, step)
    return n + total
