"""Messages in the replay engine: ``send_message`` and ``receive`` as a ``WorkflowRun`` runs
them (its ``Runtime`` methods of those names call these).

Sending is a step (``send_message:<n>``, named ``send_message:<topic>``, kind
``MessageSent``) whose record and the message commit together (``SendMessage``): replay
reads the message id back and sends nothing. A refused send (no such instance, or it
ended) is recorded as the step's failure and raised again on replay. Receiving is a step
(``receive:<n>``, named ``receive:<topic>``) recorded as the ``MessageReceived`` it took,
or ``MessageTimeout``: taken at once when the mailbox holds one, else the instance
suspends until a sender or the scheduler's timeout wakes it and takes it then. The engine
does no I/O here either: it asks the port.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kenning import serialization
from kenning.core.limits import MAX_REPLY_BYTES
from kenning.core.mailbox import refusal
from kenning.core.names import ACTIVITY_FAILED, CHANNEL_SUBSCRIBED, MESSAGE_REPLIED, MESSAGE_SENT
from kenning.core.records import HistoryRecord
from kenning.engine.commands import Publish, ReceiveMessage, RecordStep, ReplyMessage, SendMessage, Subscribe
from kenning.engine.history import StepRecord
from kenning.errors import MessageAlreadyRepliedError
from kenning.objects import payloads

if TYPE_CHECKING:
    from kenning.engine.run import WorkflowRun

SEND_STEP = "send_message"
RECEIVE_STEP = "receive"
SUBSCRIBE_STEP = "subscribe"
PUBLISH_STEP = "publish"
REPLY_STEP = "reply"


async def send_message(run: WorkflowRun, instance_id: str, topic: str, data: Any, message_id: str | None) -> str:
    """The message's id: the recorded one on replay, else the message is sent now."""
    step_name = f"{SEND_STEP}:{topic}"
    step_id = run.cursor.next_step_id(SEND_STEP)
    record = run.cursor.take(step_id, step_name)
    if record is not None:
        if record.kind == ACTIVITY_FAILED:
            raise serialization.decode_error(record.payload)
        return str(record.payload["message_id"])
    await run.before_new_step(step_id, step_name, flush=False)  # the port folds it in
    # by default the id is the sending step's: a send is made once however often it is retried
    message_id = message_id or f"{run.instance_id}:{step_id}"
    with payloads.owned_by(instance_id):  # a large value lives with the receiver's objects
        stored = serialization.storable_json(data, f"message {topic!r} data")
    payload = {"instance_id": instance_id, "topic": topic, "message_id": message_id}
    command = SendMessage(StepRecord(step_id, MESSAGE_SENT, step_name, payload), instance_id, topic, message_id, stored)
    sent = await run.folded(run.port.send_message(command))
    if sent.refused is not None:
        error = refusal(sent.refused, instance_id, topic, sent.recipient_status)
        failed = StepRecord(step_id, ACTIVITY_FAILED, step_name, serialization.encode_error(error))
        await run.port.record_step(RecordStep(failed, defer=False, what=f"step {step_id}"))
        raise error
    run.log.debug("message.sent", step=step_id, to=instance_id, topic=topic, message_id=message_id)
    return message_id


async def subscribe(run: WorkflowRun, channel: str) -> None:
    """Subscribe the instance to ``channel``'s broadcasts (``subscribe:<n>``, kind
    ``ChannelSubscribed``), once: replay subscribes nothing."""
    step_name = f"{SUBSCRIBE_STEP}:{channel}"
    step_id = run.cursor.next_step_id(SUBSCRIBE_STEP)
    if run.cursor.take(step_id, step_name) is not None:
        return
    await run.before_new_step(step_id, step_name, flush=False)  # the port folds it in
    record = StepRecord(step_id, CHANNEL_SUBSCRIBED, step_name, {"channel": channel})
    await run.folded(run.port.subscribe(Subscribe(record, channel)))


