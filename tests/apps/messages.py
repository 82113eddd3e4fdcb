"""Workflows the message tests run in real worker processes (tests/system/test_messages.py).

``note`` appends ``msg <instance> <data>`` to the side channel each time it really runs;
with ``KENNING_TEST_BLOCK_FILE`` set it blocks on the message ``KENNING_TEST_BLOCK_AT``
while that file exists, so a test can kill the worker between two receives.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from kenning import (
    App,
    EventTimeoutError,
    WorkflowContext,
    activity,
    continue_as_new,
    publish,
    receive,
    send_message,
    subscribe,
    workflow,
)
from tests.sidechannel import record_execution

app = App("kenning-message-tests")


@activity
async def note(ctx: WorkflowContext, data: Any) -> Any:
    record_execution(f"msg {ctx.instance_id} {data}")
    block = os.environ.get("KENNING_TEST_BLOCK_FILE", "")
    if block and str(data) == os.environ.get("KENNING_TEST_BLOCK_AT", ""):
        while os.path.exists(block):
            await asyncio.sleep(0.02)
    return data


@workflow
async def collect(ctx: WorkflowContext, count: int, topic: str = "items") -> list[Any]:
    """Receive ``count`` messages of ``topic``, one step each, in mailbox order."""
    received = []
    for _ in range(count):
        message = await receive(ctx, topic)
        received.append(await note(ctx, message.data))
    return received


@workflow
async def pinger(ctx: WorkflowContext, peer: str, rounds: int) -> list[str]:
    """Send ``ping n`` to ``peer`` and wait for its ``pong n``, ``rounds`` times."""
    answers = []
    for n in range(rounds):
        await send_message(ctx, peer, "ping", {"n": n})
        answer = await receive(ctx, "pong", timeout_seconds=60)
        answers.append(f"{answer.data['pong']} from {answer.sender}")
    return answers


@workflow
async def ponger(ctx: WorkflowContext, rounds: int) -> list[int]:
    """Answer each ``ping`` with a ``pong`` to its sender."""
    seen = []
    for _ in range(rounds):
        ping = await receive(ctx, "ping")
        assert ping.sender is not None
        await send_message(ctx, ping.sender, "pong", {"pong": ping.data["n"]})
        seen.append(ping.data["n"])
    return seen


@workflow
async def listener(ctx: WorkflowContext, channel: str, count: int) -> list[Any]:
    """Subscribe to ``channel`` and take ``count`` of its broadcasts."""
    await subscribe(ctx, channel)
    return [(await receive(ctx, channel)).data for _ in range(count)]


@workflow
async def broadcaster(ctx: WorkflowContext, channel: str, items: list[Any]) -> list[int]:
    """Publish each item to ``channel``: how many subscribers each reached."""
    return [await publish(ctx, channel, item) for item in items]


@workflow
async def patient_receiver(ctx: WorkflowContext, timeout: float) -> list[Any]:
    """A receive that times out, then one that waits for as long as it takes."""
    outcome: list[Any] = []
    try:
        await receive(ctx, "answer", timeout_seconds=timeout)
        outcome.append("answered")
    except EventTimeoutError:
        outcome.append("timed out")
    outcome.append((await receive(ctx, "answer")).data)
    return outcome


@workflow
async def collect_chain(ctx: WorkflowContext, per_run: int, runs: int, received: list[Any], run: int = 1) -> list[Any]:
    """``collect`` as a continue_as_new chain: ``per_run`` messages a run, ``runs`` runs,
    what was received carried into the next run's input."""
    for _ in range(per_run):
        message = await receive(ctx, "items")
        received = [*received, await note(ctx, message.data)]
    if run < runs:
        await continue_as_new(ctx, per_run=per_run, runs=runs, received=received, run=run + 1)
    return received
