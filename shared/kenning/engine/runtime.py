"""``Runtime``: the engine as SDK functions see it (``ctx.runtime``).

``activity``, ``register_compensation``, ``wait_event``, ``wait_timer``/``wait_until``,
``send_event_transactional``, ``ctx.patched`` and the context's properties go through these members and
nothing else: never the engine's internals, never storage. ``WorkflowRun`` implements it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from kenning.engine.port import OutboxEvent, StepScope
from kenning.storage.records import HistoryRecord

if TYPE_CHECKING:
    from kenning.activity import Activity


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

    async def send_event(self, step: StepScope, event: OutboxEvent, data: Any) -> None:
        """Write ``event`` in the running attempt's transaction."""
        ...

    async def patched(self, patch_id: str) -> bool:
        """Whether this instance takes the new path of a changed workflow (``ctx.patched``)."""
        ...
