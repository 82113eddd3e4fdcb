"""``InstancePort``: everything the engine needs from the outside world, for one claimed
instance. The worker's PostgreSQL adapter (``kenning_worker.port``) and the in-memory one
(``kenning.testing.memoryport``) implement it; ``tests/integration/test_port_members.py``
holds both to what each member's docstring says.

Errors are the port's to map: a write refused because the lease moved raises
``LeaseLostError``, the database being away ``StorageUnavailable``, a value the database
cannot store ``UnstorableValueError`` (the held-back record that rode along is dropped).
A step's write that carries the held-back record (a message, a reply, a published value,
a stream entry) raises ``CancelSeenBeforeWrite`` when that record's fence sees a cancel:
the record is committed, the step's rows are not.
Every write tells the port whether cancellation was requested; ``cancel_requested``
reports the latest answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kenning.context import StepScope
from kenning.core.records import HistoryRecord, SuspendOutcome
from kenning.engine.commands import (
    AttemptCounted,
    BeginCompensating,
    ChildStarted,
    CloseStream,
    Complete,
    ContinueAsNew,
    CountAttempt,
    DroppedCompensation,
    FailSaga,
    Finish,
    MessageSent,
    Publish,
    PublishValue,
    ReceiveMessage,
    RecordHeartbeat,
    RecordStep,
    ReleaseWithDelay,
    ReplyMessage,
    SaveCompensation,
    SendMessage,
    StartChild,
    Subscribe,
    Suspend,
    WaitChild,
    WriteStream,
)

if TYPE_CHECKING:
    from datetime import datetime

    from kenning.core.streams import StreamEntry


class InstancePort(Protocol):
    @property
    def cancel_requested(self) -> bool: ...

    def open_step(self) -> StepScope:
        """A fresh transaction scope for one attempt (opened lazily)."""
        ...

    async def record_step(self, command: RecordStep, step: StepScope | None = None) -> None:
        """Record a step; in ``step``'s transaction when the attempt opened it."""
        ...

    def save_compensation(self, command: SaveCompensation) -> None: ...

    async def flush(self) -> None:
        """Write the held-back step record, with the unsaved compensations riding along;
        with no record held back, compensations wait for the next write that carries them
        (``SaveCompensation``: a step's record, a suspend, the saga's beginning)."""
        ...

    def discard(self) -> None:
        """Drop a held-back step record (the run is abandoned or the value was refused)."""
        ...

    async def count_attempt(self, command: CountAttempt) -> AttemptCounted: ...

    async def record_heartbeat(self, command: RecordHeartbeat) -> bool:
        """Keep the details (its own commit, never waiting for held-back writes); False
        when the lease was lost (nothing written)."""
        ...

    async def deadline_passed(self) -> datetime | None:
        """The instance's workflow-timeout deadline if it has passed (database clock), else
        None: asked only once a cancellation is seen, to tell a timeout from a cancel."""
        ...

    async def release(self, command: ReleaseWithDelay) -> None: ...

    async def suspend(self, command: Suspend) -> SuspendOutcome:
        """Register the wait and give the lease back, folding what is held back; answers
        ``CANCELLED`` (nothing registered, lease kept) when cancellation was requested."""
        ...

    async def start_child(self, command: StartChild) -> ChildStarted:
        """Insert the child and record the step, folding what is held back: one transaction."""
        ...

    async def wait_child(self, command: WaitChild) -> HistoryRecord | SuspendOutcome:
        """The recorded end of a child that has ended (the lease is kept), or what the
        suspend did, as ``suspend`` answers."""
        ...

    async def complete(self, command: Complete) -> bool:
        """End the instance ``completed``, folding what is held back; False (what is held
        back written, the lease kept) when cancellation was requested: a cancel accepted
        before the completion commits wins, as Edda re-checks after every activity."""
        ...

    async def begin_compensating(self, command: BeginCompensating) -> list[DroppedCompensation]:
        """Returns the unsaved compensations the database refused to store (never run)."""
        ...

    async def finish(self, command: Finish | FailSaga) -> None: ...

    async def send_message(self, command: SendMessage) -> MessageSent:
        """The message into its recipient's mailbox and the sending step's record, in one
        transaction (after what is held back)."""
        ...

    async def subscribe(self, command: Subscribe) -> None:
        """The subscription and the step's record in one transaction."""
        ...

    async def publish(self, command: Publish) -> int:
        """A copy of the message in every subscriber's mailbox and the step's record, in one
        transaction; the number of subscribers reached."""
        ...

    async def receive_message(self, command: ReceiveMessage) -> HistoryRecord | SuspendOutcome:
        """The message taken and its ``MessageReceived`` record (lease kept), or the wait
        registered and the lease given back (``SUSPENDED``), folding what is held back;
        ``CANCELLED`` (nothing taken, lease kept) when cancellation was requested."""
        ...

    async def reply_message(self, command: ReplyMessage) -> bool:
        """The reply and the replying step's record in one transaction (after what is held
        back); False, nothing written, when the message has a reply already."""

    async def publish_value(self, command: PublishValue) -> None:
        """The published value (its search text too) and the step's record, in one
        transaction (after what is held back)."""

    async def write_stream(self, command: WriteStream) -> StreamEntry:
        """The entry written: with the step's record in one transaction (after what is
        held back) from workflow code; from an activity on its own commit, at once, never
        waiting for held-back writes. Raises ``StreamClosedError``, ``StreamFullError``,
        ``LeaseLostError`` (nothing written)."""
        ...

    async def close_stream(self, command: CloseStream) -> None:
        """Close the stream: as ``write_stream`` writes, with the record or at once."""
        ...

    async def continue_as_new(self, command: ContinueAsNew) -> int | None:
        """End this run and make the next (``ContinueAsNew``), in one transaction; the new
        run's number, or None (nothing written, lease kept) when cancellation was requested."""
        ...
