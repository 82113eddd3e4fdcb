"""Why a message was not delivered, and the error a sender sees: one answer for a
workflow's ``send_message`` (the engine) and ``Client.send_message`` alike."""

from __future__ import annotations

import enum

from kenning.errors import MessageUndeliverableError, WorkflowNotFoundError


class Undelivered(enum.Enum):
    UNKNOWN_INSTANCE = "unknown_instance"
    FINISHED = "finished"


def refusal(undelivered: Undelivered, instance_id: str, topic: str, status: str | None) -> Exception:
    """The error of a send the recipient's state refused (the client raises it too)."""
    if undelivered is Undelivered.UNKNOWN_INSTANCE:
        return WorkflowNotFoundError(f"no workflow instance {instance_id!r} to send message {topic!r} to")
    return MessageUndeliverableError(
        f"workflow instance {instance_id!r} has ended ({status}): nothing would receive message {topic!r}"
    )
