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

from kenning import App, Queue, WorkflowContext, activity, workflow
from tests.sidechannel import record_execution

app = App("kenning-queues")

PAYMENTS = Queue("test-payments", concurrency=3)
RATED = Queue("test-rated", rate_limit=(10, 1.0))
FAIR = Queue("test-fair", concurrency=2)
PAUSABLE = Queue("test-pausable")


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
