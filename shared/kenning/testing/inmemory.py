"""The environment's in-memory backend: the engine on ``kenning.testing.memoryport``'s port,
with what the worker's inbox loop and the scheduler do done here, on a virtual clock.

The clock starts at the wall clock's time and moves only when the environment skips
time; runs take no virtual time. Every rule is production's: an event goes to each
waiting instance whose subscription takes it (``MemoryInstance.takes``: type, ``match``,
addressed instance, ``since``), a new subscription takes the oldest such event already
received, an ``event_handler`` workflow named like the event starts once per event,
due timers and timeouts fire oldest first, back-offs end on the clock, a cancel makes a
waiting instance runnable to be compensated, a child's end wakes its parent.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from kenning import codecs
from kenning.core.records import TERMINAL_STATUSES
from kenning.engine.commands import SuspendOnEvent
from kenning.events import ReceivedEvent, event_history_payload
from kenning.flow import BATCH_PARAMETER
from kenning.starting import InvalidInputError, Start, prepare_start
from kenning.storage.replies import RequestState
from kenning.testing.memoryport import run_once
from kenning.testing.memorystate import MemoryEvent, MemoryInstance, child_end_payload, stamp
from kenning.testing.state import HistoryEntry, InstanceState, OutgoingEvent

if TYPE_CHECKING:
    from kenning.app import App

_log = structlog.get_logger("kenning.testing")

_RUNNABLE = ("pending", "running", "compensating")
# runs without an instance coming to rest before the environment gives up: a workflow
# that loops for ever without waiting (never in production either: it would hold a worker)
MAX_RUNS = 10_000
# runs of one instance in one settle after which one that never waits (a continue_as_new
# chain that only continues) is taken to run until its workflow timeout: on PostgreSQL the
# clock moves while it runs and the deadline ends it (WorkflowTimeoutError), here the clock
# moves only when told, so it is moved to the deadline
NEVER_WAITS_RUNS = 1_000


@dataclass
class VirtualClock:
    """Epoch seconds that move only when told."""

    seconds: float = field(default_factory=lambda: datetime.now(UTC).timestamp())

    def __call__(self) -> float:
        return self.seconds

    def advance(self, seconds: float) -> None:
        self.seconds += max(seconds, 0.0)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.seconds, UTC)


def _pending_deadline(instance: MemoryInstance) -> float | None:
    """The workflow timeout's deadline the scheduler would still fire (``storage/deadlines.py``'s
    rule: unfinished, not compensating, not already asked to cancel), else None."""
    if instance.status in (*TERMINAL_STATUSES, "compensating") or instance.cancel_requested:
        return None
    return instance.deadline_at


def event_start_key(source: str, event_id: str) -> str:
    """The idempotency key of the instance an event starts, as the worker's inbox makes it."""
    return "cloudevent:" + json.dumps([source, event_id], ensure_ascii=False)


