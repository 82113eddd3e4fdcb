"""Why a message was not delivered, and the error a sender sees: one answer for a
workflow's ``send_message`` (the engine) and ``Client.send_message`` alike."""

from __future__ import annotations

import enum
from typing import Any, Protocol

from kenning.errors import (
    MessageUndeliverableError,
    RequestNotAnsweredError,
    RequestRejectedError,
    RequestTimeoutError,
    WorkflowNotFoundError,
)


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


def request_refusal(
    undelivered: Undelivered, instance_id: str, topic: str, request_id: str, status: str | None
) -> Exception:
    """The error of a request the recipient's state refused (``Client.request``)."""
    request = f"request {topic!r} ({request_id})"
    if undelivered is Undelivered.UNKNOWN_INSTANCE:
        return WorkflowNotFoundError(f"no workflow instance {instance_id!r} to send {request} to")
    return MessageUndeliverableError(
        f"workflow instance {instance_id!r} has ended ({status}): nothing would answer {request}"
    )


class RequestRead(Protocol):
    """One read of a request's instance and its reply (``kenning.storage.replies.RequestState``)."""

    @property
    def status(self) -> str: ...
    @property
    def replied(self) -> bool: ...
    @property
    def value(self) -> Any: ...
    @property
    def error(self) -> str | None: ...


def request_answer(instance_id: str, topic: str, request_id: str, read: RequestRead, *, timeout: float | None) -> Any:
    """The reply's value, as ``Client.request`` returns it, from one read of the instance's
    status and its reply; else the error that says why there is none."""
    status, replied, value, error = read.status, read.replied, read.value, read.error
    about = f"request {topic!r} ({request_id}) to instance {instance_id}"
    if replied and error is not None:
        raise RequestRejectedError(f"{about} was refused: {error}", instance_id, topic, request_id, error)
    if replied:
        return value
    if status in ("completed", "failed", "cancelled"):
        raise RequestNotAnsweredError(
            f"{about} was not answered: the instance ended {status}", instance_id, topic, request_id, status
        )
    raise RequestTimeoutError(
        f"{about} got no reply within {timeout} s (the instance is {status}; the request stays in its mailbox)",
        instance_id,
        topic,
        request_id,
    )
