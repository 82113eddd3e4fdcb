"""Workflows waiting for events by ``match`` (issue 36): the tests seal the events' data in
the inbox and check each wait takes what it took from plain data."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from kenning import App, Batch, EventTimeoutError, WorkflowContext, start_child, wait_event, wait_timer, workflow

app = App("kenning-sealed-events-tests")
EVENT = "order.paid"


@workflow(name="sealed.takes_two")
async def takes_two(ctx: WorkflowContext, order: str) -> list[Any]:
    """The two oldest events of its order received in the last hour, or after it started."""
    first = await wait_event(ctx, EVENT, match={"order": order}, since=timedelta(hours=1))
    second = await wait_event(ctx, EVENT, match={"order": order}, since=timedelta(hours=1))
    return [first.data["n"], second.data["n"]]


@workflow(name="sealed.takes_one")
async def takes_one(ctx: WorkflowContext, order: str) -> Any:
    event = await wait_event(ctx, EVENT, match={"order": order}, since=timedelta(hours=1))
    return event.data["n"]


@workflow(name="sealed.times_out")
async def times_out(ctx: WorkflowContext, order: str) -> str:
    try:
        await wait_event(ctx, EVENT, match={"order": order}, since=timedelta(hours=1), timeout_seconds=30)
    except EventTimeoutError:
        return "timed out"
    return "taken"


@workflow(name="sealed.child")
async def child(ctx: WorkflowContext, card: str) -> str:
    return f"child saw {card}"


@workflow(name="sealed.parent")
async def parent(ctx: WorkflowContext, card: str) -> str:
    """Its child's end comes through the inbox (kenning.child.finished), the result sealed."""
    handle = await start_child(ctx, child, card=card)
    if card.startswith("later"):  # the child ends first: the parent finds its end in the inbox
        await wait_timer(ctx, 60)
    return await handle.result()


@workflow(name="sealed.batch", event_handler=True, batch=Batch(max_size=5, max_wait=120, key="tenant"))
async def batch(ctx: WorkflowContext, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Five events a batch, due when full: however slowly large events arrive."""
    return events
