"""Workflows and a handler the console's tests run (tests/system/test_console_actions.py,
tests/system/test_console_browser.py).

Activities append a line to the side channel each time they really run, so a test can
tell a replayed step from one run again. ``CONSOLE_TEST_BLOCKER`` names a file: while it
exists, ``deliver`` and the ``audit.recorded`` handler fail, so a test makes an instance
fail or an event park, then removes the file and retries from the console.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter

from kenning import (
    App,
    ReceivedEvent,
    RetryPolicy,
    TerminalError,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    wait_event,
    workflow,
)
from kenning.outbox import send_event_transactional
from tests.sidechannel import record_execution

app = App("kenning-console-tests")


def blocked() -> bool:
    path = os.environ.get("CONSOLE_TEST_BLOCKER", "")
    return bool(path) and os.path.exists(path)


# ------------------------------------------------------------------ a saga to cancel


@compensation
async def release_stock(ctx: WorkflowContext, order_id: str, quantity: int, *, reservation: str) -> None:
    record_execution(f"release {ctx.instance_id} {reservation}")


@activity
@on_failure(release_stock)
async def reserve_stock(ctx: WorkflowContext, order_id: str, quantity: int) -> dict[str, str]:
    record_execution(f"reserve {ctx.instance_id}")
    await send_event_transactional(ctx, "stock.reserved", "/console-tests", {"order_id": order_id}, subject=order_id)
    return {"reservation": f"res-{order_id}"}


@workflow(name="shop.order")
async def shop_order(ctx: WorkflowContext, order_id: str, quantity: int = 1) -> str:
    """Reserves stock, then waits for its payment: a cancel meanwhile releases the stock."""
    await reserve_stock(ctx, order_id, quantity)
    await wait_event(ctx, "payment.received", match={"order_id": order_id}, timeout_seconds=3600)
    return f"paid {order_id}"


# ------------------------------------------------------------------ a step that needs three tries

_tries: Counter[str] = Counter()  # per instance, in this worker process: the retries are inline
WEIGH_SECONDS = 0.3  # what the last attempt takes


@activity(retry_policy=RetryPolicy(initial_interval=0.05, max_interval=0.05, max_attempts=3))
async def weigh(ctx: WorkflowContext, parcel: str) -> int:
    _tries[ctx.instance_id] += 1
    if _tries[ctx.instance_id] < 3:
        raise RuntimeError(f"the scale has not settled for {parcel}")
    await asyncio.sleep(WEIGH_SECONDS)
    return 7


@workflow(name="shop.weigh")
async def weigh_parcel(ctx: WorkflowContext, parcel: str) -> int:
    """One step, its third attempt the one that succeeds (the console's timeline shows it)."""
    return await weigh(ctx, parcel)


# ------------------------------------------------------------------ a step on a long back-off


@activity(retry_policy=RetryPolicy(initial_interval=3600, max_interval=3600, max_attempts=3))
async def charge(ctx: WorkflowContext, order_id: str) -> str:
    raise RuntimeError(f"the card for {order_id} was declined")


@workflow(name="shop.charge")
async def charge_order(ctx: WorkflowContext, order_id: str) -> str:
    """Its step fails once, then waits an hour for its next attempt (the worker let it go)."""
    return await charge(ctx, order_id)


# ------------------------------------------------------------------ a failure to retry


@activity
async def prepare(ctx: WorkflowContext, order_id: str) -> str:
    record_execution(f"prepare {ctx.instance_id}")
    return f"prepared {order_id}"


@activity(retry_policy=RetryPolicy(initial_interval=0.05, max_interval=0.05, max_attempts=2))
async def deliver(ctx: WorkflowContext, order_id: str) -> str:
    record_execution(f"deliver {ctx.instance_id}")
    if blocked():
        raise RuntimeError(f"the warehouse is closed for {order_id}")
    return f"delivered {order_id}"


@workflow(name="shop.fulfil")
async def fulfil(ctx: WorkflowContext, order_id: str) -> str:
    """Fails (after deliver's 2 attempts) while the blocker exists."""
    prepared = await prepare(ctx, order_id)
    delivered = await deliver(ctx, order_id)
    return f"{prepared}, {delivered}"


# ------------------------------------------------------------------ an event to park


@app.on_event("audit.recorded")
async def audit(event: ReceivedEvent) -> None:
    record_execution(f"audit {event.id}")
    if blocked():
        raise TerminalError(f"the audit store refuses {event.id}: it is read-only")
