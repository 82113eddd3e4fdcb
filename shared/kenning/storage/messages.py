"""SQL for messages: an instance's mailboxes, ``send_message`` and ``receive``.

A mailbox is the unconsumed ``kenning_messages`` rows of one (instance, topic), in ``seq``
order. Everyone who touches a mailbox (a sender, its receiver) first takes the mailbox's
advisory lock for the rest of the transaction (``mailbox_lock``), in a statement of its
own, and only then reads or writes it in the next statement. Two things follow
(docs/architecture.md, "Messages"):

- **No lost wake-up.** The receiver's statement either takes a message or registers its
  wait; the sender's either finds that wait (deletes it and makes the instance runnable,
  one transaction with the insert: docs/architecture.md invariant 3) or the receiver has
  not looked yet and will find the message. The lock makes the second statement of each see what the other committed: a
  snapshot taken inside one statement would not.
- **In order.** A mailbox's senders take turns, so ``seq`` order is commit order: a
  receiver never takes a message while an older one is still uncommitted.

Consumption is fenced by the receiver's lease and recorded (``MessageReceived``) in the
statement that marks the message consumed: replay returns that record, never the mailbox.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning import codecs
from kenning.core.names import CHANNEL_INSTANCES, CHANNEL_TIMERS, MESSAGE_RECEIVED, MESSAGE_TIMEOUT
from kenning.core.records import FoldedWrites, HistoryRecord, SuspendOutcome
from kenning.db import Executor, statement
from kenning.storage.fencing import LEASE_FENCE, PENDING_STEP, SAVE_COMPENSATIONS, suspend_as
from kenning.storage.names import notify
from kenning.storage.timers import FiredWait, fire_due_statement, fired_waits

# The advisory locks' key space (two int4 keys: apart from the results listeners' int8 ones)
_MAILBOX_LOCKS = 0x4B4D5347  # "KMSG"

_MAILBOX_LOCK = statement(f"SELECT pg_advisory_xact_lock({_MAILBOX_LOCKS}, hashtext(:id)) IS NULL AS locked")


async def mailbox_lock(conn: Executor, instance_id: str) -> None:
    """Take the lock of ``instance_id``'s mailboxes until the transaction ends; the
    statement that reads or writes them must come after, in the same transaction."""
    await conn.execute(_MAILBOX_LOCK, {"id": instance_id})


# ------------------------------------------------------------------ sending


class SendStatus(enum.Enum):
    SENT = "sent"  # the message is in the mailbox now
    DUPLICATE = "duplicate"  # a message with this id was sent to this instance before: kept as it was
    UNKNOWN_INSTANCE = "unknown_instance"
    FINISHED = "finished"  # the instance ended: nothing would ever receive it


@dataclass(frozen=True)
class SendOutcome:
    status: SendStatus
    seq: int | None  # the message's place (SENT, DUPLICATE)
    woke: bool  # the recipient waited for this topic and is runnable now
    recipient_status: str | None


def _wake_receivers(topic: str) -> str:
    """The CTEs ``unwaited`` and ``woken``, after a CTE ``waiter`` that locked the rows of
    the recipients waiting for a message: those waiting for ``topic`` (a parameter) stop
    waiting, this message is what they wait for, and are runnable again."""
    return f"""unwaited AS (
        DELETE FROM kenning_message_waits AS w
        USING waiter
        WHERE w.instance_id = waiter.id AND w.topic = {topic}
        RETURNING w.instance_id
    ), woken AS (
        UPDATE kenning_instances AS i
        SET status = 'pending', available_at = now(), updated_at = now()
        WHERE i.id IN (SELECT instance_id FROM unwaited) AND i.status = 'waiting_for_message'
        RETURNING i.id
    )"""


_MESSAGE_SEND = statement(
    f"""
    WITH target AS (
        SELECT id, status FROM kenning_instances WHERE id = :instance_id
    ), existing AS (
        SELECT seq FROM kenning_messages WHERE instance_id = :instance_id AND message_id = :message_id
    ), inserted AS (
        INSERT INTO kenning_messages (instance_id, topic, message_id, data, sender_instance_id)
        SELECT target.id, :topic, :message_id, CAST(:data AS jsonb), :sender
        FROM target
        WHERE target.status NOT IN ('completed', 'failed', 'cancelled') AND NOT EXISTS (SELECT FROM existing)
        ON CONFLICT (instance_id, message_id) DO NOTHING
        RETURNING seq
    ), waiter AS (
        -- a receiver waiting is not running: locking its row waits for no step of its own.
        -- The row before the wait, as a cancel locks them (no deadlock between the two).
        SELECT i.id FROM kenning_instances AS i
        WHERE i.id = :instance_id AND i.status = 'waiting_for_message' AND EXISTS (SELECT FROM inserted)
        FOR NO KEY UPDATE
    ), {_wake_receivers(":topic")}
    SELECT (SELECT status FROM target) AS recipient_status,
           (SELECT seq FROM inserted) AS seq,
           (SELECT seq FROM existing) AS existing_seq,
           (SELECT {notify(CHANNEL_INSTANCES)} FROM woken) AS woke
    """
)


async def message_send(
    conn: Executor,
    *,
    instance_id: str,
    topic: str,
    message_id: str,
    data: Any,
    sender_instance_id: str | None,
) -> SendOutcome:
    """Put a message into ``instance_id``'s ``topic`` mailbox, waking the instance if it
    waits for that topic; call ``mailbox_lock`` first in the same transaction. ``data`` is
    JSON already (``serialization.to_json``). A ``message_id`` sent to this instance before
    is not sent again (``DUPLICATE``, also once the instance ended)."""
    row = (
        await conn.execute(
            _MESSAGE_SEND,
            {
                "instance_id": instance_id,
                "topic": topic,
                "message_id": message_id,
                "data": json.dumps(data),
                "sender": sender_instance_id,
            },
        )
    ).one()
    if row.existing_seq is not None:
        status = SendStatus.DUPLICATE
    elif row.recipient_status is None:
        status = SendStatus.UNKNOWN_INSTANCE
    elif row.seq is None:
        status = SendStatus.FINISHED
    else:
        status = SendStatus.SENT
    return SendOutcome(
        status=status,
        seq=row.seq if row.seq is not None else row.existing_seq,
        woke=row.woke is not None,
        recipient_status=row.recipient_status,
    )


# ------------------------------------------------------------------ broadcast
#
# publish puts a copy of a message into the mailbox of every instance subscribed to the
# channel (topic = channel). It takes the subscribers' mailbox locks first, in one statement
# and in one order for every publisher (hash, then id: no two publishers deadlock), and
# then writes exactly the mailboxes it locked: an instance that subscribes meanwhile gets
# the next publish, never a copy written without its lock.

_CHANNEL_SUBSCRIBE = statement(
    """
    INSERT INTO kenning_channel_subscriptions (channel, instance_id) VALUES (:channel, :instance_id)
    ON CONFLICT DO NOTHING
    """
)


async def channel_subscribe(conn: Executor, *, channel: str, instance_id: str) -> None:
    """Subscribe ``instance_id`` to ``channel`` (again: no-op); in the caller's transaction."""
    await conn.execute(_CHANNEL_SUBSCRIBE, {"channel": channel, "instance_id": instance_id})


