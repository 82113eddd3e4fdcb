"""Activities that heartbeat (issue 29, item 5): each attempt resumes from the details the
last one heartbeated. The first attempt (no details yet) stops heartbeating at ``hang_at``:
it hangs, in the event loop or in a sync activity's thread, or (``checkpointed``, no
heartbeat timeout) until its worker is killed.

Each real attempt appends ``name instance_id`` to the side channel.
"""

from __future__ import annotations

import asyncio
import time

from kenning import App, RetryPolicy, WorkflowContext, activity, workflow
from tests.sidechannel import record_execution

app = App("kenning-heartbeats")

RETRY = RetryPolicy(initial_interval=0.01, backoff_coefficient=1.0, max_interval=0.01, max_attempts=3)
BEAT = 0.02  # between rows


@activity(retry_policy=RETRY, heartbeat_timeout=0.5)
async def import_rows(ctx: WorkflowContext, rows: int, hang_at: int) -> dict[str, int]:
    record_execution(f"import_rows {ctx.instance_id}")
    start = ctx.heartbeat_details or 0
    for n in range(start, rows):
        if n == hang_at and ctx.heartbeat_details is None:
            await asyncio.Event().wait()  # stuck: no heartbeat any more
        await asyncio.sleep(BEAT)
        ctx.heartbeat(n + 1)  # rows done
    return {"resumed_from": start, "rows": rows}


@activity(retry_policy=RETRY, heartbeat_timeout=0.5)
def import_rows_sync(ctx: WorkflowContext, rows: int, hang_at: int) -> dict[str, int]:
    record_execution(f"import_rows_sync {ctx.instance_id}")
    start = ctx.heartbeat_details or 0
    for n in range(start, rows):
        if n == hang_at and ctx.heartbeat_details is None:
            time.sleep(3)  # stuck in its thread, which is abandoned
            return {"resumed_from": -1, "rows": rows}  # dropped: nobody waits for it
        time.sleep(BEAT)
        ctx.heartbeat(n + 1)
    return {"resumed_from": start, "rows": rows}


@activity(retry_policy=RETRY)
async def checkpointed(ctx: WorkflowContext, rows: int, hang_at: int) -> dict[str, int]:
    """No heartbeat timeout: its details still survive a worker killed mid-attempt."""
    record_execution(f"checkpointed {ctx.instance_id}")
    start = ctx.heartbeat_details or 0
    for n in range(start, rows):
        if n == hang_at and ctx.heartbeat_details is None:
            await asyncio.Event().wait()  # until the worker is killed
        await asyncio.sleep(BEAT)
        ctx.heartbeat(n + 1)
    return {"resumed_from": start, "rows": rows}


@workflow
async def heartbeat_import(ctx: WorkflowContext, rows: int = 10, hang_at: int = 4, kind: str = "async") -> object:
    act = {"async": import_rows, "sync": import_rows_sync, "checkpointed": checkpointed}[kind]
    return await act(ctx, rows, hang_at)
