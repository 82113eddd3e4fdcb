"""Workflows for tests/system/test_children.py: parents starting child workflows.

Activities and compensations append ``<label> <instance id>`` to the side channel each
time they really run, so a test counts executions across worker processes and crashes.
"""

from __future__ import annotations

import asyncio

from kenning import (
    App,
    TerminalError,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    start_child,
    wait_event,
    workflow,
)
from tests.sidechannel import record_execution

app = App("kenning-children-tests")


@compensation
async def release(ctx: WorkflowContext, label: str) -> None:
    record_execution(f"undo:{label} {ctx.instance_id}")


@activity
@on_failure(release)
async def reserve(ctx: WorkflowContext, label: str) -> dict[str, str]:
    record_execution(f"reserve:{label} {ctx.instance_id}")
    return {"label": label}


@activity
async def square_of(ctx: WorkflowContext, n: int) -> int:
    record_execution(f"square {ctx.instance_id}")
    await asyncio.sleep(0.02)  # children overlap on the workers
    return n * n


@workflow
async def child_square(ctx: WorkflowContext, n: int) -> int:
    return await square_of(ctx, n)


@workflow
async def fan_out_children(ctx: WorkflowContext, count: int) -> int:
    """Starts ``count`` children, then gathers their results in order."""
    handles = [await start_child(ctx, child_square, n=n) for n in range(1, count + 1)]
    return sum([await h.result() for h in handles])


@workflow
async def gather_children(ctx: WorkflowContext, count: int) -> list[int]:
    """Starts ``count`` children, then awaits their results together in one gather."""
    handles = [await start_child(ctx, child_square, n=n) for n in range(1, count + 1)]
    return list(await asyncio.gather(*(h.result() for h in handles)))


@workflow
async def child_waiting(ctx: WorkflowContext, n: int) -> int:
    """Reserves (undone by its compensation), then waits for an event nobody sends."""
    await reserve(ctx, f"child{n}")
    await wait_event(ctx, "children.never", match={"n": n})
    return n


@workflow
async def parent_of_waiters(ctx: WorkflowContext, cancelled: int, abandoned: int) -> None:
    await reserve(ctx, "parent")
    handles = [await start_child(ctx, child_waiting, n=n) for n in range(cancelled)]
    for n in range(cancelled, cancelled + abandoned):
        await start_child(ctx, child_waiting, n=n, on_parent_cancel="abandon")
    for handle in handles:
        await handle.result()


@workflow
async def child_failing(ctx: WorkflowContext) -> int:
    await reserve(ctx, "child")
    raise TerminalError("the child refuses")


@workflow
async def parent_of_failure(ctx: WorkflowContext) -> int:
    await reserve(ctx, "parent")
    handle = await start_child(ctx, child_failing, child_id=f"{ctx.instance_id}-only-child")
    return await handle.result()


CHILD_QUEUE = "children-queue"


@workflow(queue=CHILD_QUEUE)
async def child_queued(ctx: WorkflowContext, n: int) -> int:
    return n


@workflow
async def parent_of_queued(ctx: WorkflowContext, count: int) -> int:
    """Children in their workflow's queue, and one an unqueued workflow's put in it by the start."""
    handles = [await start_child(ctx, child_queued, n=n) for n in range(count)]
    handles.append(await start_child(ctx, child_square, n=10, queue=CHILD_QUEUE, partition_key="tenant-a", priority=3))
    return sum([await h.result() for h in handles])
