"""The activities of ``replay_order``, whose versions (``tests.apps.replay_v1`` and the
changed ones) ``tests/system/test_replay_check.py`` deploys over each other. Activities are
found by name in history, so every version shares these; each real run appends a line
to the side channel."""

from __future__ import annotations

from kenning import WorkflowContext, activity, wait_event
from tests.sidechannel import record_execution

PAID = "replay.paid"


@activity
async def reserve(ctx: WorkflowContext, order_id: str) -> str:
    record_execution(f"reserve {ctx.instance_id}")
    return "old path"


@activity
async def reserve_v2(ctx: WorkflowContext, order_id: str) -> str:
    record_execution(f"reserve_v2 {ctx.instance_id}")
    return "new path"


@activity
async def notify(ctx: WorkflowContext, order_id: str) -> None:
    record_execution(f"notify {ctx.instance_id}")


@activity
async def ship(ctx: WorkflowContext, order_id: str, how: str) -> str:
    record_execution(f"ship {ctx.instance_id}")
    return f"{order_id} shipped on the {how}"


async def wait_paid(ctx: WorkflowContext, order_id: str) -> None:
    await wait_event(ctx, PAID, match={"order_id": order_id})
