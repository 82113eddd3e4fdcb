"""``KenningDurability``: Pydantic AI's durability capability on Kenning activities.

Built on Pydantic AI's public durable-execution surface (``pydantic_ai.durable_exec``), as
its DBOS and Prefect integrations are: the base class owns the model and toolset wrapping,
the codec and the events; this module says what a durable unit is in Kenning (one
activity, recorded once and replayed ever after) and when a run is inside a workflow.

Each model request, each tool call (MCP tools included) and each tool discovery is an
activity named by Pydantic AI's journal convention (``<agent>__model.request``,
``<agent>__function_toolset__<id>.call_tool:<tool>``...), so a workflow replayed after a
crash gets the recorded model responses and tool results back instead of asking again.
The values cross the boundary as JSON (``JSON_CODEC``), the way Kenning stores a step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    JournalCallableOperationBackend,
    RoleBasedOperationConfig,
)
from pydantic_ai.messages import AgentStreamEvent
from pydantic_ai.models import Model
from pydantic_ai.tools import AgentDepsT, RunContext

from kenning.activity import Activity, timeout_seconds
from kenning.ai.events import StreamWriter, current_unit
from kenning.context import WorkflowContext, current_step, in_workflow_code
from kenning.retry import RetryPolicy


@dataclass(frozen=True)
class ActivityOptions:
    """How one kind of agent activity runs: its retry policy (None: the app's default,
    else Kenning's) and the timeout of each attempt in seconds (None: the worker's
    ``--activity-timeout``, if any)."""

    retry_policy: RetryPolicy | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        timeout_seconds(self.timeout, "ActivityOptions")


class KenningOperationBackend(JournalCallableOperationBackend[ActivityOptions]):
    """Runs each durable operation's body as one Kenning activity of the running workflow."""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: ActivityOptions,
    ) -> object:
        ctx = in_workflow_code()
        if ctx is None:  # inside another unit (a nested run in a tool): that unit records it
            return await body()

        async def unit(activity_ctx: WorkflowContext) -> object:
            token = current_unit.set(activity_ctx)
            try:
                return await body()
            finally:
                current_unit.reset(token)

        unit.__name__ = unit.__qualname__ = name
        act: Activity[object] = Activity(unit, config.retry_policy, config.timeout)
        return await ctx.runtime.run_activity(act, (), {}, None)


@dataclass(init=False, kw_only=True)
class KenningDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes an agent durable in a Kenning workflow: each model request and tool call is an
    activity, with the retry policy and timeout given per kind (``model``, ``tool`` for
    function tools, ``mcp`` for MCP servers' tools and discovery, ``event`` for the event
    handler). Outside a workflow it refuses to run (``kenning.ai.guard``); most programs
    use ``KenningAgent(agent)``, which attaches it."""

    engine_spec = DurabilityEngineSpec(
        engine_name="Kenning",
        durable_unit_noun="activity",
        durable_unit_plural="activities",
        durable_container_noun="workflow",
        codec=JSON_CODEC,  # a step is stored as JSON
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        # units run in the worker's own process, in the workflow's task
        toolset_lifecycles={"function": "enter-always", "mcp": "enter-in-durable-unit", "dynamic": "enter-never"},
        tool_call_result_upgrade_lenient=False,
        journal_discovery=True,
        # Kenning numbers a step by its name's count, in the order calls reach it: tools one
        # at a time keep that order the same on replay
        sequential_tools_in_durable_context=True,
        tool_config_key=None,
    )

    def __init__(
        self,
        *,
        name: str | None = None,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        model: ActivityOptions | None = None,
        tool: ActivityOptions | None = None,
        mcp: ActivityOptions | None = None,
        event: ActivityOptions | None = None,
    ) -> None:
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self._model_options = model or ActivityOptions()
        self._tool_options = tool or ActivityOptions()
        self._mcp_options = mcp or ActivityOptions()
        self._event_options = event or ActivityOptions()

    @property
    def in_durable_context(self) -> bool:
        return current_step.get() is None and in_workflow_code() is not None

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        return KenningOperationBackend(
            agent_name=self.name,
            config=RoleBasedOperationConfig(
                model=self._model_options,
                event=self._event_options,
                capability=self._tool_options,
                tool=self._tool_options,
            ),
        )

    def _toolset_base_config(self, kind: Any) -> ActivityOptions:
        return self._mcp_options if kind == "mcp" else self._tool_options

    async def _dispatch_event_stream_event(self, ctx: RunContext[AgentDepsT], event: AgentStreamEvent) -> None:
        """An event between model requests (a tool call, its result): written to the
        stream from workflow code, one recorded step, instead of an activity that writes
        it (two writes); a handler of the user's own still runs in an activity."""
        handler = self._event_stream_handler
        workflow_ctx = in_workflow_code()
        if isinstance(handler, StreamWriter) and workflow_ctx is not None:
            await handler.write_from_workflow(workflow_ctx, event)
            return
        await super()._dispatch_event_stream_event(ctx, event)
