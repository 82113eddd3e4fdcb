"""Lifecycle hooks (Edda 0.1.0's ``WorkflowHooks`` protocol and ``HooksBase``).

Unlike Edda 0.1.0, every hook fires on every path: a workflow resumed by another
worker completes, fails or is cancelled with the same hooks as one that ran in one go.
``step`` is the step id (``"charge:1"``), which is what Edda passed at run time.

Where each hook runs: the workflow and activity hooks in the worker running the
instance; ``on_event_sent`` in that worker once the activity's transaction committed;
``on_event_received(instance_id, event_type, event_data)`` in the worker that delivered
the event, once per instance it was delivered to, after the delivery committed (never
again when a replay reads the recorded event; ``event_data`` is the CloudEvent's data,
JSON or bytes). Edda 0.1.0 declared both event hooks and never called them.
"""

from __future__ import annotations

from typing import Any, Protocol

import structlog

_log = structlog.get_logger("kenning.hooks")


class WorkflowHooks(Protocol):
    async def on_workflow_start(self, instance_id: str, workflow_name: str, input_data: dict[str, Any]) -> None: ...
    async def on_workflow_complete(self, instance_id: str, workflow_name: str, result: Any) -> None: ...
    async def on_workflow_failed(self, instance_id: str, workflow_name: str, error: Exception) -> None: ...
    async def on_workflow_cancelled(self, instance_id: str, workflow_name: str) -> None: ...
    async def on_activity_start(self, instance_id: str, step: str, activity_name: str, is_replaying: bool) -> None: ...
    async def on_activity_complete(
        self, instance_id: str, step: str, activity_name: str, result: Any, cache_hit: bool
    ) -> None: ...
    async def on_activity_failed(self, instance_id: str, step: str, activity_name: str, error: Exception) -> None: ...
    async def on_activity_retry(
        self, instance_id: str, step: str, activity_name: str, attempt: int, delay: float
    ) -> None: ...
    async def on_event_sent(self, event_type: str, event_source: str, event_data: Any) -> None: ...
    async def on_event_received(self, instance_id: str, event_type: str, event_data: Any) -> None: ...


class HooksBase:
    """No-op implementation of every hook; subclass and override what you need."""

    async def on_workflow_start(self, instance_id: str, workflow_name: str, input_data: dict[str, Any]) -> None:
        pass

    async def on_workflow_complete(self, instance_id: str, workflow_name: str, result: Any) -> None:
        pass

    async def on_workflow_failed(self, instance_id: str, workflow_name: str, error: Exception) -> None:
        pass

    async def on_workflow_cancelled(self, instance_id: str, workflow_name: str) -> None:
        pass

    async def on_activity_start(self, instance_id: str, step: str, activity_name: str, is_replaying: bool) -> None:
        pass

    async def on_activity_complete(
        self, instance_id: str, step: str, activity_name: str, result: Any, cache_hit: bool
    ) -> None:
        pass

    async def on_activity_failed(self, instance_id: str, step: str, activity_name: str, error: Exception) -> None:
        pass

    async def on_activity_retry(
        self, instance_id: str, step: str, activity_name: str, attempt: int, delay: float
    ) -> None:
        pass

    async def on_event_sent(self, event_type: str, event_source: str, event_data: Any) -> None:
        pass

    async def on_event_received(self, instance_id: str, event_type: str, event_data: Any) -> None:
        pass


async def call_hook(hooks: object | None, name: str, *args: Any) -> None:
    """Call ``hooks.<name>(*args)`` if it exists; a failing hook is logged, never fatal."""
    if hooks is None:
        return
    method = getattr(hooks, name, None)
    if method is None:
        return
    try:
        await method(*args)
    except Exception:
        _log.exception("hook.failed", hook=name)
