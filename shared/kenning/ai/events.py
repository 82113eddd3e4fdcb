"""The agent's events, written to a durable stream of the instance as they happen.

The text while the model streams (``part_start`` and ``part_delta`` of its text and
thinking parts; the text deltas of each 50 ms joined into one) is written from inside the
model-request activity, with the activity's context; each tool call and its result
(``function_tool_call``, ``function_tool_result``, and the other events the run yields
between model requests) from workflow code, as one recorded step each, so a replay
writes nothing again; the output last. The model's tool-call parts, its part ends and
its ``final_result`` marker are left out: the events after them say the same.
``client.read_stream`` (or the ingress's SSE) reads them in order. The one function
that writes is ``write_event``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterable
from contextvars import ContextVar
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.messages import (
    AgentStreamEvent,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ThinkingPart,
    ThinkingPartDelta,
)
from pydantic_ai.tools import RunContext

from kenning.context import WorkflowContext
from kenning.streams import write_stream

# The activity context of the unit running in this task: the model-request unit streams
# its text from inside the activity, with the activity's context.
current_unit: ContextVar[WorkflowContext | None] = ContextVar("kenning_ai_unit", default=None)

_EVENTS: TypeAdapter[AgentStreamEvent] = TypeAdapter(AgentStreamEvent)
# Text deltas of one part that arrive within this many seconds of the first one waiting
# are written as one delta: a commit per token would cost more than the tokens.
DELTA_WINDOW_SECONDS = 0.05


def event_json(event: AgentStreamEvent) -> dict[str, Any]:
    """An event as JSON: Pydantic AI's own shape (``event_kind`` says which)."""
    value: dict[str, Any] = _EVENTS.dump_python(event, mode="json")
    return value


async def write_event(ctx: WorkflowContext, key: str, value: Any) -> None:
    """Append ``value`` to the instance's stream ``key``."""
    await write_stream(ctx, key, value)


def is_text(event: AgentStreamEvent) -> bool:
    """Whether a model-stream event carries text (or thinking) as it comes."""
    if isinstance(event, PartStartEvent):
        return isinstance(event.part, TextPart | ThinkingPart)
    if isinstance(event, PartDeltaEvent):
        return isinstance(event.delta, TextPartDelta | ThinkingPartDelta)
    return False


class StreamWriter:
    """The event stream handler ``KenningAgent`` gives the durability: the model's text
    from inside its activity; ``KenningDurability`` writes the other events itself, from
    workflow code (``write_from_workflow``)."""

    def __init__(self, key: str) -> None:
        self.key = key

    async def __call__(self, run_ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        ctx = current_unit.get()
        waiting: PartDeltaEvent | None = None  # text deltas joined, not yet written
        since = 0.0
        async for event in events:
            if ctx is None or not is_text(event):  # only inside the model-request activity
                continue
            joined = _joined(waiting, event)
            if joined is not None and time.monotonic() - since < DELTA_WINDOW_SECONDS:
                waiting = joined
                continue
            if waiting is not None:  # another part, or its window is over: written now
                await write_event(ctx, self.key, event_json(waiting))
            waiting, since = None, time.monotonic()
            if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                waiting = event
            else:
                await write_event(ctx, self.key, event_json(event))
        if ctx is not None and waiting is not None:
            await write_event(ctx, self.key, event_json(waiting))

    async def write_from_workflow(self, ctx: WorkflowContext, event: AgentStreamEvent) -> None:
        await write_event(ctx, self.key, event_json(event))


def _joined(waiting: PartDeltaEvent | None, event: AgentStreamEvent) -> PartDeltaEvent | None:
    """``waiting`` with ``event``'s text appended, when both are text deltas of one part."""
    if waiting is None or not isinstance(event, PartDeltaEvent) or event.index != waiting.index:
        return None
    if not isinstance(event.delta, TextPartDelta) or not isinstance(waiting.delta, TextPartDelta):
        return None
    if event.delta.citations_delta or waiting.delta.citations_delta:
        return None
    delta = dataclasses.replace(waiting.delta, content_delta=waiting.delta.content_delta + event.delta.content_delta)
    return dataclasses.replace(waiting, delta=delta)
