"""Workflows with large values, for the object store tests (tests/system/test_offload.py):
an activity's result and a workflow's result of ``size`` bytes, and a second step after
the large one so a replay reads the large result back from the store; every other kind of
payload (an input, a published value, a stream entry, a message, a reply) of one instance."""

from __future__ import annotations

import hashlib

from kenning import (
    App,
    UnstorableValueError,
    WorkflowContext,
    activity,
    close_stream,
    publish_value,
    receive,
    send_event_transactional,
    start_child,
    subscribe,
    wait_event,
    workflow,
    write_stream,
)

app = App("kenning-offload-tests")


def blob(size: int, seed: str = "k") -> str:
    """``size`` characters of text (JSON of about ``size + 2`` bytes), reproducible."""
    unit = hashlib.sha256(seed.encode()).hexdigest()
    return (unit * (size // len(unit) + 1))[:size]


@activity
async def make_blob(ctx: WorkflowContext, size: int, seed: str) -> str:
    return blob(size, seed)


@activity
async def digest(ctx: WorkflowContext, text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@workflow
async def large_values(ctx: WorkflowContext, size: int, seed: str = "k") -> dict[str, str]:
    """A large step result read by the next step, and a large workflow result."""
    text = await make_blob(ctx, size, seed)
    return {"text": text, "digest": await digest(ctx, text)}


@workflow
async def large_child_result(ctx: WorkflowContext, size: int, seed: str = "k") -> str:
    """A child's large result, read by its parent through the child's reference."""
    child = await start_child(ctx, large_values, size=size, seed=seed)
    value = await child.result()
    return await digest(ctx, value["text"])


@workflow
async def large_then_receive(ctx: WorkflowContext, size: int, seed: str = "k") -> str:
    """A large step result, then a wait: the run after the message replays the step,
    reading its value back from the store."""
    text = await make_blob(ctx, size, seed)
    await receive(ctx, "go")
    return await digest(ctx, text)


@activity
async def make_bytes(ctx: WorkflowContext, size: int, seed: str) -> bytes:
    """A large ``bytes`` result, also sent as an outbox event's binary data."""
    data = b"\xff" + blob(size, seed).encode()
    await send_event_transactional(ctx, "blob.made", "tests/offload", data)
    return data


@workflow
async def large_bytes_then_receive(ctx: WorkflowContext, size: int, seed: str = "k") -> str:
    """A large ``bytes`` result (sealed with keys), then a wait: the replay reads it back."""
    data = await make_bytes(ctx, size, seed)
    await receive(ctx, "go")
    return hashlib.sha256(data).hexdigest()


@workflow
async def every_kind(ctx: WorkflowContext, text: str, size: int, seed: str = "k") -> dict[str, str]:
    """A large input, published value, stream entry, received message and reply."""
    read_input = await digest(ctx, text)
    await publish_value(ctx, "big", blob(size, f"{seed}-value"))
    await write_stream(ctx, "big", blob(size, f"{seed}-entry"))
    await close_stream(ctx, "big")
    message = await receive(ctx, "big")
    read_message = await digest(ctx, message.data)
    request = await receive(ctx, "ask")
    await request.reply(ctx, blob(size, f"{seed}-reply"))
    return {"input": read_input, "message": read_message}


@workflow
async def publish_oversized(ctx: WorkflowContext, size: int) -> str:
    """A published value over its row's limit: refused before any write, the line returned."""
    try:
        await publish_value(ctx, "big", blob(size))
    except UnstorableValueError as error:
        return str(error)
    return "published"


@workflow
async def receive_in_turn(ctx: WorkflowContext) -> str:
    """Takes ``big`` only after ``first``: a message sent before waits in its mailbox."""
    await receive(ctx, "first")
    message = await receive(ctx, "big")
    return await digest(ctx, message.data)


@workflow
async def large_news(ctx: WorkflowContext) -> str:
    """A subscriber of channel ``news``: the broadcast's value, read back and digested."""
    await subscribe(ctx, "news")
    message = await receive(ctx, "news")
    return await digest(ctx, message.data)


@workflow
async def large_event(ctx: WorkflowContext) -> str:
    """Waits for event ``offload.big``: its large data, read back and digested."""
    event = await wait_event(ctx, "offload.big")
    return await digest(ctx, event.data["text"])
