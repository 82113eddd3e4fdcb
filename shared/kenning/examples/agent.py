"""A durable support agent: a Pydantic AI agent whose model requests and tool calls are
Kenning activities, and whose refunds wait for a person's approval.

    kenning up --app kenning.examples.agent
    kenning start support --input '{"question": "Please refund 30 on order o-1"}'
    kenning request <instance id> approval '{"call_id": "refund-1", "approved": true}'

With no model configured it runs on a deterministic fake model (no key, no network) that
looks the order up, asks for a refund when the question says so, and answers in text.
``SUPPORT_AGENT_MODEL`` names a real one in Pydantic AI's form (``openai:gpt-4o-mini``,
``anthropic:claude-sonnet-4-5``...), whose provider reads its own key
(``OPENAI_API_KEY``...) and needs its extra (``pip install 'pydantic-ai-slim[openai]'``).
docs/agents.md walks through it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from kenning import App, RetryPolicy, WorkflowContext, workflow
from kenning.ai import ActivityOptions, KenningAgent

app = App("support")

MODEL_VARIABLE = "SUPPORT_AGENT_MODEL"
ORDERS = {
    "o-1": {"order_id": "o-1", "status": "delivered", "total": 42},
    "o-2": {"order_id": "o-2", "status": "in transit", "total": 17},
}


@dataclass(frozen=True)
class FakeSupportModel:
    """The scripted model: it reads the conversation, never the clock or the network, so
    the same conversation always gets the same answer."""

    def reply(self, messages: list[ModelMessage]) -> ModelResponse:
        question = _question(messages)
        results = _tool_results(messages)
        named = re.search(r"\bo-\d+\b", question)
        order_id = named.group(0) if named else "o-1"
        if "lookup_order" not in results:
            return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": order_id}, tool_call_id="lookup-1")])
        amount = re.search(r"refund (\d+)", question, flags=re.I)
        if amount and "refund" not in results:
            args = {"order_id": order_id, "amount": int(amount.group(1))}
            return ModelResponse(parts=[ToolCallPart("refund", args, tool_call_id="refund-1")])
        order = results["lookup_order"]
        text = f"Order {order_id} is {order.get('status', 'unknown') if isinstance(order, dict) else order}."
        if "refund" in results:
            text += f" Refund: {results['refund']}."
        return ModelResponse(parts=[TextPart(text)])

    def model(self) -> FunctionModel:
        async def request(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            return self.reply(messages)

        async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
            for n, part in enumerate(self.reply(messages).parts):
                if isinstance(part, TextPart):
                    for i, word in enumerate(part.content.split(" ")):
                        yield word if i == 0 else f" {word}"
                elif isinstance(part, ToolCallPart):
                    args = json.dumps(part.args)
                    yield {n: DeltaToolCall(name=part.tool_name, json_args=args, tool_call_id=part.tool_call_id)}

        return FunctionModel(request, stream_function=stream, model_name="fake-support")


def _question(messages: list[ModelMessage]) -> str:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


def _tool_results(messages: list[ModelMessage]) -> dict[str, object]:
    return {
        part.tool_name: part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }


def support_model() -> Model | str:
    """The configured model's name, else the fake one."""
    return os.environ.get(MODEL_VARIABLE) or FakeSupportModel().model()


agent = Agent(
    support_model(),
    name="support",
    instructions="You are a support agent for an online shop. Look orders up before answering; "
    "refund only what the customer asks for.",
    defer_model_check=True,
)


@agent.tool_plain
def lookup_order(order_id: str) -> dict[str, object]:
    """The order's status and total."""
    return ORDERS.get(order_id, {"order_id": order_id, "status": "unknown"})


@agent.tool_plain(requires_approval=True)
def refund(order_id: str, amount: int) -> str:
    """Refund ``amount`` on the order: a person approves each call first."""
    return f"{amount} refunded on {order_id}"


# a model call is retried a few times with back-off; a tool call too, sooner
durable = KenningAgent(
    agent,
    model=ActivityOptions(RetryPolicy(initial_interval=2, max_attempts=4), timeout=120),
    tool=ActivityOptions(RetryPolicy(initial_interval=0.5, max_attempts=3), timeout=30),
)


@workflow
async def support(ctx: WorkflowContext, question: str) -> str:
    """Answer a customer's question; a refund waits for a person's approval."""
    result = await durable.run(ctx, question)
    return result.output
