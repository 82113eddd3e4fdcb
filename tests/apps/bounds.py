"""Code that holds a transaction open for longer than the sessions' idle bound: an
activity idle inside its ``ctx.session`` transaction, and ``on_event`` handlers that take
their time inside the inbox row's transaction (one with a session, one without). Each
appends a line to the side channel when it has finished."""

from __future__ import annotations

import asyncio

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from kenning import App, ReceivedEvent, WorkflowContext, activity, workflow
from tests.sidechannel import record_execution

app = App("kenning-bounds-tests")


@activity
async def write_then_idle(ctx: WorkflowContext, seconds: float) -> int:
    value = (await ctx.session.execute(text("SELECT 7"))).scalar_one()
    await asyncio.sleep(seconds)  # idle inside the transaction, as slow outside I/O would be
    record_execution(f"idled {ctx.instance_id}")
    return int(value)


@workflow
async def idles_in_session(ctx: WorkflowContext, seconds: float) -> int:
    return await write_then_idle(ctx, seconds)


@app.on_event("bounds.slow")
async def slow(event: ReceivedEvent) -> None:
    await asyncio.sleep(float(event.data["seconds"]))
    record_execution(f"slow {event.id}")


@app.on_event("bounds.slow_session")
async def slow_session(event: ReceivedEvent, session: AsyncSession) -> None:
    await session.execute(text("SELECT 1"))
    await asyncio.sleep(float(event.data["seconds"]))
    record_execution(f"slow_session {event.id}")
