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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kenning import codecs, serialization
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
        model; at most 1 MiB of JSON without an object store), as a step of this workflow: the reply and the step
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
    data = codecs.unseal(payload.get("data"))
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
    """Publish ``value`` (JSON, or a pydantic model; at most 256 KiB of JSON without an
    object store, ``KENNING_OBJECT_STORE``) under ``key``,
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


# ---------------------------------------------------------------- approvals
# (issue 34) ``wait_for_approval``: a person's yes or no, waited for durably (hours or days, across
# restarts), on the requests mechanism a workflow already has.
#
# The workflow publishes what waits for a decision (``Client.get_value(id, "approvals")``,
# the console's values) and takes decisions from its ``approval`` mailbox, each a request a
# person sends and gets an answer to::
#
#     kenning request INSTANCE approval '{"call_id": "c-1", "approved": true}'
#     kenning request INSTANCE approval '{"call_id": "c-1", "approved": false, "reason": "too much"}'
#     # or: await client.request(instance_id, "approval", {"call_id": "c-1", "approved": True})
#
# Every step here is an ordinary recorded one (``publish_value``, ``receive``, ``reply``), so
# a decision is taken once and a replay gets the same one. A decision for a call nothing
# waits on, or one that is not ``{"call_id": str, "approved": bool, "reason"?: str}``, is
# refused (``RequestRejectedError`` for the sender, exit 1 at the CLI) and changes nothing.
# Adapters (``kenning.ai``) ask here, so the next adapter finds approvals in the core.

APPROVAL_TOPIC = "approval"
APPROVALS_VALUE_KEY = "approvals"


@dataclass(frozen=True)
class ApprovalDecision:
    """What a person decided about one call."""

    call_id: str
    approved: bool
    reason: str | None = None


async def wait_for_approval(
    ctx: WorkflowContext, call_id: str, details: Any = None, *, topic: str = APPROVAL_TOPIC
) -> ApprovalDecision:
    """Wait, without holding a worker, until a person approves or denies ``call_id``
    (``details``, any JSON, say what is asked: published for the person to read)."""
    decisions = await wait_for_approvals(ctx, {call_id: details}, topic=topic)
    return decisions[call_id]


async def wait_for_approvals(
    ctx: WorkflowContext, pending: Mapping[str, Any], *, topic: str = APPROVAL_TOPIC
) -> dict[str, ApprovalDecision]:
    """Wait until every call of ``pending`` (call id -> details) is decided, in whatever
    order the decisions come; returns them by call id."""
    waiting = dict(pending)
    decided: dict[str, ApprovalDecision] = {}
    await _publish(ctx, waiting, decided)
    while waiting:
        message = await receive(ctx, topic)
        decision, problem = _parse(message.data, waiting)
        if decision is None:
            await message.reply_error(ctx, problem)
            continue
        del waiting[decision.call_id]
        decided[decision.call_id] = decision
        await message.reply(ctx, {"call_id": decision.call_id, "approved": decision.approved})
        await _publish(ctx, waiting, decided)
    return decided


def _parse(data: Any, waiting: Mapping[str, Any]) -> tuple[ApprovalDecision | None, str]:
    """The decision a message carries, or why it is refused."""
    if not isinstance(data, dict) or not isinstance(data.get("call_id"), str):
        return None, 'an approval is {"call_id": "...", "approved": true|false, "reason": "..."}'
    call_id = data["call_id"]
    if call_id not in waiting:
        open_ids = ", ".join(sorted(waiting)) or "none"
        return None, f"no approval is waiting for call {call_id!r} (waiting: {open_ids})"
    approved, reason = data.get("approved"), data.get("reason")
    if not isinstance(approved, bool):
        return None, f"call {call_id!r}: 'approved' must be true or false, got {approved!r}"
    if reason is not None and not isinstance(reason, str):
        return None, f"call {call_id!r}: 'reason' must be a string"
    return ApprovalDecision(call_id, approved, reason), ""


async def _publish(ctx: WorkflowContext, waiting: Mapping[str, Any], decided: Mapping[str, ApprovalDecision]) -> None:
    """What waits and what was decided, for a person (and a console) to read."""
    await publish_value(
        ctx,
        APPROVALS_VALUE_KEY,
        {
            "pending": [{"call_id": call_id, "details": details} for call_id, details in waiting.items()],
            "resolved": [{"call_id": d.call_id, "approved": d.approved, "reason": d.reason} for d in decided.values()],
        },
    )


__all__ = [
    "APPROVALS_VALUE_KEY",
    "APPROVAL_TOPIC",
    "ApprovalDecision",
    "PublishedStatus",
    "ReceivedMessage",
    "publish",
    "publish_value",
    "receive",
    "send_message",
    "set_status",
    "subscribe",
    "wait_for_approval",
    "wait_for_approvals",
]
