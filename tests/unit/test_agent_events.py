"""The agent's events in its stream (issue 34, item 2), in memory: text deltas that come
close together are written as one, a pause starts a new one; tool calls and their
results come from workflow code, each once; the output last."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCalls, FunctionModel

from kenning import App, WorkflowContext, workflow
from kenning.ai import KenningAgent
from kenning.ai.events import DELTA_WINDOW_SECONDS
from kenning.testing import WorkflowEnvironment

app = App("kenning-agent-event-tests")


async def request(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart("one two three four")])


async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
    yield "one"
    yield " two"  # at once: joined with the next
    yield " three"
    await asyncio.sleep(3 * DELTA_WINDOW_SECONDS)  # a pause: what came before is written
    yield " four"


durable = KenningAgent(Agent(FunctionModel(request, stream_function=stream), name="talker"))


@workflow
async def talk(ctx: WorkflowContext) -> str:
    return (await durable.run(ctx, "say it")).output


async def test_close_deltas_are_joined_and_a_pause_writes_what_came_before() -> None:
    async with WorkflowEnvironment(app) as env:
        handle = await env.start(talk)
        assert await handle.result() == "one two three four"
        values = [entry.value async for entry in handle.read_stream("agent")]
    kinds = [v["event_kind"] for v in values]
    assert kinds[0] == "part_start" and kinds[-1] == "agent_output"
    assert values[0]["part"]["content"] == "one"
    deltas = [v["delta"]["content_delta"] for v in values[1:-1]]
    # " two" and " three" came at once (joined unless the machine stalled between them);
    # the pause always ends a delta
    assert "".join(deltas) == " two three four" and deltas[-1] == " four" and len(deltas) in (2, 3)
    assert values[-1]["output"] == "one two three four"
