"""Version B'' of ``replay_order``: B's change behind ``ctx.patched``, so instances of A
that already reserved finish on the old path and new ones take the new one."""

from __future__ import annotations

from kenning import App, WorkflowContext, workflow
from tests.apps.replay_steps import reserve, reserve_v2, ship, wait_paid

app = App("replay-patched")


@workflow(name="replay_order")
async def replay_order(ctx: WorkflowContext, order_id: str) -> str:
    if await ctx.patched("reserve-v2"):
        how = await reserve_v2(ctx, order_id)
    else:
        how = await reserve(ctx, order_id)
    await wait_paid(ctx, order_id)
    return await ship(ctx, order_id, how)
