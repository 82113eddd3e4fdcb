"""``kenning.compat.edda``'s channels in memory (issue 38, item 6): Edda's ``receive``
timeout is caught as the ``TimeoutError`` Edda raised, ``send_to`` answers False for an
instance that does not exist, a competing subscription is refused in one line, and a
``send_to`` reaches a ``receive(channel=...)`` with Edda's metadata."""

from __future__ import annotations

from typing import Any

import pytest

from kenning import WorkflowFailedError
from kenning.compat.edda import EddaApp, WorkflowContext, receive, send_to, subscribe, workflow
from kenning.testing import WorkflowEnvironment
from tests.logguard import expect_log

app = EddaApp(service_name="compat-edda-test")


@workflow
async def compat_times_out(ctx: WorkflowContext) -> str:
    try:
        await receive(ctx, channel="never", timeout_seconds=5)
    except TimeoutError:  # Edda's receive raised TimeoutError
        return "timed out"
    return "received"


@workflow
async def compat_sends(ctx: WorkflowContext, target: str) -> bool:
    return await send_to(ctx, instance_id=target, data={"approved": True}, channel="approval")


@workflow
async def compat_waits(ctx: WorkflowContext) -> dict[str, Any]:
    msg = await receive(ctx, channel="approval", timeout_seconds=300)
    return {"data": msg.data, "channel": msg.channel, "from": msg.metadata["source_instance_id"]}


@workflow
async def compat_competes(ctx: WorkflowContext) -> None:
    await subscribe(ctx, "jobs", mode="competing")


async def test_edda_channels_over_kenning_messages() -> None:
    expect_log("instance.failed", workflow="compat_competes")
    async with WorkflowEnvironment(app) as env:
        assert await (await env.start(compat_times_out)).result() == "timed out"
        assert await (await env.start(compat_sends, target="nobody")).result() is False

        waiting = await env.start(compat_waits)
        sender = await env.start(compat_sends, target=waiting.instance_id)
        assert await sender.result() is True
        assert await waiting.result() == {
            "data": {"approved": True},
            "channel": "approval",
            "from": sender.instance_id,
        }
        with pytest.raises(WorkflowFailedError, match="competing consumers are not built in Kenning"):
            await (await env.start(compat_competes)).result()
