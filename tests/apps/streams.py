"""Workflows that write durable streams (issue 34, item 1): a chat whose workflow code
writes a start and an end marker around an activity that streams tokens and fails its
first attempt after two of them (so the retry's entries carry attempt 2); one that
closes a stream explicitly, tries to write after the close, and waits for a message; one
that streams while it waits, so a reader follows it live."""

from __future__ import annotations

from typing import Any

from kenning import (
    App,
    RetryPolicy,
    StreamClosedError,
    StreamFullError,
    UnstorableValueError,
    WorkflowContext,
    activity,
    close_stream,
    receive,
    workflow,
    write_stream,
)
from kenning.core.limits import MAX_STREAM_ENTRY_CHARS

app = App("kenning-streams")


@activity(retry_policy=RetryPolicy(initial_interval=0.01, max_attempts=3))
async def generate(ctx: WorkflowContext, prompt: str) -> str:
    tried = ctx.heartbeat_details == "tried"
    words = prompt.split()
    for n, word in enumerate(words):
        await write_stream(ctx, "chat", {"token": word})
        if not tried and n == 1:
            ctx.heartbeat("tried")
            raise RuntimeError("the model dropped the connection")
    return " ".join(words)


@workflow
async def chat(ctx: WorkflowContext, prompt: str) -> dict[str, Any]:
    first = await write_stream(ctx, "chat", {"event": "start"})
    text = await generate(ctx, prompt)
    last = await write_stream(ctx, "chat", {"event": "end", "text": text})
    return {"first": first, "last": last}


@workflow
async def closes_early(ctx: WorkflowContext) -> str:
    await write_stream(ctx, "a", 1)
    await close_stream(ctx, "a")
    await close_stream(ctx, "a")  # closing again does nothing
    try:
        await write_stream(ctx, "a", 2)
    except StreamClosedError as error:
        refused = str(error)
    await write_stream(ctx, "b", "open")
    await receive(ctx, "go")
    return refused


@workflow
async def ticker(ctx: WorkflowContext, count: int) -> int:
    """Writes ``count`` entries, one per ``tick`` message, then ends (closing the stream)."""
    for n in range(count):
        await receive(ctx, "tick")
        await write_stream(ctx, "ticks", n)
    return count


@workflow
async def at_the_limits(ctx: WorkflowContext) -> dict[str, str]:
    """Writes one entry, waits (the test fills the stream meanwhile), then is refused."""
    await write_stream(ctx, "full", "first")
    await receive(ctx, "go")
    refused: dict[str, str] = {}
    try:
        await write_stream(ctx, "full", "one more")
    except StreamFullError as error:
        refused["full"] = str(error)
    try:
        await write_stream(ctx, "big", "x" * (MAX_STREAM_ENTRY_CHARS + 1))
    except UnstorableValueError as error:
        refused["big"] = str(error)
    return refused


@activity
async def announce_parts(ctx: WorkflowContext, parts: list[str]) -> int:
    for part in parts:
        await write_stream(ctx, "parts", {"part": part}, publish=True)
    return len(parts)


@workflow
async def announced(ctx: WorkflowContext, parts: list[str]) -> int:
    """Publishes its stream's entries to the relayer's targets, but the last one."""
    await write_stream(ctx, "parts", {"begin": len(parts)}, publish=True)
    count = await announce_parts(ctx, parts)
    await write_stream(ctx, "parts", "kept in the stream only")
    return count
