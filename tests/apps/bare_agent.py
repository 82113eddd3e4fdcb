"""A workflow that runs a Pydantic AI agent bare, in an app that never imports
``kenning.ai`` (tests/system/test_agents.py): the worker must refuse it all the same."""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from kenning import App, WorkflowContext, workflow

app = App("kenning-bare-agent-tests")
agent = Agent(TestModel(custom_output_text="answered"), name="bare")


@workflow
async def bare_agent(ctx: WorkflowContext, question: str) -> str:
    return (await agent.run(question)).output
