"""``WorkflowContext``: what workflow and activity code sees of the engine, and the
interface the engine implements for it.

``Runtime`` is that interface (as Temporal's ``workflow/_context.py`` owns ``_Runtime``):
``activity``, ``register_compensation``, ``wait_event``, ``wait_timer``/``wait_until``,
``start_child`` and a child's ``result()``, ``send_event_transactional``, ``ctx.patched``
and the context's properties go through its members and nothing else: never the
engine's internals, never storage. ``kenning.engine.run.WorkflowRun`` implements it; the
SDK imports no engine module. ``StepScope`` is one attempt's transaction as the SDK sees it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from kenning import codecs
from kenning.core.records import HistoryRecord, OutboxEvent

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kenning.activity import Activity
    from kenning.workflow import Workflow


class StepScope(Protocol):
    """The transaction of one activity or compensation attempt: its ``ctx.session``
    writes, its outbox events and its record commit together, or not at all."""

    @property
    def session(self) -> AsyncSession: ...

    @property
    def in_transaction(self) -> bool:
        """Whether the attempt opened the transaction (``ctx.session``, outbox events)."""
        ...

    def after_commit(self, callback: Callable[[], Awaitable[None]]) -> None: ...

    async def add_outbox_event(self, event: OutboxEvent) -> None: ...

    async def rollback(self) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class ChildOptions:
    """How ``start_child`` starts a child (``kenning.children.start_child`` says what each
    means), passed as one from the SDK to the engine (``kenning.engine.children``)."""

    child_id: str | None = None
    on_parent_cancel: str = "cancel"
    queue: str | None = None
    partition_key: str | None = None
    priority: int | None = None
    timeout: float | None = None  # seconds; None: the child workflow's @workflow(timeout=...)
    search_attributes: dict[str, Any] | None = None  # declared keys set with the child's row


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

    async def continue_as_new(self, new_input: dict[str, Any]) -> NoReturn:
        """End this run; the next one of the same instance starts with ``new_input``."""
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

    async def reply_message(self, message_id: str, topic: str, value: Any, error: str | None) -> None:
        """Nothing on replay; else store the reply to a received message (a request), the
        reply and the step committed together (``ReceivedMessage.reply``)."""

    async def publish_value(self, key: str, value: Any) -> None:
        """Nothing on replay; else publish the value (and its search text, for a declared
        search attribute), the value and the step committed together (``publish_value``)."""
        ...

    async def write_stream(self, key: str, value: Any, publish: bool) -> int:
        """The entry's offset: from workflow code the recorded one on replay (nothing
        written), else the entry and the step committed together; from an activity the
        entry committed at once with the attempt's number (``write_stream``)."""
        ...

    async def close_stream(self, key: str) -> None:
        """Close the stream, as ``write_stream`` writes (``close_stream``)."""
        ...


class Heartbeat(Protocol):
    """One activity attempt's heartbeat, as ``ctx.heartbeat`` sees it; the engine
    implements it (``kenning.engine.heartbeats``)."""

    @property
    def previous_details(self) -> Any:
        """What the step's earlier attempts heartbeated last (None if nothing)."""
        ...

    def beat(self, details: Any) -> None:
        """The attempt is alive and ``details`` is its checkpoint; callable from a sync
        activity's thread."""
        ...


# The transaction of the activity or compensation attempt running in this task, if any.
current_step: ContextVar[StepScope | None] = ContextVar("kenning_current_step", default=None)


@dataclass(frozen=True)
class AttemptId:
    """The activity or compensation attempt running in this task: its step and its
    number (1 for the first), as stream entries written from it carry them."""

    step_id: str
    number: int


current_attempt: ContextVar[AttemptId | None] = ContextVar("kenning_current_attempt", default=None)
# The heartbeat of the activity attempt running in this task (or its thread), if any.
current_heartbeat: ContextVar[Heartbeat | None] = ContextVar("kenning_current_heartbeat", default=None)
# The context of the workflow whose code runs in this task, if any: an adapter (kenning.ai)
# tells workflow code, which must stay deterministic, from an activity (current_step set).
current_workflow: ContextVar[WorkflowContext | None] = ContextVar("kenning_current_workflow", default=None)


def in_workflow_code() -> WorkflowContext | None:
    """The running workflow's context when this is its code, not one of its activities."""
    ctx = current_workflow.get()
    return ctx if ctx is not None and current_step.get() is None else None


class WorkflowContext:
    """Passed as the first argument to every workflow, activity and compensation."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @property
    def runtime(self) -> Runtime:
        """The engine's interface for SDK functions (``Runtime``)."""
        return self._runtime

    @property
    def instance_id(self) -> str:
        return self._runtime.instance_id

    @property
    def workflow_name(self) -> str:
        return self._runtime.workflow_name

    @property
    def is_replaying(self) -> bool:
        """True while the workflow is still catching up with recorded history."""
        return self._runtime.is_replaying

    async def patched(self, patch_id: str) -> bool:
        """Change a workflow while old instances finish on the old path (Temporal's
        ``workflow.patched``)::

            if await ctx.patched("reserve-v2"):
                await reserve_v2(ctx, order_id)  # new instances, and those not yet here
            else:
                await reserve(ctx, order_id)  # instances that went past here on the old code

        True on new runs and for instances whose history has the patch's marker (recorded
        the first time it answers True, so replays agree); False for an instance that went
        past this point before the change. Once no instance without the marker is in flight
        (``kenning replay-check`` tells), remove the call and the old path.
        """
        return await self._runtime.patched(patch_id)

    @property
    def session(self) -> AsyncSession:
        """The SQLAlchemy session of the running activity: the same transaction that
        records the activity's result. Outside an activity it raises ``RuntimeError``."""
        step = current_step.get()
        if step is None:
            raise RuntimeError("ctx.session is only available inside an activity or compensation")
        return step.session

    def heartbeat(self, details: Any = None) -> None:
        """Inside an activity: say the attempt is alive, and keep ``details`` (any JSON
        value) as its checkpoint (Temporal's ``activity.heartbeat``)::

            @activity(heartbeat_timeout=30)
            async def import_rows(ctx: WorkflowContext, path: str) -> int:
                start = ctx.heartbeat_details or 0  # where an earlier attempt got to
                for n, row in enumerate(read_rows(path)):
                    if n >= start:
                        await insert(row)
                        ctx.heartbeat(n + 1)
                return n + 1

        With ``heartbeat_timeout``, an attempt that goes that long without a heartbeat
        fails with ``HeartbeatTimeoutError`` (counted by the retry policy) long before its
        lease would tell. The details are written to the database at most every few
        seconds, and at once when the attempt fails; a sync activity may call it from its
        thread. Outside an activity it raises ``RuntimeError``.
        """
        heartbeat = current_heartbeat.get()
        if heartbeat is None:
            raise RuntimeError("ctx.heartbeat is only available inside an activity")
        heartbeat.beat(details)

    @property
    def heartbeat_details(self) -> Any:
        """Inside an activity: the details the step's earlier attempts heartbeated last (a
        retry's, or one whose worker died), as JSON values; None on a first attempt."""
        heartbeat = current_heartbeat.get()
        if heartbeat is None:
            raise RuntimeError("ctx.heartbeat_details is only available inside an activity")
        return codecs.unseal(heartbeat.previous_details)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A savepoint inside the activity's transaction (Edda's ``ctx.transaction()``)."""
        session = self.session
        async with session.begin_nested():
            yield session

    def __repr__(self) -> str:
        return f"WorkflowContext(instance_id={self.instance_id!r}, workflow_name={self.workflow_name!r})"
