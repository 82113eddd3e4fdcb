"""``send_message`` and ``receive``: messages between workflows, and from clients.

Every instance has a durable mailbox per topic. ``send_message`` (a workflow step) and
``Client.send_message`` put a message into another instance's mailbox; ``receive`` takes
the oldest one, waiting without holding a worker while the mailbox is empty:

- **Nothing lost.** A message sent before the receiver waits stays in the mailbox until a
  ``receive`` of its topic takes it.
- **In order.** A mailbox is taken in the order its messages were committed.
- **Exactly once.** A send is a step: its message and its record commit together, so a
  retried or replayed workflow never sends twice (a client's ``message_id`` makes a
  client's retries safe too). A receive is a step: taking the message and recording it
  commit together, so each message is taken by one receive, once, and replay returns it.

Edda's channel vocabulary where it maps: ``send_message`` is its direct ``send_to``;
``subscribe`` and ``publish`` are its broadcast mode (every subscriber gets its own copy,
in its mailbox of the channel's name, received with ``receive`` as any message). Its
competing consumers across instances (one copy taken by one of several subscribers) are
not built: a job queue is a workflow per job (``kenning.Queue`` limits them).
``receive``'s ``timeout_seconds`` raises ``EventTimeoutError``, as ``wait_event``'s does
(Edda's later ``receive`` raises ``TimeoutError``: in Kenning a ``TimeoutError`` is the
database being away, see ``kenning.db.errors``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kenning import serialization
from kenning.context import WorkflowContext
from kenning.core.names import MESSAGE_TIMEOUT, STATUS_VALUE_KEY
from kenning.core.published import PublishedStatus
from kenning.errors import EventTimeoutError


@dataclass(frozen=True)
class ReceivedMessage:
    """The message a ``receive`` took (Edda's ``ChannelMessage`` fields, where they map)."""

    data: Any
    topic: str
    id: str  # the message id: the sender's (Client.send_message), else the sending step's
    sender: str | None  # the sending instance's id; None: a client
    sent_at: str | None  # ISO 8601, the database clock
    seq: int  # its place among every message sent (a mailbox is taken in seq order)

    async def reply(self, ctx: WorkflowContext, value: Any = None) -> None:
        """Answer this message (a ``Client.request``'s) with ``value`` (JSON, or a pydantic
        model; at most 1 MiB of JSON), as a step of this workflow: the reply and the step
        commit together, so it is stored once and replay stores nothing. The waiting
        client gets it at once. A second reply to the same message raises (and records)
        ``MessageAlreadyRepliedError``; replying to a plain ``send_message`` is allowed
        and harmless (the reply is stored, nobody waits for it)."""
        await ctx.runtime.reply_message(self.id, self.topic, value, None)

    async def reply_error(self, ctx: WorkflowContext, reason: str) -> None:
        """Refuse this request: the client's ``request`` raises ``RequestRejectedError``
        with ``reason``. A step, as ``reply`` is (and it counts as the message's reply)."""
        await ctx.runtime.reply_message(self.id, self.topic, None, str(reason))


async def send_message(
    ctx: WorkflowContext, instance_id: str, topic: str, data: Any = None, *, message_id: str | None = None
) -> str:
    """Send ``data`` (JSON, or a pydantic model) to ``instance_id``'s ``topic`` mailbox, as a
    step of this workflow: the message and the step commit together, so it is sent exactly
    once. Returns the message id (by default one derived from this step). Raises
    ``WorkflowNotFoundError`` when there is no such instance and
    ``MessageUndeliverableError`` when it has ended; either is recorded, and raised again
    on replay."""
    return await ctx.runtime.send_message(instance_id, topic, data, message_id)


async def subscribe(ctx: WorkflowContext, channel: str) -> None:
    """Subscribe this instance to ``channel``'s broadcasts, as a step: every later
    ``publish`` on it puts a copy into this instance's ``channel`` mailbox (take them with
    ``receive(ctx, channel)``). A publish before the subscribe does not reach it."""
    await ctx.runtime.subscribe(channel)


async def publish(ctx: WorkflowContext, channel: str, data: Any = None, *, message_id: str | None = None) -> int:
    """Broadcast ``data`` to every instance subscribed to ``channel`` (that has not ended),
    as a step of this workflow: the copies and the step commit together, so it is
    published once. Returns how many subscribers it reached (the recorded count on replay)."""
    return await ctx.runtime.publish(channel, data, message_id)


async def receive(
    ctx: WorkflowContext,
    topic: str,
    timeout_seconds: float | None = None,
    model: Any = None,
    receive_id: str | None = None,
) -> ReceivedMessage:
    """Take the oldest message of this instance's ``topic`` mailbox, waiting durably (no
    worker held) until one arrives. ``timeout_seconds`` raises ``EventTimeoutError`` here
    if none arrives in time (the workflow may catch it; a message arriving later stays for
    the next ``receive``). ``model`` turns the data into that pydantic model.
    ``receive_id`` is an explicit step id."""
    if timeout_seconds is not None and timeout_seconds < 0:
        raise ValueError(f"receive timeout must not be negative, got {timeout_seconds}")
    record = await ctx.runtime.receive_message(topic, receive_id=receive_id, timeout_seconds=timeout_seconds)
    if record.kind == MESSAGE_TIMEOUT:
        raise EventTimeoutError(f"no message on {topic!r} within {timeout_seconds} s (step {record.step_id})")
    payload = record.payload or {}
    data = payload.get("data")
    if model is not None:
        data = serialization.from_json(data, model)
    sent_at = payload.get("sent_at")
    return ReceivedMessage(
        data=data,
        topic=str(payload.get("topic", topic)),
        id=str(payload["message_id"]),
        sender=payload.get("sender"),
        sent_at=None if sent_at is None else str(sent_at),
        seq=int(payload.get("seq", 0)),
    )


# ---------------------------------------------------------------- published values
# (issue 29) A running workflow publishes durable values clients read without a worker
# (``Client.get_value``), as DBOS's set_event/get_event: each publish is a step, the latest
# value per key wins, and the values outlive the instance's end until its retention.


async def publish_value(ctx: WorkflowContext, key: str, value: Any) -> None:
    """Publish ``value`` (JSON, or a pydantic model; at most 256 KiB of JSON) under ``key``,
    as a step of this workflow: the value and the step commit together, and replay writes
    nothing again. A later publish of the key replaces it. A key the workflow declares in
    ``@workflow(search_attributes=...)`` takes a str, int, float or bool (or None, which
    removes it from the search) and is indexed for ``Client.list(where=...)``."""
    await ctx.runtime.publish_value(key, value)


async def set_status(ctx: WorkflowContext, text: str, progress: float | None = None) -> None:
    """Publish this instance's status, ``{"text": text, "progress": progress}`` under the
    reserved key ``"status"`` (``Client.get_status`` reads it): ``progress`` is a fraction
    in [0, 1] or None."""
    if not isinstance(text, str):
        raise TypeError(f"set_status takes a str text, not {type(text).__name__}")
    if progress is not None:
        if isinstance(progress, bool) or not isinstance(progress, int | float) or not 0.0 <= progress <= 1.0:
            raise ValueError(f"set_status progress must be a number in [0, 1] or None, got {progress!r}")
        progress = float(progress)
    await ctx.runtime.publish_value(STATUS_VALUE_KEY, {"text": text, "progress": progress})


__all__ = [
    "PublishedStatus",
    "ReceivedMessage",
    "publish",
    "publish_value",
    "receive",
    "send_message",
    "set_status",
    "subscribe",
]
