"""Activity heartbeats on the in-memory port (issue 29, item 5): the details an attempt
heartbeats reach the next attempt, the entry they live in is cleared with the step's
record, a silent attempt fails by its heartbeat timeout, and bad use says so. No database.

Before the feature, ``@activity(heartbeat_timeout=...)`` raised ``TypeError`` at import
and ``ctx.heartbeat`` did not exist: every test here failed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from kenning import (
    App,
    ConfigurationError,
    HeartbeatTimeoutError,
    RetryExhaustedError,
    RetryPolicy,
    UnstorableValueError,
    WorkflowContext,
    activity,
    workflow,
)
from kenning.engine.outcomes import RunOutcome
from kenning.testing.memoryport import run_once
from kenning.testing.memorystate import MemoryInstance
from tests.logguard import expect_log

app = App()
RETRY = RetryPolicy(initial_interval=0.0, max_attempts=3, max_duration=None)
SEEN: list[Any] = []


@activity(retry_policy=RETRY, heartbeat_timeout=0.2)
async def counts(ctx: WorkflowContext, fail_first: int) -> int:
    SEEN.append(ctx.heartbeat_details)
    start = ctx.heartbeat_details or 0
    for n in range(start, 5):
        ctx.heartbeat(n + 1)
        if ctx.heartbeat_details is None and n + 1 == fail_first:
            raise RuntimeError("fails after a checkpoint")
        if ctx.heartbeat_details is None and n + 1 == -fail_first:
            await asyncio.Event().wait()  # stops heartbeating
    return start


@activity(retry_policy=RetryPolicy(max_attempts=1), heartbeat_timeout=0.2)
async def silent(ctx: WorkflowContext) -> None:
    await asyncio.Event().wait()


@activity(retry_policy=RETRY)
async def unstorable(ctx: WorkflowContext) -> None:
    ctx.heartbeat({"nan": float("nan")})


@workflow
async def heartbeating(ctx: WorkflowContext, fail_first: int = 0) -> int:
    return await counts(ctx, fail_first)


@workflow
async def never_beats(ctx: WorkflowContext) -> str:
    try:
        await silent(ctx)
    except RetryExhaustedError as error:
        return type(error.__cause__).__name__
    return "no timeout"


@workflow
async def beats_nan(ctx: WorkflowContext) -> str:
    try:
        await unstorable(ctx)
    except UnstorableValueError as error:
        return str(error)
    return "stored"


@pytest.fixture(autouse=True)
def fresh() -> None:
    SEEN.clear()


def instance(name: str, **input: Any) -> MemoryInstance:
    return MemoryInstance(id=f"{name}-1", workflow_name=name, input=input)


async def test_a_retry_resumes_from_the_last_details_and_the_record_clears_them() -> None:
    done = instance("heartbeating", fail_first=2)
    assert await run_once(app, done) is RunOutcome.COMPLETED
    assert SEEN == [None, 2]  # the second attempt read the first's last heartbeat
    assert done.result == {"result": 2}
    assert done.attempts == {}


async def test_details_left_by_a_run_that_died_reach_the_next_run() -> None:
    crashed = instance("heartbeating")
    crashed.attempts = {"counts:1": {"heartbeat_details": 3}}  # what a killed worker's writes left
    assert await run_once(app, crashed) is RunOutcome.COMPLETED
    assert SEEN == [3]
    assert crashed.result == {"result": 3}
    assert crashed.attempts == {}  # no failure was counted, yet the entry is cleared


async def test_an_attempt_without_heartbeats_fails_by_its_heartbeat_timeout() -> None:
    expect_log("activity.heartbeat_timed_out")
    began = time.monotonic()
    stuck = instance("heartbeating", fail_first=-1)
    assert await run_once(app, stuck) is RunOutcome.COMPLETED
    assert SEEN == [None, 1]
    assert time.monotonic() - began < 2
    silent_one = instance("never_beats")
    assert await run_once(app, silent_one) is RunOutcome.COMPLETED
    assert silent_one.result == {"result": HeartbeatTimeoutError.__name__}


async def test_details_that_cannot_be_stored_are_the_activitys_error() -> None:
    bad = instance("beats_nan")
    assert await run_once(app, bad) is RunOutcome.COMPLETED
    assert "heartbeat details cannot be stored" in str((bad.result or {})["result"])


def test_heartbeat_outside_an_activity_says_where_it_belongs() -> None:
    ctx = WorkflowContext(runtime=None)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=r"ctx\.heartbeat is only available inside an activity"):
        ctx.heartbeat(1)
    with pytest.raises(RuntimeError, match=r"ctx\.heartbeat_details is only available inside an activity"):
        _ = ctx.heartbeat_details


def test_the_heartbeat_timeout_is_checked_where_it_is_declared() -> None:
    async def slow(ctx: WorkflowContext) -> None: ...

    assert activity(heartbeat_timeout=2)(slow).heartbeat_timeout == 2.0
    assert activity(slow).heartbeat_timeout is None
    with pytest.raises(ConfigurationError, match="heartbeat: timeout must be a positive number"):
        activity(heartbeat_timeout=0)(slow)


async def test_in_the_testing_environment_a_retry_resumes_from_the_details() -> None:
    from kenning.testing import WorkflowEnvironment

    async with WorkflowEnvironment() as env:
        handle = await env.start(heartbeating, fail_first=3)
        assert await handle.result() == 3
    assert SEEN == [None, 3]
