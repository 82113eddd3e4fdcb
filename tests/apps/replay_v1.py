"""Version A of ``replay_order``: reserve, wait for the payment, ship."""

from __future__ import annotations

from kenning import App, WorkflowContext, workflow
from tests.apps.replay_steps import reserve, ship, wait_paid

app = App("replay-v1")


@workflow(name="replay_order")
async def replay_order(ctx: WorkflowContext, order_id: str) -> str:
    how = await reserve(ctx, order_id)
    await wait_paid(ctx, order_id)
    return await ship(ctx, order_id, how)
