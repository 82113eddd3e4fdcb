"""``Runtime``: the engine as SDK functions see it (``ctx.runtime``).

``activity``, ``register_compensation``, ``wait_event``, ``wait_timer``/``wait_until``,
``start_child`` and a child's ``result()``,
``send_event_transactional``, ``ctx.patched`` and the context's properties go through these members and
nothing else: never the engine's internals, never storage. ``WorkflowRun`` implements it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from kenning.engine.port import OutboxEvent, StepScope
from kenning.storage.records import HistoryRecord

if TYPE_CHECKING:
    from kenning.activity import Activity
    from kenning.workflow import Workflow


@dataclass(frozen=True)
class ChildOptions:
    """How ``start_child`` starts a child (``kenning.children.start_child`` says what each
    means), passed as one from the SDK to the engine (``kenning.engine.children``)."""

    child_id: str | None = None
    on_parent_cancel: str = "cancel"
    queue: str | None = None
    partition_key: str | None = None
    priority: int | None = None


class Runtime(Protocol):
    @property
    def instance_id(self) -> str: ...

    @property
    def workflow_name(self) -> str: ...

    @property
    def is_replaying(self) -> bool: ...

    async def run_activity(
        self, act: Activity[Any], args: tuple[Any, ...], kwargs: dict[str, Any], activity_id: str | None
    ) -> Any:
        """The activity's recorded result on replay; else run it (retried) and record it."""
        ...

    def register_compensation(
        self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], activity_id: str | None
    ) -> None: ...

    async def wait_timer(
        self, step_name: str, timer_id: str | None, *, due_at: datetime | None, delay_seconds: float | None
    ) -> None:
        """Return at once on replay of a fired timer; else suspend the instance until it fires."""
        ...

    async def wait_event(
        self,
        event_type: str,
        *,
        event_id: str | None,
        match: Any,
        since_at: datetime | None,
        since_seconds: float | None,
        timeout_seconds: float | None,
    ) -> HistoryRecord:
        """The recorded ``EventReceived`` or ``EventTimeout``; else suspend until there is one."""
        ...

    async def start_child(
        self, workflow: Workflow[Any], arguments: dict[str, Any], options: ChildOptions
    ) -> tuple[str, str]:
        """(child id, start step id): the recorded child on replay; else start one (in
        ``options.queue``, else its workflow's), its row and the step committed together."""
        ...

    async def wait_child(self, start_step_id: str, child_id: str, workflow_name: str) -> HistoryRecord:
        """The child's recorded end (``EventReceived``); else suspend until it ends."""
        ...

    async def send_event(self, step: StepScope, event: OutboxEvent, data: Any) -> None:
        """Write ``event`` in the running attempt's transaction."""
        ...

    async def patched(self, patch_id: str) -> bool:
        """Whether this instance takes the new path of a changed workflow (``ctx.patched``)."""
        ...

    async def send_message(self, instance_id: str, topic: str, data: Any, message_id: str | None) -> str:
        """The recorded message id on replay; else send it, the message and the step
        committed together (``send_message``)."""
        ...

    async def subscribe(self, channel: str) -> None:
        """Subscribe to a channel's broadcasts, as a step (``subscribe``)."""
        ...

    async def publish(self, channel: str, data: Any, message_id: str | None) -> int:
        """The recorded count on replay; else broadcast to the channel's subscribers, as a
        step (``publish``)."""
        ...

    async def receive_message(
        self, topic: str, *, receive_id: str | None, timeout_seconds: float | None
    ) -> HistoryRecord:
        """The recorded ``MessageReceived`` or ``MessageTimeout``; else take the mailbox's
        oldest message or suspend until there is one (``receive``)."""
        ...
