"""The agent's events, written to a durable stream of the instance as they happen.

Text deltas are written from inside the model-request activity while the model streams
(with the activity's context), tool calls and their results from the event activity
Pydantic AI runs for each, the final output from workflow code: ``client.read_stream``
(or the ingress's SSE) reads them in order. The one function that writes is
``write_event``, so the stream API is met in one place.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.messages import AgentStreamEvent
from pydantic_ai.tools import RunContext

from kenning.ai.durability import current_unit
from kenning.context import WorkflowContext
from kenning.streams import write_stream

_EVENTS: TypeAdapter[AgentStreamEvent] = TypeAdapter(AgentStreamEvent)


def event_json(event: AgentStreamEvent) -> dict[str, Any]:
    """An event as JSON: Pydantic AI's own shape (``event_kind`` says which)."""
    value: dict[str, Any] = _EVENTS.dump_python(event, mode="json")
    return value


async def write_event(ctx: WorkflowContext, key: str, value: Any) -> None:
    """Append ``value`` to the instance's stream ``key``."""
    await write_stream(ctx, key, value)


class StreamWriter:
    """The event stream handler ``KenningAgent`` gives the durability: every event of a
    durable unit to the stream ``key``."""

    def __init__(self, key: str) -> None:
        self.key = key

    async def __call__(self, run_ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in events:
            ctx = current_unit.get()
            if ctx is not None:  # inside an activity: the only place events arrive durably
                await write_event(ctx, self.key, event_json(event))