_CHANNEL_LOCK_SUBSCRIBERS = statement(
    f"""
    SELECT s.instance_id, pg_advisory_xact_lock({_MAILBOX_LOCKS}, hashtext(s.instance_id)) IS NULL AS locked
    FROM kenning_channel_subscriptions AS s
    WHERE s.channel = :channel
    ORDER BY hashtext(s.instance_id), s.instance_id
    """
)


async def channel_lock_subscribers(conn: Executor, channel: str) -> list[str]:
    """Take the mailbox lock of every subscriber of ``channel`` (the lock is volatile, so it
    is taken row by row in the sorted order) and return their ids."""
    return [row.instance_id for row in await conn.execute(_CHANNEL_LOCK_SUBSCRIBERS, {"channel": channel})]


_CHANNEL_PUBLISH = statement(
    f"""
    WITH inserted AS (
        INSERT INTO kenning_messages (instance_id, topic, message_id, data, sender_instance_id)
        SELECT i.id, :channel, :message_id, CAST(:data AS jsonb), :sender
        FROM kenning_instances AS i
        WHERE i.id = ANY(CAST(:recipients AS text[])) AND i.status NOT IN ('completed', 'failed', 'cancelled')
        ON CONFLICT (instance_id, message_id) DO NOTHING
        RETURNING instance_id
    ), waiter AS (
        SELECT i.id FROM kenning_instances AS i
        WHERE i.id IN (SELECT instance_id FROM inserted) AND i.status = 'waiting_for_message'
        ORDER BY i.id
        FOR NO KEY UPDATE
    ), {_wake_receivers(":channel")}
    SELECT (SELECT count(*) FROM inserted) AS delivered,
           (SELECT {notify(CHANNEL_INSTANCES)} FROM woken LIMIT 1) AS woke
    """
)


async def channel_publish(
    conn: Executor, *, channel: str, recipients: list[str], message_id: str, data: Any, sender_instance_id: str | None
) -> int:
    """Put the message into the ``channel`` mailbox of each of ``recipients`` (locked by
    ``channel_lock_subscribers`` in this transaction) that has not ended, waking those
    waiting for it; how many got it (a copy sent before with this id is not sent again)."""
    row = (
        await conn.execute(
            _CHANNEL_PUBLISH,
            {
                "channel": channel,
                "recipients": recipients,
                "message_id": message_id,
                "data": json.dumps(data),
                "sender": sender_instance_id,
            },
        )
    ).one()
    return int(row.delivered)


# ------------------------------------------------------------------ receiving

