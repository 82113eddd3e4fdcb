"""Version B of ``replay_order``: its first step changed, unpatched. Instances of A that
already reserved diverge at ``reserve:1``."""

from __future__ import annotations

from kenning import App, WorkflowContext, workflow
from tests.apps.replay_steps import reserve_v2, ship, wait_paid

app = App("replay-renamed")


@workflow(name="replay_order")
async def replay_order(ctx: WorkflowContext, order_id: str) -> str:
    how = await reserve_v2(ctx, order_id)
    await wait_paid(ctx, order_id)
    return await ship(ctx, order_id, how)
