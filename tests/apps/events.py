"""Workflows and ``on_event`` handlers the ingress and delivery tests run.

Activities and handlers append a line to the side channel each time they really run, so
tests can count executions across processes.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from kenning import (
    App,
    ReceivedEvent,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    wait_event,
    wait_timer,
    workflow,
)
from tests.sidechannel import executions, record_execution

app = App("kenning-event-tests")


class Payment(BaseModel):
    order_id: str
    amount: int


class User(BaseModel):
    email: str
    plan: str


@activity
async def note(ctx: WorkflowContext, label: str) -> str:
    record_execution(f"{label} {ctx.instance_id}")
    return label


# ------------------------------------------------------------------ the docs example


@workflow(event_handler=True, name="order.placed")
async def order_placed(ctx: WorkflowContext, order_id: str, amount: int) -> dict[str, Any]:
    await note(ctx, f"reserve:{order_id}")
    payment = await wait_event(
        ctx, "payment.completed", match={"order_id": order_id}, since=300, timeout_seconds=3600, model=Payment
    )
    assert isinstance(payment.data, Payment)
    return {"order_id": order_id, "amount": amount, "paid": payment.data.amount, "payment_source": payment.source}


# ------------------------------------------------------------------ waiting


def _summary(event: ReceivedEvent) -> dict[str, Any]:
    data = event.data
    return {
        "id": event.id,
        "source": event.source,
        "type": event.type,
        "subject": event.subject,
        "time": event.time,
        "datacontenttype": event.datacontenttype,
        "extensions": event.extensions,
        "data": data.hex() if isinstance(data, bytes) else data,
        "data_kind": type(data).__name__,
    }


@workflow
async def waits_for(ctx: WorkflowContext, key: str, since: float | None = None) -> dict[str, Any]:
    """Waits for ``test.ping`` whose data has ``key``."""
    event = await wait_event(ctx, "test.ping", match={"key": key}, since=since)
    return _summary(event)


@workflow
async def waits_any(ctx: WorkflowContext) -> dict[str, Any]:
    """Waits for any ``test.broadcast`` (no match: Edda's broadcast)."""
    return _summary(await wait_event(ctx, "test.broadcast"))


@workflow
async def waits_blob(ctx: WorkflowContext) -> dict[str, Any]:
    """Waits for any ``test.blob``; tests address it with ``kenninginstanceid``."""
    return _summary(await wait_event(ctx, "test.blob"))


@workflow
async def waits_twice(ctx: WorkflowContext, key: str) -> list[str]:
    """Takes two ``test.ping`` events in a row, both possibly received before it waits."""
    first = await wait_event(ctx, "test.ping", match={"key": key}, since=60)
    await note(ctx, f"between:{first.id}")
    second = await wait_event(ctx, "test.ping", match={"key": key}, since=60)
    return [first.id, second.id]


@compensation
async def unreserve(ctx: WorkflowContext, key: str) -> None:
    record_execution(f"unreserve:{key} {ctx.instance_id}")


@activity
@on_failure(unreserve)
async def reserve_slot(ctx: WorkflowContext, key: str) -> dict[str, str]:
    record_execution(f"reserve_slot:{key} {ctx.instance_id}")
    return {}


@workflow
async def reserves_then_waits(ctx: WorkflowContext, key: str) -> str:
    await reserve_slot(ctx, key=key)
    await wait_event(ctx, "test.never", match={"key": key})
    return "not cancelled"


@activity
async def slow_step(ctx: WorkflowContext, key: str, seconds: float) -> None:
    record_execution(f"slow_step:{key} {ctx.instance_id}")
    await asyncio.sleep(seconds)


@workflow
async def reserves_slowly_then_waits(ctx: WorkflowContext, key: str, wait: str, seconds: float) -> str:
    """A cancel that arrives during ``slow_step`` meets the wait right after it."""
    await reserve_slot(ctx, key=key)
    await slow_step(ctx, key, seconds)
    if wait == "event":
        await wait_event(ctx, "test.never", match={"key": key})
    else:
        await wait_timer(ctx, 3600)
    return "not cancelled"


# ------------------------------------------------------------------ started by events


@workflow(event_handler=True, name="bulk.item")
async def bulk_item(ctx: WorkflowContext, n: int) -> int:
    """No activity: the 1,000-event test measures the event path, not step recording."""
    return n


@workflow(event_handler=True, name="signup.created")
async def signup_created(ctx: WorkflowContext, user: User) -> str:
    """One pydantic parameter: it receives the whole event data (Edda's rule)."""
    return f"{user.email}:{user.plan}"


# ------------------------------------------------------------------ on_event handlers


@app.on_event("audit.logged")
async def audit(event: ReceivedEvent) -> None:
    record_execution(f"audit {event['id']} {event['subject']} {event.get('traceparent', '-')}")


@app.on_event("flaky.thing")
async def flaky(event: ReceivedEvent) -> None:
    """Fails the first ``data.failures`` times it sees an event."""
    label = f"flaky {event.id}"
    record_execution(label)
    path = os.environ.get("KENNING_TEST_SIDE_CHANNEL", "")
    if executions(path)[label] <= int(event.data["failures"]):
        raise ConnectionError(f"downstream unavailable for {event.id}")


@app.on_event("poison.pill")
async def poison(event: ReceivedEvent) -> None:
    record_execution(f"poison {event.id}")
    raise RuntimeError("cannot digest this event")


@app.on_event("audit.stored")
async def stored(event: ReceivedEvent, session: AsyncSession) -> None:
    """Writes in the inbox row's transaction: kept only if the whole row commits."""
    await session.execute(text("INSERT INTO test_audit (event_id) VALUES (:id)"), {"id": event.id})
    if event.data.get("fail"):
        raise RuntimeError("fails after writing")
