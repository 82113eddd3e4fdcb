"""Each kind of agent activity has the retry policy the user gave it (issue 34, item 2),
in memory: a model request that fails twice is retried under ``model=`` and the run goes
on; a tool that fails is given up on under ``tool=`` after its one attempt. And the run's
``deps`` reach the tools, which run as activities."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kenning import App, RetryPolicy, WorkflowContext, WorkflowFailedError, workflow
from kenning.ai import ActivityOptions, KenningAgent
from kenning.testing import WorkflowEnvironment
from tests.logguard import expect_log

app = App("kenning-agent-retry-tests")
calls: Counter[str] = Counter()  # one process: counted in memory


async def flaky_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    calls["model"] += 1
    if calls["model"] <= 2:
        raise ConnectionError("the provider hung up")
    if not any(isinstance(m, ModelResponse) for m in messages):
        return ModelResponse(parts=[ToolCallPart("fragile", {}, tool_call_id="fragile-1")])
    return ModelResponse(parts=[TextPart("unreachable")])


agent = Agent(FunctionModel(flaky_model), name="flaky")


@agent.tool_plain
def fragile() -> str:
    calls["tool"] += 1
    raise ValueError("the tool broke")


durable = KenningAgent(
    agent,
    stream_key=None,
    model=ActivityOptions(RetryPolicy(initial_interval=1, max_attempts=3)),
    tool=ActivityOptions(RetryPolicy(max_attempts=1)),
)


@workflow
async def flaky_run(ctx: WorkflowContext) -> str:
    return (await durable.run(ctx, "go")).output


async def test_model_and_tool_activities_follow_their_own_retry_policies() -> None:
    expect_log("instance.failed")
    async with WorkflowEnvironment(app) as env:
        handle = await env.start(flaky_run)
        with pytest.raises(
            WorkflowFailedError, match=r"flaky__function_toolset__<agent>\.call_tool:fragile failed after 1"
        ):
            await handle.result()
        history = [(entry.step_name, entry.kind) for entry in await handle.history()]
    # the model's third attempt answered (two retries under model=); the tool got one attempt
    assert calls == {"model": 3, "tool": 1}
    assert history == [
        ("flaky__model.request", "ActivityCompleted"),
        ("flaky__function_toolset__<agent>.call_tool:fragile", "ActivityFailed"),
    ]


@dataclass(frozen=True)
class Shop:
    currency: str


async def priced_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not any(isinstance(m, ModelResponse) for m in messages):
        return ModelResponse(parts=[ToolCallPart("price", {"amount": 3}, tool_call_id="price-1")])
    return ModelResponse(parts=[TextPart("priced")])


shop_agent = Agent(FunctionModel(priced_model), name="shop", deps_type=Shop)


@shop_agent.tool
def price(ctx: RunContext[Shop], amount: int) -> str:
    return f"{amount} {ctx.deps.currency}"


shop = KenningAgent(shop_agent, stream_key=None)


@workflow
async def priced(ctx: WorkflowContext, currency: str) -> str:
    result = await shop.run(ctx, "price it", deps=Shop(currency))
    returns = [p.content for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    return f"{result.output}: {returns[0]}"


async def test_deps_reach_the_tools_activities() -> None:
    async with WorkflowEnvironment(app) as env:
        assert await (await env.start(priced, currency="EUR")).result() == "priced: 3 EUR"
