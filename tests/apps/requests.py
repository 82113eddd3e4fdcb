"""Workflows that answer requests (issue 29, item 4: ``Client.request`` and
``message.reply``), run by ``kenning.testing`` on both backends
(tests/integration/test_requests.py) and by real worker processes
(tests/system/test_requests.py).

``check`` appends ``check <instance>`` to the side channel each time it really runs;
its first run hangs while ``KENNING_TEST_BLOCK_FILE`` exists, so a test can kill the
worker after the request was taken and before the reply.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from kenning import App, WorkflowContext, activity, receive, wait_timer, workflow
from tests.sidechannel import executions, record_execution

app = App("kenning-request-tests")

LIMIT = 1000  # an amount over it is refused (reply_error)


@activity
async def check(ctx: WorkflowContext, amount: int) -> bool:
    record_execution(f"check {ctx.instance_id}")
    block = os.environ.get("KENNING_TEST_BLOCK_FILE")
    channel = os.environ.get("KENNING_TEST_SIDE_CHANNEL")
    if block and channel and executions(channel)[f"check {ctx.instance_id}"] == 1:
        while os.path.exists(block):  # the first attempt: until the test kills this worker
            await asyncio.sleep(0.05)
    return amount <= LIMIT


@workflow(name="requests.approver")
async def approver(ctx: WorkflowContext, count: int = 1) -> int:
    """Answer ``count`` approval requests: approved up to LIMIT, refused above."""
    for _ in range(count):
        request = await receive(ctx, "approve")
        amount = int(request.data["amount"])
        if await check(ctx, amount):
            await request.reply(ctx, {"approved": True, "amount": amount})
        else:
            await request.reply_error(ctx, f"{amount} is over the limit of {LIMIT}")
    return count


@workflow(name="requests.ignorer")
async def ignorer(ctx: WorkflowContext, wait_for_finish: bool = False) -> str:
    """Take the request and end without answering it (after a "finish" message if asked)."""
    await receive(ctx, "approve")
    if wait_for_finish:
        await receive(ctx, "finish")
    return "ignored"


@workflow(name="requests.slow")
async def slow(ctx: WorkflowContext, seconds: float) -> Any:
    """Answer only after a timer of ``seconds``: a request with a shorter timeout times out."""
    request = await receive(ctx, "approve")
    await wait_timer(ctx, seconds)
    await request.reply(ctx, "late but stored")
    return request.data


@workflow(name="requests.twice")
async def twice(ctx: WorkflowContext) -> str:
    """Reply twice to one request: the second is refused and recorded."""
    request = await receive(ctx, "approve")
    await request.reply(ctx, "first")
    await request.reply(ctx, "second")
    return "unreachable"


@workflow(name="requests.echo")
async def echo(ctx: WorkflowContext, count: int) -> list[int]:
    """Take ``count`` messages of topic ``in`` (requests or plain ones), answer each with its
    data, and return every ``n`` taken, in order: a message delivered twice shows twice."""
    taken = []
    for _ in range(count):
        message = await receive(ctx, "in")
        await message.reply(ctx, message.data)
        taken.append(int(message.data["n"]))
    return taken
