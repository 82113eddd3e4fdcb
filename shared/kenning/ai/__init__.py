"""Durable Pydantic AI agents (the ``kenning[pydantic-ai]`` extra).

``KenningAgent(agent)`` runs an agent inside a workflow with each model request and tool
call as an activity; ``KenningDurability`` is the capability it attaches, for agents built
with it (``Agent(..., capabilities=[KenningDurability()])``). docs/agents.md walks through
an example. Approvals are the core's (``kenning.approvals``), streams too: the adapter
only maps Pydantic AI's units onto them.
"""

from __future__ import annotations

try:
    import pydantic_ai  # noqa: F401
except ImportError as missing:  # pragma: no cover - the extra not installed
    raise ImportError("kenning.ai needs Pydantic AI: pip install 'kenning[pydantic-ai]'") from missing

from kenning.ai.agent import DEFAULT_STREAM_KEY, KenningAgent
from kenning.ai.durability import ActivityOptions, KenningDurability
from kenning.ai.guard import NonDurableAgentRunError
from kenning.messages import ApprovalDecision, wait_for_approval, wait_for_approvals

__all__ = [
    "DEFAULT_STREAM_KEY",
    "ActivityOptions",
    "ApprovalDecision",
    "KenningAgent",
    "KenningDurability",
    "NonDurableAgentRunError",
    "wait_for_approval",
    "wait_for_approvals",
]
