"""Durable streams in the replay engine: ``write_stream`` and ``close_stream`` as a
``WorkflowRun`` runs them (kenning/streams.py's SDK functions).

From workflow code a write is a step (``write_stream:<n>``, named ``write_stream:<key>``,
kind ``StreamWritten``, its payload the entry's offset) whose record and entry commit
together: replay returns the recorded offset and writes nothing. From an activity or a
compensation the entry commits at once, on its own (readers see it while the attempt
runs), and carries the attempt (``kenning.context.current_attempt``): a retry writes
again, under a higher attempt number, which is how a reader tells the two apart.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kenning import codecs, serialization
from kenning.context import current_attempt, current_step
from kenning.core.limits import MAX_STREAM_ENTRY_CHARS
from kenning.core.names import ACTIVITY_FAILED, STREAM_CLOSED, STREAM_WRITTEN
from kenning.core.streams import check_stream_key
from kenning.engine.commands import CloseStream, RecordStep, WriteStream
from kenning.engine.history import StepRecord
from kenning.errors import StreamClosedError, StreamFullError, UnstorableValueError
from kenning.objects import Reference, payloads

if TYPE_CHECKING:
    from kenning.engine.run import WorkflowRun

WRITE_STREAM_STEP = "write_stream"
CLOSE_STREAM_STEP = "close_stream"


def storable_entry(key: str, value: Any) -> Any:
    """The value as JSON, checked storable and at most ``MAX_STREAM_ENTRY_CHARS`` of JSON."""
    stored = serialization.storable_json(value, f"stream {key!r} entry")
    if Reference.of(stored) is not None:  # a large entry left its row for the object store
        return stored
    size = len(json.dumps(codecs.unseal(stored)))  # the bound is on the plain entry, not its envelope
    if size > MAX_STREAM_ENTRY_CHARS:
        raise UnstorableValueError(payloads.too_large(f"stream {key!r} entry", size, MAX_STREAM_ENTRY_CHARS))
    return stored


async def write_stream(run: WorkflowRun, key: str, value: Any, publish: bool) -> int:
    """The entry's offset (see the module's docstring)."""
    check_stream_key(key)
    if current_step.get() is not None:
        attempt = current_attempt.get()
        stored = storable_entry(key, value)
        command = WriteStream(
            key,
            stored,
            None,
            step_id=None if attempt is None else attempt.step_id,
            attempt=1 if attempt is None else attempt.number,
            publish=publish,
        )
        entry = await run.port.write_stream(command)
        run.log.debug("stream.written", key=key, offset=entry.offset, attempt=entry.attempt)
        return entry.offset
    step_name = f"{WRITE_STREAM_STEP}:{key}"
    step_id = run.cursor.next_step_id(WRITE_STREAM_STEP)
    recorded = run.cursor.take(step_id, step_name)
    if recorded is not None:
        if recorded.kind == ACTIVITY_FAILED:
            raise serialization.decode_error(recorded.payload)
        return int(recorded.payload["offset"])
    stored = storable_entry(key, value)
    # the step recorded just before commits with the entry (the port folds it in): an
    # agent's model response and the tool-call event after it are one commit, not two
    await run.before_new_step(step_id, step_name, flush=False)
    record = StepRecord(step_id, STREAM_WRITTEN, step_name, {"key": key})
    try:
        entry = await run.folded(run.port.write_stream(WriteStream(key, stored, record, publish=publish)))
    except (StreamClosedError, StreamFullError) as refused:
        # recorded as the step's failure, raised again on replay: the code after it may
        # write on, and its steps keep their numbers
        failed = StepRecord(step_id, ACTIVITY_FAILED, step_name, serialization.encode_error(refused))
        await run.port.record_step(RecordStep(failed, defer=False, what=f"step {step_id}"))
        raise
    run.log.debug("stream.written", step=step_id, key=key, offset=entry.offset)
    return entry.offset


async def close_stream(run: WorkflowRun, key: str) -> None:
    """Close the stream: a step from workflow code, at once from an activity."""
    check_stream_key(key)
    if current_step.get() is not None:
        await run.port.close_stream(CloseStream(key, None))
        return
    step_name = f"{CLOSE_STREAM_STEP}:{key}"
    step_id = run.cursor.next_step_id(CLOSE_STREAM_STEP)
    if run.cursor.take(step_id, step_name) is not None:
        return
    await run.before_new_step(step_id, step_name, flush=False)  # folded in, as a write's
    await run.folded(
        run.port.close_stream(CloseStream(key, StepRecord(step_id, STREAM_CLOSED, step_name, {"key": key})))
    )
    run.log.debug("stream.closed", step=step_id, key=key)
