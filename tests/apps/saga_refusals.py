"""Sagas whose compensations the database refuses to store (tests/integration/test_unstorable.py).

The refusals themselves are patched into the storage functions by the tests: what the
engine checks before a write (``serialization.storable_json``) leaves no value that would
reach PostgreSQL and be refused, so only a stand-in can exercise the fallback behind it.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from kenning import App, TerminalError, WorkflowContext, activity, on_failure, register_compensation, workflow
from tests.apps.limits import cancel_booking, side

app = App("kenning-saga-refusals")


@activity
@on_failure(cancel_booking)
async def book_now(ctx: WorkflowContext, booking: str) -> dict[str, str]:
    """It touches ``ctx.session``, so its record and its compensation are written at once:
    nothing is left waiting for the next write."""
    side("book_now", ctx)
    await ctx.session.execute(text("SELECT 1"))
    return {"booking": booking}


@activity
async def until_cancelled(ctx: WorkflowContext) -> None:
    """Returns once the test asked for the instance's cancellation; its record, written at
    once (``ctx.session``), is the write that tells the engine."""
    for _ in range(600):
        row = (
            await ctx.session.execute(
                text("SELECT cancel_requested AS cancel_requested FROM kenning_instances WHERE id = :id"),
                {"id": ctx.instance_id},
            )
        ).first()
        if row is not None and row.cancel_requested:
            return
        await asyncio.sleep(0.05)
    raise TerminalError("the test never cancelled the instance")


@workflow
async def late_compensation(ctx: WorkflowContext, cancel: bool = False) -> None:
    """A compensation registered after the last write is still unsaved when the saga begins:
    it rides in the statement that makes the instance ``compensating``."""
    await book_now(ctx, "b-early")
    if cancel:
        await until_cancelled(ctx)
    await register_compensation(ctx, cancel_booking, "b-late")
    if cancel:
        await book_now(ctx, "b-never")  # the cancellation stops the workflow at this step's boundary
    raise TerminalError("declined")
