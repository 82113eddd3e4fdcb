"""Workflows that publish values (issue 29, item 3): an order that publishes its status and
its searchable customer and region, then waits for a ``go`` message before publishing its
receipt; one that only publishes later, after a message."""

from __future__ import annotations

from typing import Any

from kenning import App, WorkflowContext, publish_value, receive, set_status, workflow

app = App("kenning-published")


@workflow(search_attributes=("customer", "region", "priority"))
async def published_order(ctx: WorkflowContext, customer: str, region: str, rank: int = 0) -> dict[str, Any]:
    await publish_value(ctx, "customer", customer)
    await publish_value(ctx, "region", region)
    await publish_value(ctx, "priority", rank)
    await set_status(ctx, "awaiting payment", progress=0.4)
    go = await receive(ctx, "go")
    await publish_value(ctx, "receipt", {"paid": go.data})
    await set_status(ctx, "paid", progress=1.0)
    return {"customer": customer}


@workflow
async def publishes_later(ctx: WorkflowContext) -> None:
    message = await receive(ctx, "go")
    await publish_value(ctx, "answer", message.data)
    await receive(ctx, "end")
