"""``KenningAgent``: a Pydantic AI agent run durably inside a Kenning workflow.

    durable = KenningAgent(agent)

    @workflow
    async def support(ctx: WorkflowContext, question: str) -> str:
        result = await durable.run(ctx, question, deps=Deps(...))
        return result.output

The agent loop runs in workflow code, deterministic because every model request and tool
call is an activity (``KenningDurability``): after a crash the run goes on from its last
recorded step. A tool that requires approval suspends the instance until a person decides
(``kenning.approvals``); the agent then goes on with the decision. The run's events go to
the instance's stream ``stream_key`` (``"agent"``) as they happen.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Generic

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.agent import AbstractAgent, AgentRunResult
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models import Model
from pydantic_ai.output import OutputDataT
from pydantic_ai.tools import AgentDepsT

from kenning.ai.durability import ActivityOptions, KenningDurability
from kenning.ai.events import StreamWriter, write_event
from kenning.ai.guard import NonDurableAgentRunError, durable_run, refuse_bare_runs
from kenning.context import WorkflowContext, current_step, current_workflow
from kenning.messages import APPROVAL_TOPIC, wait_for_approvals

DEFAULT_STREAM_KEY = "agent"

# How many agent runs each workflow execution made so far: a run's id is derived from the
# instance and this count, the same on every replay (a random one would differ).
_runs_made: weakref.WeakKeyDictionary[WorkflowContext, int] = weakref.WeakKeyDictionary()


class KenningAgent(Generic[AgentDepsT, OutputDataT]):
    """``agent`` made durable. ``model``, ``tool``, ``mcp`` and ``event`` set the retry
    policy and timeout of each kind of activity (``ActivityOptions``); ``name`` (default:
    the agent's) names them, so it must stay the same while instances are in flight.
    ``stream_key`` is the instance stream the events go to (None: no stream);
    ``approval_topic`` the mailbox decisions are sent to."""

    def __init__(
        self,
        agent: AbstractAgent[AgentDepsT, OutputDataT],
        *,
        name: str | None = None,
        models: Mapping[str, Model] | None = None,
        model: ActivityOptions | None = None,
        tool: ActivityOptions | None = None,
        mcp: ActivityOptions | None = None,
        event: ActivityOptions | None = None,
        stream_key: str | None = DEFAULT_STREAM_KEY,
        approval_topic: str = APPROVAL_TOPIC,
    ) -> None:
        self.agent = agent
        self.stream_key = stream_key
        self.approval_topic = approval_topic
        attached = KenningDurability.from_agent(agent)
        if attached is not None:  # built with capabilities=[KenningDurability(...)]: use it as it is
            self.durability: KenningDurability[AgentDepsT] = attached
            self._capabilities: list[Any] | None = None
        else:
            self.durability = KenningDurability(
                name=name or agent.name,
                models=models,
                event_stream_handler=StreamWriter(stream_key) if stream_key is not None else None,
                model=model,
                tool=tool,
                mcp=mcp,
                event=event,
            )
            self._capabilities = [*agent.root_capability.capabilities, self.durability]
        if not (name or agent.name):
            raise NonDurableAgentRunError(
                "KenningAgent needs a name for the agent's activities: give the agent one, "
                "Agent(..., name='support'), or KenningAgent(agent, name='support')"
            )

    @property
    def name(self) -> str:
        return self.durability.name or self.agent.name or ""

    async def run(
        self,
        ctx: WorkflowContext,
        user_prompt: str | None = None,
        *,
        deps: AgentDepsT = None,  # type: ignore[assignment]  # the agent's deps type, None when it takes none
        message_history: Sequence[ModelMessage] | None = None,
        **kwargs: Any,
    ) -> AgentRunResult[OutputDataT]:
        """Run the agent to its output, durably; other keywords go to ``Agent.run``. A tool
        needing approval suspends the instance until a person decides (``kenning.approvals``)."""
        _check_in_workflow(ctx)
        history = list(message_history) if message_history is not None else None
        prompt: str | None = user_prompt
        decisions: DeferredToolResults | None = None
        while True:
            result = await self._run_once(ctx, prompt, deps, history, decisions, kwargs)
            output = result.output
            if not isinstance(output, DeferredToolRequests):
                if self.stream_key is not None:
                    await write_event(ctx, self.stream_key, {"event_kind": "agent_output", "output": _jsonable(output)})
                return result  # DeferredToolRequests was added to the output types here, and is handled
            if output.calls:
                names = ", ".join(sorted({call.tool_name for call in output.calls}))
                raise NonDurableAgentRunError(
                    f"agent {self.name}: tools deferred to an external call ({names}) are not supported by "
                    "KenningAgent; run them as tools (each call is an activity) or require approval instead"
                )
            asked = {
                call.tool_call_id: {"tool": call.tool_name, "args": call.args_as_dict()} for call in output.approvals
            }
            decided = await wait_for_approvals(ctx, asked, topic=self.approval_topic)
            decisions = DeferredToolResults(
                approvals={
                    call_id: True if d.approved else ToolDenied(d.reason or "The person asked denied this call.")
                    for call_id, d in decided.items()
                }
            )
            history, prompt = result.all_messages(), None

    async def _run_once(
        self,
        ctx: WorkflowContext,
        prompt: str | None,
        deps: AgentDepsT,
        history: list[ModelMessage] | None,
        decisions: DeferredToolResults | None,
        kwargs: dict[str, Any],
    ) -> AgentRunResult[Any]:
        made = _runs_made.get(ctx, 0) + 1
        _runs_made[ctx] = made
        output_type = kwargs.pop("output_type", None) or self.agent.output_type
        token = durable_run.set(True)
        try:
            if self._capabilities is None:
                return await self.agent.run(
                    prompt,
                    deps=deps,
                    message_history=history,
                    deferred_tool_results=decisions,
                    output_type=[output_type, DeferredToolRequests],
                    run_id=f"{ctx.instance_id}:agent:{made}",
                    **kwargs,
                )
            with self.agent.override(capabilities=self._capabilities):
                return await self.agent.run(
                    prompt,
                    deps=deps,
                    message_history=history,
                    deferred_tool_results=decisions,
                    output_type=[output_type, DeferredToolRequests],
                    run_id=f"{ctx.instance_id}:agent:{made}",
                    **kwargs,
                )
        finally:
            durable_run.reset(token)


def _check_in_workflow(ctx: Any) -> None:
    """Refuse a durable run anywhere but in the workflow code of ``ctx``."""
    if not isinstance(ctx, WorkflowContext):
        raise NonDurableAgentRunError(
            f"KenningAgent.run takes the workflow's context first, got {type(ctx).__name__}: "
            "`await durable.run(ctx, prompt)` inside a @workflow"
        )
    if current_workflow.get() is None:
        raise NonDurableAgentRunError(
            "KenningAgent.run was called outside a Kenning workflow: nothing would record its model "
            "and tool calls; call it from a @workflow (or run the plain agent, without Kenning)"
        )
    if current_step.get() is not None:
        raise NonDurableAgentRunError(
            "KenningAgent.run was called inside an activity: its calls would not be recorded one by one; "
            "call it from the workflow's code"
        )


def _jsonable(value: Any) -> Any:
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value)


refuse_bare_runs()
