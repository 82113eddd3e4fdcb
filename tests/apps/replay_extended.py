"""Version B' of ``replay_order``: a step added after the wait, where no instance of A
waiting for its payment has been yet."""

from __future__ import annotations

from kenning import App, WorkflowContext, workflow
from tests.apps.replay_steps import notify, reserve, ship, wait_paid

app = App("replay-extended")


@workflow(name="replay_order")
async def replay_order(ctx: WorkflowContext, order_id: str) -> str:
    how = await reserve(ctx, order_id)
    await wait_paid(ctx, order_id)
    await notify(ctx, order_id)
    return await ship(ctx, order_id, how)
