"""Workflows in queues with limits (tests/system/test_queues.py).

``hold`` appends ``queue-run <queue> <instance> <pid> start|end <unix time>`` to the side channel
around its sleep, so ``tests.invariants.queue_concurrency`` can count how many of a queue's
instances ran at once (an activity runs inside its instance's lease: what it sees running
at once, the claim let run at once).
"""

from __future__ import annotations

import asyncio
import os
import time

from kenning import App, Queue, WorkflowContext, activity, compensation, on_failure, wait_event, workflow
from tests.sidechannel import record_execution

app = App("kenning-queues")

PAYMENTS = Queue("test-payments", concurrency=3)
RATED = Queue("test-rated", rate_limit=(10, 1.0))
FAIR = Queue("test-fair", concurrency=2)
PAUSABLE = Queue("test-pausable")
# one slot: a cancel of one of its instances while another holds the slot
SINGLE = Queue("test-single", concurrency=1)


@activity
async def hold(ctx: WorkflowContext, queue: str, seconds: float) -> None:
    record_execution(f"queue-run {queue} {ctx.instance_id} {os.getpid()} start {time.time():.6f}")
    await asyncio.sleep(seconds)
    record_execution(f"queue-run {queue} {ctx.instance_id} {os.getpid()} end {time.time():.6f}")


@workflow(queue=PAYMENTS)
async def pay(ctx: WorkflowContext, n: int, seconds: float) -> int:
    await hold(ctx, PAYMENTS.name, seconds)
    return n


@workflow(queue="test-rated")
async def rated(ctx: WorkflowContext, n: int) -> int:
    return n


@workflow(queue=FAIR)
async def tenant_job(ctx: WorkflowContext, n: int) -> int:
    await hold(ctx, FAIR.name, 0.02)
    return n


@workflow
async def anywhere(ctx: WorkflowContext, n: int) -> int:
    """In no queue unless a start names one (Client.start(..., queue=...))."""
    return n


@activity
async def occupy(ctx: WorkflowContext) -> None:
    """Holds its instance's slot while the file ``QUEUE_TEST_GATE`` names exists."""
    record_execution(f"occupy start {ctx.instance_id}")
    while os.path.exists(os.environ["QUEUE_TEST_GATE"]):
        await asyncio.sleep(0.02)
    record_execution(f"occupy end {ctx.instance_id}")


@workflow(queue=SINGLE)
async def occupant(ctx: WorkflowContext) -> str:
    await occupy(ctx)
    return "done"


@compensation
async def unreserve(ctx: WorkflowContext, n: int) -> None:
    # whether the gate still held the queue's one slot when this ran
    record_execution(f"unreserve {ctx.instance_id} gate={os.path.exists(os.environ['QUEUE_TEST_GATE'])}")


@activity
@on_failure(unreserve)
async def reserve(ctx: WorkflowContext, n: int) -> dict[str, int]:
    return {"n": n}


@workflow(queue=SINGLE)
async def reserve_then_wait(ctx: WorkflowContext, n: int) -> int:
    """Reserves (undone by ``unreserve``), then waits, holding no slot, for what never comes."""
    await reserve(ctx, n)
    await wait_event(ctx, "queues.never", match={"n": n})
    return n
