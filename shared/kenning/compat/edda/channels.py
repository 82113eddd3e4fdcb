"""Edda 0.16's channels (``edda.channels``) on Kenning's messages, where the meaning is the same.

- ``send_to(ctx, instance_id, data, channel)`` is ``send_message(ctx, instance_id, channel,
  data)``: the message goes into the instance's ``channel`` mailbox, where ``receive(ctx,
  channel)`` takes it. Edda answered whether a workflow was waiting at that moment; Kenning
  keeps the message until the instance receives it, so the answer is whether it was
  accepted: ``False`` when the instance does not exist or has ended (the refusal is recorded
  with the step and answered again on replay).
- ``subscribe(ctx, channel, mode)``: ``"broadcast"`` is Kenning's ``subscribe`` (a copy of
  every later ``publish`` into this instance's ``channel`` mailbox); ``"direct"`` needs no
  subscription (``send_to`` writes to the instance's own mailbox) and records nothing;
  ``"competing"`` (one copy taken by one of several subscribers) is not built in Kenning and
  is refused in one line.
- ``receive(ctx, channel=..., timeout_seconds=..., message_id=...)`` is ``receive``; the
  message also has Edda's ``channel`` and ``metadata`` (``source_instance_id``, ``sent_at``),
  and a timeout raises an error that is both Kenning's ``EventTimeoutError`` and the
  ``TimeoutError`` Edda raised.
- ``publish(ctx, channel, data)`` is ``publish``: it answers the number of subscribers it
  reached, where Edda answered a message id.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from kenning import messages
from kenning.context import WorkflowContext
from kenning.errors import EventTimeoutError, MessageUndeliverableError, WorkflowNotFoundError

DIRECT_CHANNEL = "__direct__"  # Edda's send_to default channel
MODES = ("broadcast", "direct", "competing")


class ReceiveTimeoutError(EventTimeoutError, TimeoutError):
    """No message in time: Kenning's error, caught as Edda's ``TimeoutError`` too."""


@dataclass(frozen=True)
class ChannelMessage(messages.ReceivedMessage):
    """Kenning's received message under Edda's name, with Edda's ``channel`` and ``metadata``."""

    @property
    def channel(self) -> str:
        return self.topic

    @property
    def metadata(self) -> dict[str, Any]:
        return {"source_instance_id": self.sender, "sent_at": self.sent_at}


async def subscribe(ctx: WorkflowContext, channel: str, mode: str = "broadcast") -> None:
    if mode not in MODES:
        raise ValueError(f"subscribe mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "competing":
        raise NotImplementedError(
            f"subscribe(..., {channel!r}, mode='competing'): competing consumers are not built in Kenning; "
            "a job queue is a workflow per job under a kenning.Queue (docs/migrating-from-edda.md)"
        )
    if mode == "broadcast":
        await messages.subscribe(ctx, channel)


async def receive(
    ctx: WorkflowContext, channel: str, timeout_seconds: float | None = None, message_id: str | None = None
) -> ChannelMessage:
    try:
        taken = await messages.receive(ctx, channel, timeout_seconds=timeout_seconds, receive_id=message_id)
    except EventTimeoutError as error:
        raise ReceiveTimeoutError(str(error)) from None
    return ChannelMessage(**{f.name: getattr(taken, f.name) for f in fields(taken)})


async def publish(ctx: WorkflowContext, channel: str, data: Any = None, metadata: dict[str, Any] | None = None) -> int:
    if metadata:
        raise ValueError("publish(metadata=...): Kenning's messages carry their sender and time, no metadata")
    return await messages.publish(ctx, channel, data)


async def send_to(
    ctx: WorkflowContext,
    instance_id: str,
    data: Any = None,
    channel: str = DIRECT_CHANNEL,
    metadata: dict[str, Any] | None = None,
) -> bool:
    if metadata:
        raise ValueError("send_to(metadata=...): Kenning's messages carry their sender and time, no metadata")
    try:
        await messages.send_message(ctx, instance_id, channel, data)
    except (WorkflowNotFoundError, MessageUndeliverableError):
        return False
    return True
