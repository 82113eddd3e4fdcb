"""The order saga: every Kenning feature in one workflow.

A CloudEvent ``order.created`` starts it (pydantic input). It reserves stock and asks
for payment (``payment.requested``, through the outbox, in the same transaction as the
activity), waits for ``payment.completed`` correlated by order id (with a timeout),
captures the payment, waits out a cooling-off timer, and ships. A declined payment, a
timeout, a failed shipment or a cancellation undo what was done, newest first.

    kenning up        # runs this app (kenning.examples.orders) unless --app names another
    kenning send order.created --data '{"order_id": "o-1", "items": [{"sku": "book", "qty": 1}], "amount": 42}'
    kenning send payment.completed --data '{"order_id": "o-1", "status": "approved"}'

docs/quickstart.md walks through it with curl.
"""

from __future__ import annotations

import os
import uuid

import structlog
from pydantic import BaseModel, ConfigDict

from kenning import (
    App,
    EventTimeoutError,
    RetryPolicy,
    TerminalError,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    send_event_transactional,
    wait_event,
    wait_timer,
    workflow,
)

app = App("orders")
log = structlog.get_logger("examples.orders")

# Seconds; the tests shorten them through the environment.
PAYMENT_TIMEOUT = float(os.environ.get("ORDERS_PAYMENT_TIMEOUT_SECONDS", "300"))
COOLING_OFF = float(os.environ.get("ORDERS_COOLING_OFF_SECONDS", "1"))
# A payment service may answer before the workflow has subscribed (the reply to our own
# payment.requested, or an event posted right after order.created): take a
# payment.completed for this order received up to this long before the wait began.
PAYMENT_LOOKBACK = float(os.environ.get("ORDERS_PAYMENT_LOOKBACK_SECONDS", "600"))


class Item(BaseModel):
    sku: str
    qty: int


class OrderCreated(BaseModel):
    # the input `kenning up` suggests to try
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"order_id": "o-1", "items": [{"sku": "book", "qty": 1}], "amount": 42}]}
    )

    order_id: str
    items: list[Item]
    amount: int
    address: str = "1 Example Street"


class PaymentCompleted(BaseModel):
    order_id: str
    status: str  # "approved" or "declined"
    payment_id: str = ""


@compensation
async def release_inventory(ctx: WorkflowContext, order_id: str, items: list[Item], *, reservation_id: str) -> None:
    log.info("inventory.released", order_id=order_id, reservation_id=reservation_id)


@activity
@on_failure(release_inventory)  # registered with reserve's arguments and result each time it succeeds
async def reserve_inventory(ctx: WorkflowContext, order_id: str, items: list[Item]) -> dict[str, str]:
    log.info("inventory.reserved", order_id=order_id, skus=[i.sku for i in items])
    return {"reservation_id": f"res-{order_id}"}


@activity
async def request_payment(ctx: WorkflowContext, order: OrderCreated) -> str:
    # Published by the relayer if and only if this activity commits.
    return await send_event_transactional(
        ctx,
        "payment.requested",
        "examples/orders",
        {"order_id": order.order_id, "amount": order.amount},
        subject=order.order_id,
    )


@compensation
async def refund_payment(ctx: WorkflowContext, order_id: str, amount: int, *, capture_id: str) -> None:
    log.info("payment.refunded", order_id=order_id, amount=amount, capture_id=capture_id)


@activity(retry_policy=RetryPolicy(initial_interval=0.5, max_attempts=5))
@on_failure(refund_payment)
async def capture_payment(ctx: WorkflowContext, order_id: str, amount: int) -> dict[str, str]:
    log.info("payment.captured", order_id=order_id, amount=amount)
    return {"capture_id": f"cap-{uuid.uuid5(uuid.NAMESPACE_URL, order_id).hex[:12]}"}


@activity
async def ship(ctx: WorkflowContext, order_id: str, address: str) -> str:
    if address.lower().startswith("nowhere"):
        raise TerminalError(f"cannot ship order {order_id} to {address!r}")
    log.info("order.shipped", order_id=order_id, address=address)
    return f"trk-{order_id}"


@workflow(name="order.created", event_handler=True)
async def order_saga(ctx: WorkflowContext, order: OrderCreated) -> dict[str, str]:
    await reserve_inventory(ctx, order.order_id, order.items)
    await request_payment(ctx, order)
    try:
        payment = await wait_event(
            ctx,
            "payment.completed",
            timeout_seconds=PAYMENT_TIMEOUT,
            model=PaymentCompleted,
            match={"order_id": order.order_id},  # correlation: only this order's payment
            since=PAYMENT_LOOKBACK,
        )
    except EventTimeoutError:  # recorded by the scheduler; compensations run as for any failure
        raise TerminalError(f"no payment for order {order.order_id} within {PAYMENT_TIMEOUT:g} s") from None
    if payment.data.status != "approved":
        raise TerminalError(f"payment for order {order.order_id} was {payment.data.status}")
    await capture_payment(ctx, order.order_id, order.amount)
    await wait_timer(ctx, COOLING_OFF)  # the customer may still cancel
    tracking = await ship(ctx, order.order_id, order.address)
    return {"order_id": order.order_id, "tracking": tracking}