async def publish(run: WorkflowRun, channel: str, data: Any, message_id: str | None) -> int:
    """How many subscribers the broadcast reached: the recorded count on replay, else a copy
    of the message goes into each subscriber's ``channel`` mailbox now (``publish:<n>``,
    kind ``MessageSent``, committed with the copies)."""
    step_name = f"{PUBLISH_STEP}:{channel}"
    step_id = run.cursor.next_step_id(PUBLISH_STEP)
    recorded = run.cursor.take(step_id, step_name)
    if recorded is not None:
        return int(recorded.payload["subscribers"])
    await run.before_new_step(step_id, step_name, flush=False)  # the port folds it in
    message_id = message_id or f"{run.instance_id}:{step_id}"
    with payloads.owned_by(None):  # copied into many instances' rows: the sweep deletes it
        stored = serialization.storable_json(data, f"message {channel!r} data")

    payload = {"channel": channel, "message_id": message_id}  # the port adds "subscribers"
    record = StepRecord(step_id, MESSAGE_SENT, step_name, payload)
    reached = await run.folded(run.port.publish(Publish(record, channel, message_id, stored)))
    run.log.debug("message.published", step=step_id, channel=channel, subscribers=reached)
    return reached


async def receive_message(
    run: WorkflowRun, topic: str, *, receive_id: str | None, timeout_seconds: float | None
) -> HistoryRecord:
    """The recorded ``MessageReceived`` or ``MessageTimeout``; else the oldest message of
    the mailbox, taken now, or a suspend until there is one."""
    step_name = f"{RECEIVE_STEP}:{topic}"
    step_id = receive_id or run.cursor.next_step_id(RECEIVE_STEP)
    record = run.cursor.take(step_id, step_name)
    if record is not None:
        return record
    await run.before_new_step(step_id, step_name, flush=False)
    outcome = await run.port.receive_message(ReceiveMessage(step_id, step_name, topic, timeout_seconds))
    if isinstance(outcome, HistoryRecord):
        run.log.debug("message.received", step=step_id, topic=topic)
        return outcome
    run.suspended(outcome, step_id, step_name)


async def reply_message(run: WorkflowRun, message_id: str, topic: str, value: Any, error: str | None) -> None:
    """Reply to the instance's message ``message_id`` (``reply:<n>``, named
    ``reply:<topic>``, kind ``MessageReplied``): the reply row and the record commit
    together, once; replay writes nothing. A second reply to the message is recorded as
    the step's failure (``MessageAlreadyRepliedError``) and raised again on replay."""
    step_name = f"{REPLY_STEP}:{topic}"
    step_id = run.cursor.next_step_id(REPLY_STEP)
    record = run.cursor.take(step_id, step_name)
    if record is not None:
        if record.kind == ACTIVITY_FAILED:
            raise serialization.decode_error(record.payload)
        return
    stored = None if error is not None else serialization.storable_json(value, f"reply to message {message_id!r}")
    size = len(json.dumps(stored if error is None else error).encode())
    if size > MAX_REPLY_BYTES:  # a large value left its row for the object store, when one is set
        raise ValueError(
            payloads.too_large(f"reply to message {message_id!r} ({topic!r})", size, MAX_REPLY_BYTES, unit="bytes")
        )
    await run.before_new_step(step_id, step_name, flush=False)  # the port folds it in
    payload = {"message_id": message_id, "topic": topic, "rejected": error is not None}
    replied = await run.folded(
        run.port.reply_message(
            ReplyMessage(StepRecord(step_id, MESSAGE_REPLIED, step_name, payload), message_id, stored, error)
        )
    )
    if not replied:
        failure = MessageAlreadyRepliedError(
            f"message {message_id!r} ({topic!r}) of instance {run.instance_id} was replied to already: "
            "the first reply stands"
        )
        failed = StepRecord(step_id, ACTIVITY_FAILED, step_name, serialization.encode_error(failure))
        await run.port.record_step(RecordStep(failed, defer=False, what=f"step {step_id}"))
        raise failure
    run.log.debug("message.replied", step=step_id, topic=topic, message_id=message_id)
