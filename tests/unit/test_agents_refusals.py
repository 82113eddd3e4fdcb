"""Durable agents in memory (issue 34, item 2): nothing non-durable happens in silence
(``durable.run`` outside a workflow or inside an activity, a bare agent run in workflow
code: each refused, saying what to do), and an approval is a recorded request: a
malformed or unknown decision is refused and changes nothing, a denial reaches the agent."""

from __future__ import annotations

import pytest

from kenning import RequestRejectedError, WorkflowContext, WorkflowFailedError, activity, workflow
from kenning.ai import NonDurableAgentRunError
from kenning.testing import WorkflowEnvironment
from tests.apps import agents
from tests.logguard import expect_log


@workflow
async def bare_agent(ctx: WorkflowContext, question: str) -> str:
    result = await agents.steps.agent.run(question)
    return result.output


@activity
async def durable_in_activity(ctx: WorkflowContext, question: str) -> str:
    result = await agents.steps.run(ctx, question)
    return result.output


@workflow
async def agent_in_activity(ctx: WorkflowContext, question: str) -> str:
    return await durable_in_activity(ctx, question)


async def test_a_durable_run_outside_a_workflow_is_refused() -> None:
    with pytest.raises(NonDurableAgentRunError, match="takes the workflow's context first"):
        await agents.steps.run(None, "hi")  # type: ignore[arg-type]


async def test_a_bare_agent_run_in_workflow_code_is_refused_and_one_in_an_activity_too() -> None:
    expect_log("instance.failed")
    async with WorkflowEnvironment(agents.app) as env:
        bare = await env.start(bare_agent, question="hi")
        with pytest.raises(WorkflowFailedError, match=r"agent steps was run directly in Kenning workflow code"):
            await bare.result()
        nested = await env.start(agent_in_activity, question="hi")
        with pytest.raises(WorkflowFailedError, match=r"KenningAgent\.run was called inside an activity"):
            await nested.result()
    # the plain agent outside any workflow is none of Kenning's business: it runs
    assert (await agents.build_agent("plain", "check_policy").run("hi")).output == "order o-1 is settled"


async def test_a_denied_refund_reaches_the_agent_and_bad_decisions_are_refused() -> None:
    async with WorkflowEnvironment(agents.app) as env:
        handle = await env.start(agents.agent_refund, question="refund 30 on o-1")
        with pytest.raises(RequestRejectedError, match="an approval is"):
            await handle.request("approval", "yes")
        with pytest.raises(RequestRejectedError, match="'approved' must be true or false"):
            await handle.request("approval", {"call_id": "call-refund", "approved": "yes"})
        answer = await handle.request("approval", {"call_id": "call-refund", "approved": False, "reason": "no"})
        assert answer == {"call_id": "call-refund", "approved": False}
        assert await handle.result() == "order o-1 is settled"
        assert (await handle.get_value("approvals"))["resolved"] == [
            {"call_id": "call-refund", "approved": False, "reason": "no"}
        ]
        names = [entry.step_name for entry in await handle.history()]
    assert "refunds__function_toolset__<agent>.call_tool:refund" not in names
