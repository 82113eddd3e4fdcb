"""Workflows ending in each terminal state, for the result-notification tests
(tests/system/test_results.py): each passes a gate first, an activity that waits while the file
``KENNING_TEST_GATE_FILE`` exists, so a test can have every caller waiting before any of
them finishes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from kenning import (
    App,
    TerminalError,
    WorkflowContext,
    activity,
    compensation,
    register_compensation,
    wait_event,
    workflow,
)

app = App("kenning-results-tests")


@activity
async def gate(ctx: WorkflowContext) -> None:
    path = Path(os.environ.get("KENNING_TEST_GATE_FILE", "/nonexistent"))
    while path.exists():
        await asyncio.sleep(0.02)


@activity
async def give_up(ctx: WorkflowContext) -> None:
    raise TerminalError("given up")


@compensation
async def undo(ctx: WorkflowContext) -> None:
    return None


@compensation
async def undo_fails(ctx: WorkflowContext) -> None:
    raise TerminalError("cannot undo")


@workflow
async def gated_sum(ctx: WorkflowContext, value: int) -> int:
    await gate(ctx)
    return value + 1


@workflow
async def gated_failure(ctx: WorkflowContext) -> None:
    await gate(ctx)
    await give_up(ctx)


@workflow
async def gated_compensated(ctx: WorkflowContext) -> None:
    await gate(ctx)
    await register_compensation(ctx, undo)
    await give_up(ctx)


@workflow
async def gated_saga_failure(ctx: WorkflowContext) -> None:
    await gate(ctx)
    await register_compensation(ctx, undo_fails)
    await give_up(ctx)


@workflow
async def awaits_cancel(ctx: WorkflowContext, key: str) -> None:
    await register_compensation(ctx, undo)
    await wait_event(ctx, "results.never", match={"key": key})
