"""Workflows whose step after an activity writes rows with its record (a message, a
published value, a stream entry): the activity's record is held back and commits in that
step's transaction. The activity runs until the test lets it go (``RUNNING``/``RELEASE``,
replaced by each test), so a cancel can be committed while it runs."""

from __future__ import annotations

import asyncio
from typing import Any

from kenning import App, WorkflowContext, activity, publish_value, receive, send_message, workflow, write_stream

app = App("kenning-folded")

RUNNING = asyncio.Event()
RELEASE = asyncio.Event()


@activity
async def hold(ctx: WorkflowContext) -> int:
    RUNNING.set()
    await RELEASE.wait()
    return 1


@workflow(name="folded.after_activity")
async def after_activity(ctx: WorkflowContext, write: str, peer: str) -> None:
    n = await hold(ctx)
    if write == "message":
        await send_message(ctx, peer, "news", n)
    elif write == "value":
        await publish_value(ctx, "n", n)
    else:
        await write_stream(ctx, "talk", n)


@workflow(name="folded.waits")
async def waits(ctx: WorkflowContext) -> Any:
    """The message's recipient: waiting for it."""
    return (await receive(ctx, "news")).data
