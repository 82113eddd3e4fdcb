"""Workflows the outbox tests run: activities that send events in their own transaction.

Activities append ``name instance_id`` to the side channel each time they really run.
``record_order`` writes to ``app_orders``, a table the test creates, through ``ctx.session``.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel
from sqlalchemy import text

from kenning import (
    App,
    HooksBase,
    RetryPolicy,
    TerminalError,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    workflow,
)
from kenning.outbox import send_event_transactional
from tests.sidechannel import executions, record_execution


class SentHooks(HooksBase):
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []

    async def on_event_sent(self, event_type: str, event_source: str, event_data: Any) -> None:
        self.sent.append((event_type, event_source, event_data))


hooks = SentHooks()
app = App("kenning-outbox-tests", hooks=hooks)

FAST = RetryPolicy(initial_interval=0.01, backoff_coefficient=1.0, max_interval=0.01, max_attempts=5)
BINARY = b"\xff\xfe\x00kenning"  # not UTF-8: stays bytes all the way to the receiver


class OrderPlaced(BaseModel):
    order_id: str
    total: int


def _count(label: str, ctx: WorkflowContext) -> int:
    """Record this run and return how many times this activity ran for this instance."""
    record_execution(f"{label} {ctx.instance_id}")
    return executions_count(f"{label} {ctx.instance_id}")


def executions_count(key: str) -> int:
    path = os.environ.get("KENNING_TEST_SIDE_CHANNEL")
    return executions(path)[key] if path else 0


@activity
async def announce(ctx: WorkflowContext, order_id: str) -> list[str]:
    _count("announce", ctx)
    placed = await send_event_transactional(
        ctx,
        "order.placed",
        "/shop/orders",
        OrderPlaced(order_id=order_id, total=42),
        subject=order_id,
        extensions={"tenant": "acme", "priority": 5, "urgent": True},
    )
    blob = await send_event_transactional(ctx, "order.label", "/shop/labels", BINARY)
    note = await send_event_transactional(ctx, "order.note", "/shop/notes", "thank you", "text/plain")
    return [placed, blob, note]


@activity(retry_policy=RetryPolicy(initial_interval=0.2, max_interval=0.2, max_attempts=3))
async def pause_once(ctx: WorkflowContext) -> None:
    # The first attempt fails with a back-off longer than the worker's inline retry limit,
    # so the instance is released and replayed: announce must not send again.
    if _count("pause_once", ctx) == 1:
        raise RuntimeError("pause once")


@workflow
async def outbox_announce(ctx: WorkflowContext, order_id: str) -> list[str]:
    ids = await announce(ctx, order_id)
    await pause_once(ctx)
    return ids


@activity(retry_policy=FAST)
async def record_order(ctx: WorkflowContext, order_id: str, fail_times: int) -> str:
    attempt = _count("record_order", ctx)
    await ctx.session.execute(
        text("INSERT INTO app_orders (id, attempt) VALUES (:id, :n)"), {"id": order_id, "n": attempt}
    )
    event_id = await send_event_transactional(
        ctx, "order.recorded", "/shop", {"order_id": order_id, "attempt": attempt}
    )
    if attempt <= fail_times:
        raise RuntimeError(f"attempt {attempt} fails after sending")
    return event_id


@workflow
async def outbox_order(ctx: WorkflowContext, order_id: str, fail_times: int) -> str:
    return await record_order(ctx, order_id, fail_times)


@activity
async def record_then_give_up(ctx: WorkflowContext, order_id: str) -> None:
    _count("record_then_give_up", ctx)
    await ctx.session.execute(text("INSERT INTO app_orders (id, attempt) VALUES (:id, 1)"), {"id": order_id})
    await send_event_transactional(ctx, "order.recorded", "/shop", {"order_id": order_id})
    raise TerminalError("payment declined")


@workflow
async def outbox_give_up(ctx: WorkflowContext, order_id: str) -> None:
    await record_then_give_up(ctx, order_id)


@workflow
async def outbox_from_workflow(ctx: WorkflowContext) -> str:
    return await send_event_transactional(ctx, "order.placed", "/shop", {"wrong": "place"})


@activity
async def invalid_sends(ctx: WorkflowContext) -> list[str]:
    attempts: list[dict[str, Any]] = [
        {"event_type": "", "event_source": "/s", "event_data": {}},
        {"event_type": "t", "event_source": "/s", "event_data": {}, "extensions": {"Bad-Name": "x"}},
        {"event_type": "t", "event_source": "/s", "event_data": {}, "extensions": {"subject": "x"}},
        {"event_type": "t", "event_source": "/s", "event_data": {}, "extensions": {"big": 2**40}},
        {"event_type": "t", "event_source": "/s", "event_data": {}, "extensions": {"when": 1.5}},
        {"event_type": "t", "event_source": "/s", "event_data": {"text": "nul\x00"}},
        {"event_type": "t", "event_source": "/s", "event_data": {"a": 1}, "content_type": "text/plain"},
        {"event_type": "t", "event_source": "/s", "event_data": object()},
        {"event_type": "t\x00", "event_source": "/s", "event_data": {}},
    ]
    messages = []
    for kwargs in attempts:
        try:
            await send_event_transactional(ctx, **kwargs)
        except (TypeError, ValueError) as error:
            messages.append(str(error))
        else:
            messages.append("accepted")
    return messages


@workflow
async def outbox_invalid(ctx: WorkflowContext) -> list[str]:
    return await invalid_sends(ctx)


@activity
async def emit_one(ctx: WorkflowContext, seq: int) -> str:
    return await send_event_transactional(ctx, "sequence.step", "/sequence", {"seq": seq}, subject=str(seq))


@workflow
async def outbox_sequence(ctx: WorkflowContext, count: int) -> list[str]:
    return [await emit_one(ctx, seq) for seq in range(count)]


@compensation
async def announce_cancellation(ctx: WorkflowContext, order_id: str) -> None:
    await send_event_transactional(ctx, "order.cancelled", "/shop", {"order_id": order_id})


@activity
@on_failure(announce_cancellation)
async def reserve_order(ctx: WorkflowContext, order_id: str) -> None:
    await send_event_transactional(ctx, "order.reserved", "/shop", {"order_id": order_id})


@activity
async def charge_card(ctx: WorkflowContext) -> None:
    raise TerminalError("card declined")


@workflow
async def outbox_saga(ctx: WorkflowContext, order_id: str) -> None:
    await reserve_order(ctx, order_id)
    await charge_card(ctx)
