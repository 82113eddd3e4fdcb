"""Retry decisions and the saga on the in-memory port: one retry loop for activities and
compensations, attempts counted durably, compensations newest first. No database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kenning.core.names import ACTIVITY_COMPLETED, ACTIVITY_FAILED, COMPENSATION_EXECUTED
from kenning.engine.outcomes import RunOutcome
from kenning.engine.retries import GiveUp, GiveUpReason, RetryAfter, after_counting, before_counting
from kenning.errors import TerminalError
from kenning.retry import RetryPolicy
from kenning.testing.memoryport import run_once, run_until_rest
from tests import engine_support as wf
from tests.logguard import expect_log


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    wf.reset()
    yield
    wf.reset()


def test_retry_decisions() -> None:
    policy = RetryPolicy(initial_interval=1.0, backoff_coefficient=2.0, max_attempts=3, max_duration=10.0)
    assert before_counting(policy, TerminalError("x"), 1) == GiveUp(GiveUpReason.TERMINAL)
    narrow = RetryPolicy(retryable_error_types=(ValueError,))
    assert before_counting(narrow, KeyError("x"), 1) == GiveUp(GiveUpReason.NOT_RETRYABLE)
    assert before_counting(policy, RuntimeError("x"), 3) == GiveUp(GiveUpReason.EXHAUSTED)
    assert before_counting(policy, RuntimeError("x"), 2) is None
    assert after_counting(policy, 2, 10.0, 5.0) == GiveUp(GiveUpReason.EXHAUSTED)
    assert after_counting(policy, 2, 1.0, 5.0) == RetryAfter(delay=2.0, release=False)
    assert after_counting(policy, 2, 1.0, 1.5) == RetryAfter(delay=2.0, release=True)


async def test_inline_retries_count_attempts_and_clear_them_with_the_record() -> None:
    wf.FAILURES["flaky"] = 2
    instance = wf.instance("engine_retries")
    assert await run_once(wf.app, instance) is RunOutcome.COMPLETED
    assert wf.CALLS["flaky"] == 3
    assert [w for w in instance.writes if w.startswith("count")] == [
        "count attempt 1 of flaky:1",
        "count attempt 2 of flaky:1",
    ]
    assert instance.attempts == {}  # cleared by the record


async def test_a_long_back_off_releases_the_instance_and_the_count_survives() -> None:
    wf.FAILURES["flaky"] = 1
    instance = wf.instance("engine_slow_retries")
    assert await run_once(wf.app, instance) is RunOutcome.SUSPENDED
    assert (instance.status, instance.lease_token, instance.available_after) == ("pending", None, 60.0)
    assert instance.attempts["slow_flaky:1"]["attempts"] == 1
    assert await run_once(wf.app, instance) is RunOutcome.COMPLETED
    assert wf.CALLS["slow_flaky"] == 2


async def test_exhausted_retries_record_the_failure_and_undo_the_saga() -> None:
    wf.FAILURES["flaky"] = 5
    instance = wf.instance("engine_retries")
    expect_log("instance.failed")
    assert await run_until_rest(wf.app, instance) == [RunOutcome.FAILED]
    assert wf.CALLS["flaky"] == 3
    assert instance.history[-1].kind == ACTIVITY_FAILED
    assert "after 3 attempts" in instance.history[-1].payload["message"]


async def test_a_terminal_error_is_not_retried() -> None:
    expect_log("instance.failed")
    instance = wf.instance("engine_terminal")
    assert await run_once(wf.app, instance) is RunOutcome.FAILED
    assert wf.CALLS["refuses"] == 1 and instance.writes.count("count attempt 1 of refuses:1") == 0


async def test_compensations_run_newest_first_each_recorded_once() -> None:
    expect_log("instance.failed")
    instance = wf.instance("engine_saga")
    assert await run_once(wf.app, instance) is RunOutcome.FAILED
    assert wf.UNDONE == ["second", "explicit", "first"]
    undone = [r.step_id for r in instance.history if r.kind == COMPENSATION_EXECUTED]
    assert undone == ["compensation:on_failure:book:2", "compensation:comp:2", "compensation:on_failure:book:1"]
    assert [r.kind for r in instance.history][:2] == [ACTIVITY_COMPLETED, ACTIVITY_COMPLETED]
    # a crash after the saga began resumes it: nothing runs twice
    instance.status = "compensating"
    assert await run_once(wf.app, instance) is RunOutcome.FAILED
    assert wf.UNDONE == ["second", "explicit", "first"]


async def test_compensations_are_retried_durably_like_activities() -> None:
    expect_log("instance.failed")
    wf.FAILURES["flaky"] = 2
    instance = wf.instance("engine_saga_flaky")
    assert await run_once(wf.app, instance) is RunOutcome.FAILED
    assert wf.CALLS["undo_flaky:one"] == 3 and wf.UNDONE == ["one"]
    counted = [w for w in instance.writes if w.startswith("count")]
    assert counted == ["count attempt 1 of compensation:comp:1", "count attempt 2 of compensation:comp:1"]
    assert instance.attempts == {}


async def test_a_compensation_that_fails_for_good_leaves_the_saga_failed() -> None:
    expect_log("instance.failed")
    expect_log("compensation.failed")
    wf.FAILURES["flaky"] = 10
    instance = wf.instance("engine_saga_flaky")
    assert await run_once(wf.app, instance) is RunOutcome.FAILED
    assert wf.CALLS["undo_flaky:one"] == 3
    assert instance.error is not None and instance.error["type"].endswith("CompensationFailedError")
    assert instance.attempts == {}  # cleared: `kenning instances retry` starts it afresh
