"""Durable streams in the engine, on the in-memory port (issue 34, item 1): a write from
workflow code is a step (``StreamWritten``, its offset recorded) that a replay does not
write again; an activity's writes land at once and carry its attempt, and an attempt
abandoned by a crashed worker and its retry never share a number; a refused write is the
step's recorded failure, raised again on replay; bad input is refused before any write.
No database (tests/integration/test_streams.py and tests/system/test_streams.py run them
through PostgreSQL and real processes).

Before the feature ``write_stream`` and ``close_stream`` did not exist.
"""

from __future__ import annotations

import asyncio

import pytest

from kenning import (
    App,
    RetryPolicy,
    StreamClosedError,
    WorkflowContext,
    activity,
    close_stream,
    wait_event,
    workflow,
    write_stream,
)
from kenning.core.limits import MAX_STREAM_ENTRY_CHARS
from kenning.core.names import ACTIVITY_FAILED, STREAM_CLOSED, STREAM_WRITTEN
from kenning.engine.outcomes import RunOutcome
from kenning.testing.memoryport import run_once
from kenning.testing.memorystate import MemoryInstance
from tests.logguard import expect_log

app = App()
STARTED = asyncio.Event()  # set by the hanging activity once it wrote its first entry
RELEASE: dict[str, asyncio.Event] = {}


@workflow
async def engine_streamer(ctx: WorkflowContext) -> list[int]:
    offsets = [await write_stream(ctx, "log", "a"), await write_stream(ctx, "log", {"b": 2})]
    await close_stream(ctx, "log")
    try:
        await write_stream(ctx, "log", "late")
    except StreamClosedError:
        offsets.append(-1)
    await wait_event(ctx, "go")
    offsets.append(await write_stream(ctx, "other", "c"))
    return offsets


@activity(retry_policy=RetryPolicy(max_attempts=1))
async def hangs_after_one(ctx: WorkflowContext) -> str:
    await write_stream(ctx, "tokens", "first")
    STARTED.set()
    release = RELEASE.get(ctx.instance_id)
    if release is not None:  # the first run: hangs until its worker "dies"
        await release.wait()
    await write_stream(ctx, "tokens", "second")
    return "done"


@workflow
async def engine_crash_streamer(ctx: WorkflowContext) -> str:
    return await hangs_after_one(ctx)


@workflow
async def engine_stream_bad(ctx: WorkflowContext, what: str) -> None:
    if what == "key":
        await write_stream(ctx, "", 1)
    elif what == "big":
        await write_stream(ctx, "log", "x" * MAX_STREAM_ENTRY_CHARS)
    else:
        await write_stream(ctx, "log", "NUL \x00 inside")


async def test_workflow_writes_are_steps_a_replay_does_not_write_again() -> None:
    instance = MemoryInstance(id="s-1", workflow_name="engine_streamer")
    assert await run_once(app, instance) is RunOutcome.SUSPENDED
    log = instance.streams["log"]
    assert [(e.offset, e.attempt, e.step, e.value) for e in log.entries] == [(0, 0, None, "a"), (1, 0, None, {"b": 2})]
    assert log.closed
    steps = [(r.step_id, r.kind, r.step_name) for r in instance.history]
    assert steps == [
        ("write_stream:1", STREAM_WRITTEN, "write_stream:log"),
        ("write_stream:2", STREAM_WRITTEN, "write_stream:log"),
        ("close_stream:1", STREAM_CLOSED, "close_stream:log"),
        ("write_stream:3", ACTIVITY_FAILED, "write_stream:log"),  # the refusal, recorded
    ]
    assert [r.payload.get("offset") for r in instance.history[:2]] == [0, 1]

    writes_before = len(instance.writes)
    instance.deliver_event({"type": "go", "source": "test", "id": "g-1", "data": {}})
    assert await run_once(app, instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": [0, 1, -1, 0]}  # the replayed offsets, the refusal raised again
    assert [w for w in instance.writes[writes_before:] if w.startswith(("write stream", "close stream"))] == [
        "write stream other"
    ]
    assert len(instance.streams["log"].entries) == 2


async def test_an_attempt_abandoned_by_a_crash_and_its_retry_never_share_an_attempt_number() -> None:
    instance = MemoryInstance(id="s-2", workflow_name="engine_crash_streamer")
    RELEASE[instance.id] = asyncio.Event()
    STARTED.clear()
    first = asyncio.create_task(run_once(app, instance))
    await asyncio.wait_for(STARTED.wait(), 5)
    first.cancel()  # the worker died in the middle of the attempt: nothing was counted
    with pytest.raises(asyncio.CancelledError):
        await first
    del RELEASE[instance.id]
    assert instance.attempts == {}
    assert await run_once(app, instance) is RunOutcome.COMPLETED  # another claim, the same engine attempt 1
    entries = [(e.offset, e.attempt, e.step, e.value) for e in instance.streams["tokens"].entries]
    assert entries == [
        (0, 1, "hangs_after_one:1", "first"),
        (1, 2, "hangs_after_one:1", "first"),  # the retry: above the abandoned attempt
        (2, 2, "hangs_after_one:1", "second"),
    ]


@pytest.mark.parametrize(
    ("what", "error"),
    [
        ("key", "a stream's key must be a non-empty str of at most 256 characters"),
        ("big", f"more than {MAX_STREAM_ENTRY_CHARS}"),
        ("nul", "stream 'log' entry cannot be stored"),
    ],
)
async def test_bad_entries_fail_the_workflow_before_any_write(what: str, error: str) -> None:
    expect_log("instance.failed")
    instance = MemoryInstance(id=f"bad-{what}", workflow_name="engine_stream_bad", input={"what": what})
    assert await run_once(app, instance) is RunOutcome.FAILED
    assert instance.error is not None and error in instance.error["message"], instance.error
    assert instance.streams == {} and instance.history == []
