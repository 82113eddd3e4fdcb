"""Workflows at the engine's limits: values PostgreSQL cannot store, activities that never end.

Activities append ``name instance_id`` to the side channel each time they really run, so a
test can tell one run from a replay loop.
"""

from __future__ import annotations

import asyncio
import time

from kenning import (
    ActivityTimeoutError,
    App,
    RetryExhaustedError,
    RetryPolicy,
    TerminalError,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    wait_event,
    workflow,
)
from tests.sidechannel import record_execution

app = App("kenning-limits")

FAST = RetryPolicy(initial_interval=0.01, backoff_coefficient=1.0, max_interval=0.01, max_attempts=3)
TWICE = RetryPolicy(initial_interval=0.01, backoff_coefficient=1.0, max_interval=0.01, max_attempts=2)


def side(label: str, ctx: WorkflowContext) -> None:
    record_execution(f"{label} {ctx.instance_id}")


# ------------------------------------------------------------------ values that cannot be stored


@compensation
async def cancel_booking(ctx: WorkflowContext, booking: str) -> None:
    side("cancel_booking", ctx)


@activity
@on_failure(cancel_booking)
async def book(ctx: WorkflowContext, booking: str) -> dict[str, str]:
    side("book", ctx)
    return {"booking": booking}


@activity
@on_failure(cancel_booking)
async def hold(ctx: WorkflowContext, booking: str) -> None:
    """Its result is clean; its compensation's argument (``booking``) need not be."""
    side("hold", ctx)


@activity(retry_policy=FAST)
async def returns_nul(ctx: WorkflowContext, nested: bool) -> object:
    side("returns_nul", ctx)
    return {"items": [{"name": "ok"}, {"name": "a\x00b"}]} if nested else "a\x00b"


@activity(retry_policy=FAST)
def returns_nan(ctx: WorkflowContext) -> float:  # sync: the check runs on its result too
    side("returns_nan", ctx)
    return float("nan")


@workflow
async def unstorable_result(ctx: WorkflowContext, nested: bool = False, catch: bool = False) -> str:
    """Books (an ``@on_failure`` compensation), then an activity returns a NUL."""
    await book(ctx, "b-1")
    if catch:
        try:
            await returns_nul(ctx, nested)
        except TerminalError as error:
            return f"caught: {error}"
    await returns_nul(ctx, nested)
    return "unreachable"


@workflow
async def unstorable_number(ctx: WorkflowContext) -> str:
    try:
        await returns_nan(ctx)
    except TerminalError as error:
        return f"caught: {error}"
    return "unreachable"


@activity(retry_policy=FAST)
async def fails_with_nul(ctx: WorkflowContext) -> None:
    side("fails_with_nul", ctx)
    raise TerminalError("card\x00declined")


@workflow
async def nul_error(ctx: WorkflowContext) -> None:
    await fails_with_nul(ctx)


@workflow
async def nul_workflow_result(ctx: WorkflowContext) -> str:
    await book(ctx, "b-2")
    return "done\x00"


@workflow
async def nul_compensation_argument(ctx: WorkflowContext) -> str:
    """The ``@on_failure`` compensation would be stored with a NUL argument."""
    try:
        await hold(ctx, "b\x00")
    except TerminalError as error:
        return f"caught: {error}"
    return "unreachable"


@workflow
async def nul_in_match(ctx: WorkflowContext, nul_in_type: bool = False) -> None:
    """Nothing checks ``match`` (a jsonb) or the event type (a text) before the write: the
    database's refusal is the guard."""
    await book(ctx, "b-3")
    await wait_event(ctx, "limits.\x00paid" if nul_in_type else "limits.paid", match={"order": "o\x00"})


# ------------------------------------------------------------------ activities that never end


@activity(timeout=0.3, retry_policy=TWICE)
async def hangs(ctx: WorkflowContext) -> None:
    side("hangs", ctx)
    await asyncio.Event().wait()


@activity(timeout=0.3, retry_policy=TWICE)
def sleeps(ctx: WorkflowContext, seconds: float) -> str:
    side("sleeps", ctx)
    time.sleep(seconds)
    return "woke"


@activity(retry_policy=TWICE)
async def hangs_without_own_timeout(ctx: WorkflowContext) -> None:
    side("hangs_without_own_timeout", ctx)
    await asyncio.Event().wait()


@activity(timeout=5, retry_policy=TWICE)
async def raises_own_timeout(ctx: WorkflowContext) -> None:
    """A ``TimeoutError`` of the activity's own (an HTTP client's) is not the activity timeout."""
    side("raises_own_timeout", ctx)
    raise TimeoutError("upstream timed out")


def _outcome(error: RetryExhaustedError) -> str:
    cause = error.__cause__
    return f"{type(error).__name__}<-{type(cause).__name__}:{isinstance(cause, ActivityTimeoutError)}"


@workflow
async def times_out(ctx: WorkflowContext, kind: str) -> str:
    try:
        if kind == "async":
            await hangs(ctx)
        elif kind == "sync":
            await sleeps(ctx, 2.0)
        elif kind == "default":
            await hangs_without_own_timeout(ctx)
        else:
            await raises_own_timeout(ctx)
    except RetryExhaustedError as error:
        return _outcome(error)
    return "unreachable"


@workflow
async def times_out_uncaught(ctx: WorkflowContext) -> None:
    await hangs(ctx)
