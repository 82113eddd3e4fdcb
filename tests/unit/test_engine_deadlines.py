"""Workflow timeouts in the engine, on the in-memory port (issue 29, item 2): a cancel
seen after the instance's deadline compensates it as a cancel does, then ends it
``failed`` with ``WorkflowTimeoutError``; before the deadline a cancel is a cancel. No database.

Before the feature a cancellation always ended the instance ``cancelled``, and
``WorkflowTimeoutError`` and ``@workflow(timeout=...)`` did not exist.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from kenning import (
    App,
    ConfigurationError,
    WorkflowContext,
    WorkflowTimeoutError,
    activity,
    compensation,
    on_failure,
    workflow,
)
from kenning.engine.outcomes import RunOutcome
from kenning.starting import prepare_start
from kenning.testing.memoryport import run_once
from kenning.testing.memorystate import MemoryInstance
from tests.logguard import expect_log

app = App()
UNDONE: list[str] = []


@compensation
async def undo(ctx: WorkflowContext, item: str) -> None:
    UNDONE.append(item)


@activity
@on_failure(undo)
async def book(ctx: WorkflowContext, item: str) -> str:
    return item


@workflow(timeout=timedelta(hours=1))
async def bounded(ctx: WorkflowContext) -> str:
    await book(ctx, "a")
    await book(ctx, "b")
    return "done"


def _instance(deadline_at: float | None) -> MemoryInstance:
    # booked "a", and the scheduler's cancel arrives before "b"
    instance = MemoryInstance(id="bounded-1", workflow_name="bounded", input={}, deadline_at=deadline_at)
    instance.cancel_requested = True
    return instance


async def test_a_cancel_past_the_deadline_fails_the_instance_after_compensating() -> None:
    expect_log("instance.timed_out")
    UNDONE.clear()
    instance = _instance(deadline_at=time.time() - 1)
    instance.append("book:1", "ActivityCompleted", "book", {"result": "a"}, None)
    assert await run_once(app, instance) is RunOutcome.FAILED
    assert instance.status == "failed"
    assert instance.error is not None and instance.error["type"] == "kenning.errors.WorkflowTimeoutError"
    assert UNDONE == ["a"]


async def test_a_cancel_before_the_deadline_is_a_cancel() -> None:
    UNDONE.clear()
    instance = _instance(deadline_at=time.time() + 3600)
    instance.append("book:1", "ActivityCompleted", "book", {"result": "a"}, None)
    assert await run_once(app, instance) is RunOutcome.CANCELLED
    assert instance.status == "cancelled"
    assert UNDONE == ["a"]


def test_the_timeout_is_declared_checked_and_overridden_per_start() -> None:
    assert bounded.timeout == 3600.0
    assert prepare_start(bounded, {}).instance.timeout_seconds == 3600.0
    assert prepare_start(bounded, {}, timeout=5).instance.timeout_seconds == 5
    with pytest.raises(ConfigurationError, match="timeout must be a positive number of seconds"):
        workflow(timeout=0)(bounded.func)
    assert issubclass(WorkflowTimeoutError, Exception)


def test_a_start_overrides_the_timeout_with_options() -> None:
    assert bounded.options(timeout=timedelta(seconds=30)).start_options.timeout == 30.0
