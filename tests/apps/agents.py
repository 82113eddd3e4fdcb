"""Durable agents the agent tests run in real worker processes (tests/system/test_agents.py).

A scripted Pydantic AI ``FunctionModel`` (no network, no key) answers by how many model
responses the conversation holds: the first asks for ``lookup``, the second for
``check_policy`` (``steps``) or ``refund``, which requires approval (``refunds``), the
third answers in text. Each model call that really runs appends ``model <n>`` to the side
channel, each tool run ``tool <name>``, so a test counts them across processes. With
``KENNING_TEST_BLOCK_FILE`` set, the third model request waits, before it calls anything,
while that file exists: a test kills the worker between the second and third request.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from kenning import App, RetryPolicy, WorkflowContext, workflow
from kenning.ai import ActivityOptions, KenningAgent
from tests.sidechannel import record_execution

app = App("kenning-agent-tests")


def script(messages: list[ModelMessage], second_tool: str) -> ModelResponse:
    """The scripted reply to a conversation: by its count of model responses so far."""
    made = sum(isinstance(message, ModelResponse) for message in messages)
    if made == 0:
        return ModelResponse(parts=[ToolCallPart("lookup", {"order_id": "o-1"}, tool_call_id="call-lookup")])
    if made == 1:
        args = {"order_id": "o-1", "amount": 30}
        return ModelResponse(parts=[ToolCallPart(second_tool, args, tool_call_id=f"call-{second_tool}")])
    return ModelResponse(parts=[TextPart("order o-1 is settled")])


async def call_model(messages: list[ModelMessage], second_tool: str) -> ModelResponse:
    made = sum(isinstance(message, ModelResponse) for message in messages)
    block = os.environ.get("KENNING_TEST_BLOCK_FILE", "")
    if made == 2 and block:
        record_execution("model 3 waiting")
        while os.path.exists(block):
            await asyncio.sleep(0.02)
    record_execution(f"model {made + 1}")
    return script(messages, second_tool)


def scripted_model(second_tool: str) -> FunctionModel:
    async def request(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return await call_model(messages, second_tool)

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        response = await call_model(messages, second_tool)
        for n, part in enumerate(response.parts):
            if isinstance(part, TextPart):
                for i, word in enumerate(part.content.split(" ")):
                    yield word if i == 0 else f" {word}"
            elif isinstance(part, ToolCallPart):
                args = json.dumps(part.args)
                yield {n: DeltaToolCall(name=part.tool_name, json_args=args, tool_call_id=part.tool_call_id)}

    return FunctionModel(request, stream_function=stream, model_name="scripted")


def build_agent(name: str, second_tool: str) -> Agent[None, str]:
    agent = Agent(scripted_model(second_tool), name=name, instructions="You help with orders.")

    @agent.tool_plain
    def lookup(order_id: str) -> dict[str, str]:
        record_execution("tool lookup")
        return {"order_id": order_id, "status": "delivered"}

    @agent.tool_plain
    def check_policy(order_id: str, amount: int) -> str:
        record_execution("tool check_policy")
        return f"{amount} may be refunded for {order_id}"

    @agent.tool_plain(requires_approval=True)
    def refund(order_id: str, amount: int) -> str:
        record_execution("tool refund")
        return f"refunded {amount} for {order_id}"

    return agent


fast = ActivityOptions(RetryPolicy(initial_interval=0.1, max_attempts=3))
steps = KenningAgent(build_agent("steps", "check_policy"), model=fast, tool=fast)
refunds = KenningAgent(build_agent("refunds", "refund"), model=fast, tool=fast)


@workflow
async def agent_steps(ctx: WorkflowContext, question: str) -> str:
    result = await steps.run(ctx, question)
    return result.output


@workflow
async def agent_refund(ctx: WorkflowContext, question: str) -> str:
    result = await refunds.run(ctx, question)
    return result.output
