"""What a test reads of an instance, the same from either backend: its status, result,
error and history (``InstanceState``), and the interface both backends implement."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from kenning.core.streams import StreamEntry
from kenning.starting import Start
from kenning.storage.replies import RequestState


@dataclass(frozen=True)
class HistoryEntry:
    """One step of an instance's history."""

    step_id: str
    kind: str  # ActivityCompleted, EventReceived, TimerExpired, CompensationExecuted, ...
    step_name: str
    payload: Any


@dataclass(frozen=True)
class InstanceState:
    """An instance as storage holds it."""

    instance_id: str
    workflow_name: str
    status: str
    result: Any  # the stored result, {"result": value}, once completed
    error: dict[str, Any] | None
    cancel_requested: bool
    history: tuple[HistoryEntry, ...]
    # what it published (publish_value, set_status: the latest per key) and its search
    # attributes as indexed text (@workflow(search_attributes=...))
    values: dict[str, Any] = field(default_factory=dict)
    search_attributes: dict[str, str] = field(default_factory=dict)
    run: int = 1  # continue_as_new: the run of its chain in progress, or the last
    # its durable streams (write_stream): every entry by key, and the keys closed (by
    # close_stream, or every one once the instance has ended)
    streams: dict[str, tuple[StreamEntry, ...]] = field(default_factory=dict)
    closed_streams: frozenset[str] = frozenset()

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")


@dataclass(frozen=True)
class OutgoingEvent:
    """A CloudEvent an activity sent with ``send_event_transactional`` (the outbox)."""

    event_type: str
    source: str
    data: Any
    instance_id: str | None


class Backend(Protocol):
    """Where the environment's instances live: in memory, or on PostgreSQL with a worker
    and a scheduler. ``settle`` runs everything runnable until every instance waits or
    has ended; ``next_due`` and ``skip`` are the time-skipping clock, used only while
    settled."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    def now(self) -> datetime: ...

    async def start(self, start: Start) -> str: ...

    async def send_event(
        self,
        event_type: str,
        data: Any,
        *,
        source: str,
        event_id: str,
        subject: str | None,
        instance_id: str | None,
        extensions: dict[str, Any],
    ) -> bool: ...

    async def send_message(self, instance_id: str, topic: str, data: Any, message_id: str) -> None: ...

    async def publish(self, channel: str, data: Any, message_id: str) -> int: ...

    async def send_request(self, instance_id: str, topic: str, data: Any, request_id: str) -> None: ...

    async def request_state(self, instance_id: str, request_id: str) -> RequestState | None: ...

    async def cancel(self, instance_id: str) -> bool: ...

    async def state(self, instance_id: str) -> InstanceState: ...

    async def instance_ids(self) -> list[str]: ...

    async def outbox(self) -> list[OutgoingEvent]: ...

    async def settle(self) -> None: ...

    async def next_due(self) -> float | None: ...

    async def skip(self, seconds: float) -> None: ...