class MemoryBackend:
    """Instances, the inbox and the clock, in this process."""

    def __init__(self, app: App, *, start_time: datetime | None = None) -> None:
        self.app = app
        self.clock = VirtualClock(start_time.timestamp()) if start_time is not None else VirtualClock()
        self.instances: dict[str, MemoryInstance] = {}  # every instance, children too, by id
        self.inbox: list[MemoryEvent] = []
        self.keys: dict[str, str] = {}  # idempotency key -> instance id

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def now(self) -> datetime:
        return self.clock.now()

    # ---------------------------------------------------------------- what a test sends

    async def start(self, start: Start) -> str:
        new = start.instance
        key = new.idempotency_key
        if key is not None and key in self.keys:
            return self.keys[key]
        if new.instance_id not in self.instances:
            instance = MemoryInstance(new.instance_id, new.workflow_name, dict(new.input_json))
            if new.timeout_seconds is not None:  # the insert sets it on the database clock
                instance.deadline_at = self.clock() + new.timeout_seconds
            instance.set_search_attributes(new.search_attributes)
            self._add(instance)
            if key is not None:
                self.keys[key] = new.instance_id
        return new.instance_id

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
    ) -> bool:
        if any(e.source == source and e.event_id == event_id for e in self.inbox):
            return False  # the inbox keeps one row per (source, id): a duplicate is dropped
        # as the worker reads it: opened (the caller sealed it as the ingress would store it),
        # so match, handlers and event_handler workflows see the data, not its envelope
        data = codecs.unseal(data)
        received = ReceivedEvent(
            data=data,
            type=event_type,
            source=source,
            id=event_id,
            subject=subject,
            extensions={**extensions, **({"kenninginstanceid": instance_id} if instance_id else {})},
        )
        payload, payload_bytes = event_history_payload(received)
        event = MemoryEvent(
            event_type, source, event_id, data, stamp(self.clock()), instance_id, payload, payload_bytes
        )
        self.inbox.append(event)
        await self._receive(event, received)
        return True

    async def send_message(self, instance_id: str, topic: str, data: Any, message_id: str) -> None:
        from kenning.core.mailbox import Undelivered, refusal

        recipient = self.instances.get(instance_id)
        if recipient is None:
            raise refusal(Undelivered.UNKNOWN_INSTANCE, instance_id, topic, None)
        refused = recipient.send_message(topic, data, message_id=message_id)
        if refused is not None:
            raise refusal(refused, instance_id, topic, recipient.status)

    async def send_request(self, instance_id: str, topic: str, data: Any, request_id: str) -> None:
        from kenning.core.mailbox import Undelivered, request_refusal

        recipient = self.instances.get(instance_id)
        if recipient is None:
            raise request_refusal(Undelivered.UNKNOWN_INSTANCE, instance_id, topic, request_id, None)
        if any(m.message_id == request_id for m in recipient.mailbox):
            return  # asked again: sent once (also once the instance ended), as PostgreSQL does
        refused = recipient.send_message(topic, data, message_id=request_id)
        if refused is not None:
            raise request_refusal(refused, instance_id, topic, request_id, recipient.status)

    async def request_state(self, instance_id: str, request_id: str) -> RequestState | None:
        instance = self.instances.get(instance_id)
        if instance is None:
            return None
        reply = instance.replies.get(request_id)
        if reply is None:
            return RequestState(status=instance.status, replied=False, value=None, error=None)
        return RequestState(status=instance.status, replied=True, value=codecs.unseal(reply[0]), error=reply[1])

    async def publish(self, channel: str, data: Any, message_id: str) -> int:
        reached = 0
        for instance in sorted(self.instances.values(), key=lambda i: i.id):
            if channel in instance.channels:
                reached += instance.send_message(channel, data, message_id=message_id) is None
        return reached

    async def cancel(self, instance_id: str) -> bool:
        instance = self._get(instance_id)
        if instance.status in TERMINAL_STATUSES:
            return False
        self._request_cancel(instance)
        return True

    def _request_cancel(self, instance: MemoryInstance) -> None:
        """``instance_request_cancel``: flag it; a waiting one becomes runnable now, its
        waits removed."""
        instance.cancel_requested = True
        if instance.status in ("waiting_for_event", "waiting_for_timer", "waiting_for_message"):
            instance.status = "pending"
            instance.waiting_for, instance.receiving, instance.due_at = None, None, None
        if instance.lease_token is None:
            instance.available_at = self.clock()

    # ---------------------------------------------------------------- what a test reads

    async def state(self, instance_id: str) -> InstanceState:
        instance = self._get(instance_id)
        return InstanceState(
            instance_id=instance.id,
            workflow_name=instance.workflow_name,
            status=instance.status,
            # opened as the database backend's readers open them ("encrypted" without the key)
            result=codecs.shown(instance.result),
            error=codecs.shown(instance.error),
            cancel_requested=instance.cancel_requested,
            history=tuple(
                HistoryEntry(r.step_id, r.kind, r.step_name, codecs.shown(r.payload)) for r in instance.history
            ),
            values={key: codecs.shown(value) for key, value in instance.values.items()},
            search_attributes=dict(instance.search_attributes),
            run=instance.run,
            streams={
                key: tuple(dataclasses.replace(e, value=codecs.shown(e.value)) for e in stream.entries)
                for key, stream in instance.streams.items()
            },
            closed_streams=frozenset(key for key in instance.streams if instance.stream_closed(key)),
        )

    async def instance_ids(self) -> list[str]:
        return list(self.instances)

    async def outbox(self) -> list[OutgoingEvent]:
        return [
            OutgoingEvent(
                e.event_type, e.source, None if e.data_json is None else codecs.unseal(json.loads(e.data_json)), i.id
            )
            for i in self.instances.values()
            for e in i.outbox
        ]

    # ---------------------------------------------------------------- running and time

    async def settle(self) -> None:
        """Run what is runnable, deliver, fire what is due, until nothing is left to do."""
        runs: Counter[str] = Counter()
        for _ in range(MAX_RUNS):
            self._adopt_children()
            self._settle_ends()
            self._fire_due()
            runnable = [
                i
                for i in self.instances.values()
                if i.status in _RUNNABLE and i.lease_token is None and i.available_at <= self.clock()
            ]
            if not runnable:
                return
            instance = runnable[0]
            if runs[instance.id] >= NEVER_WAITS_RUNS and self._skip_to_deadline(instance):
                runs[instance.id] = 0
                continue
            runs[instance.id] += 1
            await run_once(self.app, instance, inline_retry_seconds=0.0, clock=self.clock)
            self._catch_up(instance)
        raise RuntimeError(f"instances still running after {MAX_RUNS} runs: a workflow that never waits or ends?")

    def _skip_to_deadline(self, instance: MemoryInstance) -> bool:
        """Move the clock to the workflow timeout of an instance that never waits, so the
        next pass fires it; False when it has none (then nothing ever ends it)."""
        deadline = _pending_deadline(instance)
        if deadline is None:
            return False
        _log.info("settle.never_waits", instance_id=instance.id, workflow=instance.workflow_name)
        self.clock.advance(deadline - self.clock())
        return True

    async def next_due(self) -> float | None:
        now = self.clock()
        dues = [
            i.due_at
            for i in self.instances.values()
            if i.due_at is not None and i.status in ("waiting_for_timer", "waiting_for_event", "waiting_for_message")
        ]
        dues += [
            i.available_at
            for i in self.instances.values()
            if i.status in _RUNNABLE and i.lease_token is None and i.available_at > now
        ]
        deadlines = (_pending_deadline(i) for i in self.instances.values())
        dues += [deadline for deadline in deadlines if deadline is not None and deadline > now]
        return None if not dues else min(dues) - now

    async def skip(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # ---------------------------------------------------------------- the worker's and scheduler's parts

    def _get(self, instance_id: str) -> MemoryInstance:
        from kenning.errors import WorkflowNotFoundError

        instance = self.instances.get(instance_id)
        if instance is None:
            raise WorkflowNotFoundError(f"no workflow instance {instance_id!r}")
        return instance

    def _add(self, instance: MemoryInstance) -> None:
        instance.peers = self.instances  # every instance may send to every other by id
        instance.available_at = self.clock()
        self.instances[instance.id] = instance

    def _adopt_children(self) -> None:
        """Children a run started (``start_child`` writes them into their parent)."""
        for parent in list(self.instances.values()):
            for child in parent.children:
                if child.id not in self.instances:
                    self._add(child)

    def _settle_ends(self) -> None:
        """A child's end wakes its waiting parent; a parent's end cancels its ``cancel`` children."""
        from kenning.core.names import EVENT_RECEIVED
        from kenning.engine.commands import WaitChild

        for parent in list(self.instances.values()):
            waiting = parent.waiting_for
            if isinstance(waiting, WaitChild) and parent.status == "waiting_for_event":
                child = self.instances.get(waiting.child_id)
                if child is not None and child.status in TERMINAL_STATUSES:
                    parent.append(waiting.step_id, EVENT_RECEIVED, waiting.step_name, child_end_payload(child))
                    parent.waiting_for, parent.status = None, "pending"
                    parent.available_at = self.clock()
            if parent.status in TERMINAL_STATUSES:
                for child in parent.children:
                    if child.on_parent_cancel == "cancel" and child.status not in TERMINAL_STATUSES:
                        self._request_cancel(child)

    def _fire_due(self) -> None:
        """The scheduler's pass: every wait due on the clock, oldest first."""
        now = self.clock()
        due = sorted(
            (i for i in self.instances.values() if i.due_at is not None and i.due_at <= now),
            key=lambda i: (i.due_at, i.id),
        )
        for instance in due:
            if instance.fire_due(now):
                instance.available_at = now
        for instance in self.instances.values():
            deadline = _pending_deadline(instance)
            if deadline is not None and deadline <= now:
                _log.info("deadline.fired", instance_id=instance.id, workflow=instance.workflow_name)
                self._request_cancel(instance)  # the worker ends it failed with WorkflowTimeoutError

    async def _receive(self, event: MemoryEvent, received: ReceivedEvent) -> None:
        """The inbox loop's processing of one event: handlers, starts, deliveries."""
        for handler in self.app.event_handlers.get(event.event_type, []):
            await handler(received)
        for wf in self.app.registry.workflows.values():
            if wf.event_handler and wf.name == event.event_type:
                try:
                    data = received.data if isinstance(received.data, dict) else {}
                    start = prepare_start(
                        wf,
                        {BATCH_PARAMETER: [received.data]} if wf.batch is not None else data,  # a batch of one
                        idempotency_key=event_start_key(event.source, event.event_id),
                        own_ids=True,
                        registry=self.app.registry,
                        flow_control=False,  # no bursts in memory: each event starts one
                    )
                except InvalidInputError as error:
                    # the worker parks such a row as failed; a test hears it at once
                    raise InvalidInputError(
                        f"event data is not valid input for workflow {wf.name!r}: {error.detail}"
                    ) from None
                await self.start(start)
        for instance in sorted(self.instances.values(), key=lambda i: i.waited_at):
            if instance.takes(event):
                instance.record_event(event.payload, event.payload_bytes)
                instance.available_at = self.clock()
                _log.debug("event.delivered", instance_id=instance.id, event_type=event.event_type)

    def _catch_up(self, instance: MemoryInstance) -> None:
        """A new subscription takes the oldest event already received that it takes."""
        if instance.status != "waiting_for_event" or not isinstance(instance.waiting_for, SuspendOnEvent):
            return
        for event in self.inbox:  # in the order received
            if instance.takes(event):
                instance.record_event(event.payload, event.payload_bytes)
                instance.available_at = self.clock()
                return
