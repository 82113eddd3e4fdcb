"""``send_event_transactional`` as Edda called it: inside an activity it is Kenning's (the
event commits with the activity); in a workflow body, where Edda logged a warning and
wrote the event on every replay, it is a step of its own (the activity below), so the
event is written once and published by ``kenning relayer``."""

from __future__ import annotations

from typing import Any

from kenning import outbox
from kenning.activity import activity
from kenning.context import WorkflowContext, current_step


@activity
async def edda_send_event_transactional(
    ctx: WorkflowContext, event_type: str, event_source: str, event_data: Any, content_type: str | None = None
) -> str:
    return await outbox.send_event_transactional(ctx, event_type, event_source, event_data, content_type)


async def send_event_transactional(
    ctx: WorkflowContext, event_type: str, event_source: str, event_data: Any, content_type: str | None = None
) -> str:
    if current_step.get() is None:  # the workflow body: a step, recorded once
        sent: str = await edda_send_event_transactional(ctx, event_type, event_source, event_data, content_type)
        return sent
    return await outbox.send_event_transactional(ctx, event_type, event_source, event_data, content_type)
