"""The workflow the broker tests run: started by an event, woken by another, answering by
the outbox (which the relayer publishes to a broker)."""

from __future__ import annotations

from typing import Any

from kenning import App, WorkflowContext, activity, wait_event, workflow
from kenning.outbox import send_event_transactional

app = App("kenning-broker-tests")

ANSWER_TYPE = "broker.answered"


@activity
async def answer(ctx: WorkflowContext, order_id: str, amount: int) -> str:
    return await send_event_transactional(
        ctx, ANSWER_TYPE, "/kenning/tests/brokers", {"order_id": order_id, "amount": amount}
    )


@workflow(event_handler=True, name="broker.order")
async def broker_order(ctx: WorkflowContext, order_id: str) -> dict[str, Any]:
    # since: a payment that arrived before the wait began is taken too, so tests need not order them
    paid = await wait_event(ctx, "broker.paid", match={"order_id": order_id}, since=300, timeout_seconds=600)
    answer_id = await answer(ctx, order_id, paid.data["amount"])
    return {"order_id": order_id, "amount": paid.data["amount"], "paid_via": paid.source, "answer_id": answer_id}