_MESSAGE_RECEIVE_OR_WAIT = statement(
    f"""
    WITH {LEASE_FENCE}, {PENDING_STEP}, {SAVE_COMPENSATIONS}, taken AS (
        SELECT m.seq FROM kenning_messages AS m, fence
        WHERE m.instance_id = fence.id AND m.topic = :topic AND m.consumed_step_id IS NULL
          AND NOT fence.cancel_requested
        ORDER BY m.seq
        LIMIT 1
    ), consumed AS (
        UPDATE kenning_messages AS m SET consumed_step_id = :step_id, consumed_at = now()
        FROM taken
        WHERE m.seq = taken.seq
        RETURNING m.seq, m.message_id, m.topic, m.data, m.sender_instance_id, m.sent_at
    ), recorded AS (
        INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload)
        SELECT fence.id, :step_id, '{MESSAGE_RECEIVED}', :step_name,
               jsonb_build_object('seq', c.seq, 'message_id', c.message_id, 'topic', c.topic, 'data', c.data,
                                  'sender', c.sender_instance_id, 'sent_at', c.sent_at)
        FROM fence, consumed AS c
        RETURNING payload
    ), {suspend_as("waiting_for_message", unless="taken")}, registered AS (
        -- nothing to take: wait for the mailbox (the lease was released)
        INSERT INTO kenning_message_waits (instance_id, step_id, step_name, topic, timeout_at)
        SELECT id, :step_id, :step_name, :topic, now() + make_interval(secs => CAST(:timeout_seconds AS float8))
        FROM suspended
        -- a wait left by a repair or a cancel of this step: the new one replaces it
        ON CONFLICT (instance_id, step_id) DO UPDATE
        SET step_name = EXCLUDED.step_name, topic = EXCLUDED.topic, timeout_at = EXCLUDED.timeout_at,
            created_at = now()
        RETURNING timeout_at
    )
    SELECT fence.cancel_requested,
           (SELECT payload FROM recorded) AS payload,
           EXISTS (SELECT FROM suspended) AS suspended,
           (SELECT {notify(CHANNEL_TIMERS)} FROM registered WHERE timeout_at IS NOT NULL) AS notified_timers
    FROM fence
    """
)


async def message_receive_or_wait(
    conn: Executor,
    *,
    instance_id: str,
    token: str,
    step_id: str,
    step_name: str,
    topic: str,
    timeout_seconds: float | None,
    folded: FoldedWrites | None = None,
) -> HistoryRecord | SuspendOutcome:
    """In one fenced statement (after ``mailbox_lock``, same transaction): take the oldest
    message of the ``topic`` mailbox and record it at ``step_id`` (its ``MessageReceived``
    record is returned); or, with none there, register the wait (timing out after
    ``timeout_seconds`` on the database clock) and release the lease (``SUSPENDED``).
    ``CANCELLED``: cancellation was requested, nothing taken or registered, lease kept."""
    row = (
        await conn.execute(
            _MESSAGE_RECEIVE_OR_WAIT,
            {
                "id": instance_id,
                "token": token,
                "step_id": step_id,
                "step_name": step_name,
                "topic": topic,
                "timeout_seconds": timeout_seconds,
                **(folded or FoldedWrites()).params(),
            },
        )
    ).first()
    if row is None:
        return SuspendOutcome.LEASE_LOST
    if row.payload is not None:
        return HistoryRecord(step_id, MESSAGE_RECEIVED, step_name, row.payload)
    return SuspendOutcome.SUSPENDED if row.suspended else SuspendOutcome.CANCELLED


# ------------------------------------------------------------------ the scheduler's side

# As wait_event timeouts (kenning.storage.timers): a sender deletes the wait row as this does
_MESSAGE_WAIT_TIMEOUT_FIRE_DUE = fire_due_statement(
    waits="kenning_message_waits",
    due="timeout_at",
    nullable=True,
    status="waiting_for_message",
    kind=MESSAGE_TIMEOUT,
    detail="topic",
)


async def message_wait_timeout_fire_due(conn: Executor, *, limit: int, now: datetime | None = None) -> list[FiredWait]:
    """Time out up to ``limit`` ``receive`` waits whose ``timeout_at`` has passed, oldest
    first: append ``MessageTimeout``, delete the wait, make the instance runnable and wake
    the workers, in one statement."""
    return fired_waits(await conn.execute(_MESSAGE_WAIT_TIMEOUT_FIRE_DUE, {"limit": limit, "now": now}))


# ------------------------------------------------------------------ reading


@dataclass(frozen=True)
class StoredMessage:
    seq: int
    instance_id: str
    topic: str
    message_id: str
    data: Any
    sender_instance_id: str | None
    sent_at: datetime
    consumed_step_id: str | None


_MESSAGES_OF = statement(
    """
    SELECT seq, instance_id, topic, message_id, data, sender_instance_id, sent_at, consumed_step_id
    FROM kenning_messages WHERE instance_id = :id ORDER BY seq
    """
)


async def messages_of(conn: Executor, instance_id: str) -> list[StoredMessage]:
    """Every message sent to ``instance_id``, consumed or not, oldest first."""
    rows = await conn.execute(_MESSAGES_OF, {"id": instance_id})
    return [
        StoredMessage(
            seq=row.seq,
            instance_id=row.instance_id,
            topic=row.topic,
            message_id=row.message_id,
            data=codecs.shown(row.data),
            sender_instance_id=row.sender_instance_id,
            sent_at=row.sent_at,
            consumed_step_id=row.consumed_step_id,
        )
        for row in rows
    ]
