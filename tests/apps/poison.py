"""Workflows that take their worker down: one whose activity kills the process (standing
in for an OOM kill or a segfault) while ``KENNING_TEST_POISON_FILE`` exists, bystanders
started beside it, and activities that hang (async and sync) for the shutdown bound.

Activities append ``name instance_id`` to the side channel each time they really run.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from kenning import App, WorkflowContext, activity, workflow
from tests.sidechannel import record_execution

app = App("kenning-poison-tests")


def side(label: str, ctx: WorkflowContext) -> None:
    record_execution(f"{label} {ctx.instance_id}")


@activity
async def explode(ctx: WorkflowContext, value: int) -> int:
    side("explode", ctx)
    await asyncio.sleep(0.1)  # the bystanders claimed with it are in flight by now
    if Path(os.environ.get("KENNING_TEST_POISON_FILE", "/nonexistent")).exists():
        os._exit(1)
    return value


@workflow
async def crash_looper(ctx: WorkflowContext, value: int) -> int:
    return await explode(ctx, value)


@activity
async def dawdle(ctx: WorkflowContext, value: int) -> int:
    side("dawdle", ctx)
    await asyncio.sleep(0.3)
    return value + 1


@workflow
async def bystander(ctx: WorkflowContext, value: int) -> int:
    first = await dawdle(ctx, value)
    return await dawdle(ctx, first)


@activity
async def hang_async(ctx: WorkflowContext) -> None:
    side("hang_async", ctx)
    await asyncio.Event().wait()


@activity
def hang_sync(ctx: WorkflowContext) -> None:  # in a thread, which nothing can stop
    side("hang_sync", ctx)
    time.sleep(3600)


@workflow
async def hung_async(ctx: WorkflowContext) -> None:
    await hang_async(ctx)


@workflow
async def hung_sync(ctx: WorkflowContext) -> None:
    await hang_sync(ctx)
