"""The agent the benchmark's agent section runs (kenning_devtools/bench/agent.py): a
Pydantic AI agent on a model that answers at once, calling the ``step`` tool ``TOOL_CALLS``
times before its text answer, so a run is ``2 * TOOL_CALLS + 1`` steps (model requests and
tool calls). Run durably (``bench_agent``: with its event stream, ``bench_agent_quiet``:
without) and bare (``bare_run``, with an event handler and without), the difference per
step is Kenning's own time."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator

from pydantic_ai import Agent
from pydantic_ai.messages import AgentStreamEvent, ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.tools import RunContext

from kenning import WorkflowContext, workflow
from kenning.ai import KenningAgent

TOOL_CALLS = 5
STEPS = 2 * TOOL_CALLS + 1


def _answer(messages: list[ModelMessage]) -> ModelResponse:
    made = sum(isinstance(message, ModelResponse) for message in messages)
    if made < TOOL_CALLS:
        return ModelResponse(parts=[ToolCallPart("step", {"n": made}, tool_call_id=f"step-{made}")])
    return ModelResponse(parts=[TextPart(f"done after {made} steps")])


async def _request(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return _answer(messages)


async def _stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
    for part in _answer(messages).parts:
        if isinstance(part, TextPart):
            yield part.content
        elif isinstance(part, ToolCallPart):
            args = json.dumps(part.args)
            yield {0: DeltaToolCall(name=part.tool_name, json_args=args, tool_call_id=part.tool_call_id)}


agent = Agent(FunctionModel(_request, stream_function=_stream), name="bench")


@agent.tool_plain
def step(n: int) -> int:
    return n + 1


streamed = KenningAgent(agent)
quiet = KenningAgent(agent, name="bench_quiet", stream_key=None)


@workflow
async def bench_agent(ctx: WorkflowContext) -> str:
    return (await streamed.run(ctx, "go")).output


@workflow
async def bench_agent_quiet(ctx: WorkflowContext) -> str:
    return (await quiet.run(ctx, "go")).output


async def _take_events(ctx: RunContext[object], events: AsyncIterable[AgentStreamEvent]) -> None:
    async for _ in events:
        pass


async def bare_run(events: bool = False) -> str:
    """The same agent without Kenning; ``events``: with an event stream handler (which
    takes the events and does nothing with them), as ``bench_agent`` runs it: Pydantic
    AI then streams each model response, which costs it more than a plain request."""
    if events:
        return (await agent.run("go", event_stream_handler=_take_events)).output
    return (await agent.run("go")).output
