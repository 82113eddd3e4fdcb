"""A workflow that stores a marker in every kind of user payload (issue 36, item 1):
its input, an activity's result (JSON and ``bytes``) and (on a first attempt) its error,
an outbox event (JSON and binary data), a published value, a stream entry, a received
message and its reply, a compensation's arguments, a timer the scheduler fires, and its
result; and a workflow waiting for an event by ``match`` (the event's data sealed in the
inbox by the ingress)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from kenning import (
    App,
    RetryPolicy,
    TerminalError,
    WorkflowContext,
    activity,
    compensation,
    publish_value,
    receive,
    register_compensation,
    send_event_transactional,
    wait_event,
    wait_timer,
    workflow,
    write_stream,
)

app = App("kenning-encryption-tests")


@activity(retry_policy=RetryPolicy(initial_interval=0.01, max_attempts=3))
async def charge(ctx: WorkflowContext, card: str) -> dict[str, Any]:
    if ctx.heartbeat_details != "tried":  # the first attempt fails, naming the card
        ctx.heartbeat("tried")
        raise RuntimeError(f"declined {card}")
    await send_event_transactional(ctx, "card.charged", "tests/encryption", {"card": card})
    # binary data: sealed in the outbox, opened by the relayer to publish the original bytes
    await send_event_transactional(ctx, "card.imprinted", "tests/encryption", b"\xff imprint of " + card.encode())
    return {"receipt": f"receipt of {card}"}


@activity
async def imprint(ctx: WorkflowContext, card: str) -> bytes:
    """A ``bytes`` result: sealed in its history record, read back whole on replay."""
    return f"carbon of {card}".encode()


@compensation
async def refund(ctx: WorkflowContext, card: str) -> None:
    return None


@activity
async def ship(ctx: WorkflowContext, card: str) -> None:
    raise TerminalError(f"cannot ship to {card}")


@workflow(name="encryption.pay")
async def pay(ctx: WorkflowContext, card: str) -> str:
    receipt = await charge(ctx, card)
    carbon = await imprint(ctx, card)
    await publish_value(ctx, "receipt", receipt)
    await write_stream(ctx, "log", {"charged": card})
    note = await receive(ctx, "note")
    await note.reply(ctx, {"noted": note.data})
    await wait_timer(ctx, 0.2)
    return f"paid {receipt['receipt']} after {note.data}, {carbon.decode()}"


@workflow(name="encryption.fails")
async def fails(ctx: WorkflowContext, card: str) -> None:
    await register_compensation(ctx, refund, card)
    await ship(ctx, card)


@workflow(name="encryption.settles")
async def settles(ctx: WorkflowContext, order: str) -> str:
    """Takes the ``card.settled`` event of its order, received up to ten minutes before it
    started (the inbox's candidates, sealed: matched after opening) or after."""
    event = await wait_event(ctx, "card.settled", match={"order": order}, since=timedelta(minutes=10))
    return f"settled {event.data['card']}"


@workflow(name="encryption.scans")
async def scans(ctx: WorkflowContext) -> str:
    """Takes a ``card.scanned`` event of binary data (sealed in the inbox and its history)."""
    event = await wait_event(ctx, "card.scanned", since=timedelta(minutes=10))
    return f"scanned {event.data.decode()}"
