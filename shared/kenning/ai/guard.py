"""Nothing non-durable happens in silence: an agent run in workflow code that Kenning does
not record is refused, with what to do instead.

A bare ``Agent.run`` in a workflow would call the model and the tools again on every
replay (and pay again). Importing ``kenning.ai`` installs this check on ``Agent.iter``,
which every run method goes through; runs inside an activity, and any run outside a
workflow, are left alone.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.exceptions import UserError

from kenning.context import in_workflow_code

# Set by KenningAgent.run around the runs it makes durable.
durable_run: ContextVar[bool] = ContextVar("kenning_ai_durable_run", default=False)


class NonDurableAgentRunError(UserError):
    """An agent run that Kenning would not record (in a workflow), or a durable one outside any."""


def refuse_bare_runs() -> None:
    """Install the check once (idempotent)."""
    original = Agent.iter
    if getattr(original, "_kenning_guarded", False):
        return

    @functools.wraps(original)
    def iter(self: Agent[Any, Any], *args: Any, **kwargs: Any) -> Any:
        if not durable_run.get() and in_workflow_code() is not None and not _has_durability(self):
            raise NonDurableAgentRunError(
                f"agent {self.name or '(unnamed)'} was run directly in Kenning workflow code: its model and "
                "tool calls would not be recorded, and would run (and be paid for) again on every replay; "
                "wrap it, durable = KenningAgent(agent), and call `await durable.run(ctx, prompt)`, or run "
                "it inside an @activity"
            )
        return original(self, *args, **kwargs)

    iter._kenning_guarded = True  # type: ignore[attr-defined]
    Agent.iter = iter  # type: ignore[method-assign]


def _has_durability(agent: Agent[Any, Any]) -> bool:
    from kenning.ai.durability import KenningDurability

    return KenningDurability.from_agent(agent) is not None
