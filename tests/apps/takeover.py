"""Workflows for takeovers and late cancels through real workers: activities that wait
for a file to appear (so a test decides when a step ends), that run for a set time, or
that never return; an activity with a compensation as a workflow's last step.

Activities append ``name instance_id`` to the side channel each time they really run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from kenning import (
    App,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    register_compensation,
    wait_event,
    workflow,
)
from tests.sidechannel import record_execution

app = App("kenning-takeover-tests")


def side(label: str, ctx: WorkflowContext) -> None:
    record_execution(f"{label} {ctx.instance_id}")


async def _until_exists(path: str) -> None:
    while not Path(path).exists():
        await asyncio.sleep(0.05)


@compensation
async def unbook(ctx: WorkflowContext, item: str) -> None:
    side("unbook", ctx)


@activity
@on_failure(unbook)
async def book_when(ctx: WorkflowContext, item: str, release_file: str) -> str:
    side("book", ctx)
    await _until_exists(release_file)
    return item


@workflow
async def book_last(ctx: WorkflowContext, item: str, release_file: str) -> str:
    """Its last step is the gated booking: a cancel that lands while it runs must undo it."""
    return await book_when(ctx, item, release_file)


@activity
async def work_for(ctx: WorkflowContext, seconds: float) -> float:
    side("work", ctx)
    await asyncio.sleep(seconds)
    return seconds


@workflow
async def timed(ctx: WorkflowContext, seconds: float) -> float:
    return await work_for(ctx, seconds)


@activity
async def hang(ctx: WorkflowContext) -> None:
    side("hang", ctx)
    await asyncio.Event().wait()


@workflow
async def hung(ctx: WorkflowContext) -> None:
    await hang(ctx)


@compensation
async def unlist(ctx: WorkflowContext, item: str) -> None:
    side(f"unlist:{item}", ctx)


@workflow
async def listed_then_waits(ctx: WorkflowContext, order_id: str) -> str:
    """Two compensations registered without ids, then a wait: a cancel while it waits
    replays the body, which registers them again."""
    await work_for(ctx, 0.0)
    await register_compensation(ctx, unlist, "first")
    await register_compensation(ctx, unlist, "second")
    await wait_event(ctx, "never.comes", match={"order_id": order_id}, timeout_seconds=3600)
    return order_id


SESSION_MARK = "takeover-session-step"  # in the activity's transaction: a test's proxy sees it


@activity
async def write_when(ctx: WorkflowContext, release_file: str) -> str:
    """Runs in its own transaction (it touches ctx.session): the step's record and its
    commit follow once ``release_file`` exists."""
    from sqlalchemy import text

    side("write", ctx)
    await ctx.session.execute(text(f"SELECT '{SESSION_MARK}'"))
    await _until_exists(release_file)
    return ctx.instance_id


@workflow
async def session_step(ctx: WorkflowContext, release_file: str) -> str:
    return await write_when(ctx, release_file)
