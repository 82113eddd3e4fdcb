"""The replay engine on the in-memory port: replay, determinism, cancel race. No database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kenning.core.names import ACTIVITY_COMPLETED, TIMER_EXPIRED
from kenning.engine.outcomes import RunOutcome
from kenning.testing.memoryport import run_once, run_until_rest
from tests import engine_support as wf
from tests.logguard import expect_log


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    wf.reset()
    yield
    wf.reset()


async def test_recorded_steps_replay_without_running_again() -> None:
    instance = wf.instance("engine_steps", value=3)
    outcomes = await run_until_rest(wf.app, instance)
    assert outcomes == [RunOutcome.SUSPENDED, RunOutcome.COMPLETED]
    assert (instance.status, instance.result) == ("completed", {"result": 12})
    assert [(r.step_id, r.kind) for r in instance.history] == [
        ("double:1", ACTIVITY_COMPLETED),
        ("wait_timer:1", TIMER_EXPIRED),
        ("double:2", ACTIVITY_COMPLETED),
    ]
    assert wf.CALLS == {"double:3": 1, "double:6": 1}  # double(3) replayed, not run again


async def test_an_event_resumes_the_instance_with_its_data() -> None:
    instance = wf.instance("engine_waits")
    assert await run_until_rest(wf.app, instance) == [RunOutcome.SUSPENDED]
    assert instance.status == "waiting_for_event"
    instance.deliver_event({"type": "paid", "source": "t", "id": "e1", "data": {"amount": 5}})
    assert await run_once(wf.app, instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": {"amount": 5}}
    assert wf.CALLS == {"double:1": 1}


async def test_gather_branches_replay_in_any_order_without_a_verdict() -> None:
    """Nested gathers start their tasks loop turns apart: the replay barrier waits until
    every branch has replayed before any new step, however many turns that takes."""
    instance = wf.instance("engine_gather")
    assert await run_until_rest(wf.app, instance) == [RunOutcome.SUSPENDED, RunOutcome.COMPLETED]
    assert instance.result == {"result": [204, 208, 212]}
    assert sum(wf.CALLS.values()) == 6  # each activity ran once, the second run replayed them all


async def test_a_new_step_waits_for_a_sibling_that_replays_late() -> None:
    """A branch reaching a new step parks while a sibling that is still runnable has not
    replayed its recorded step yet, however many loop turns it takes to get there."""
    instance = wf.instance("engine_slow_branch")
    instance.append("double:1", ACTIVITY_COMPLETED, "double", {"result": 2})
    instance.append("flaky:1", ACTIVITY_COMPLETED, "flaky", {"result": "recorded"})
    assert await run_once(wf.app, instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": [4, "recorded"]}
    assert dict(wf.CALLS) == {"double:2": 1}  # only the new step ran


async def test_a_step_asked_for_under_another_name_is_non_determinism() -> None:
    expect_log("instance.non_deterministic", workflow="engine_changes")
    instance = wf.instance("engine_changes")
    assert await run_once(wf.app, instance) is RunOutcome.SUSPENDED
    instance.fire_timer()
    wf.VARIANT["name"] = "b"
    assert await run_once(wf.app, instance) is RunOutcome.FAILED
    assert instance.status == "failed" and instance.error is not None
    assert instance.error["type"] == "kenning.errors.NonDeterminismError"
    assert "flaky:1" in instance.error["message"] and "double:1" in instance.error["message"]
    assert wf.CALLS["flaky"] == 0  # nothing of the new path ran
    assert [c.comp_id for c in instance.compensations] == []


async def test_a_branch_that_never_reaches_its_recorded_step_is_non_determinism() -> None:
    """One branch now asks for a new step while a sibling's recorded step is never taken:
    the verdict comes once every branch is blocked, and nothing new ran."""
    expect_log("instance.non_deterministic", workflow="engine_branch_diverges")
    instance = wf.instance("engine_branch_diverges")
    assert await run_once(wf.app, instance) is RunOutcome.SUSPENDED
    instance.fire_timer()
    wf.VARIANT["name"] = "b"
    before = dict(wf.CALLS)
    assert await run_once(wf.app, instance) is RunOutcome.FAILED
    assert instance.error is not None and "never reached" in instance.error["message"]
    assert "double:3" in instance.error["message"]  # the late branch's recorded step
    assert dict(wf.CALLS) == before


async def test_control_signals_are_not_caught_by_except_exception() -> None:
    instance = wf.instance("engine_swallows")
    assert await run_once(wf.app, instance) is RunOutcome.SUSPENDED
    assert instance.status == "waiting_for_event"


async def test_a_cancel_that_races_a_suspend_is_applied_and_the_saga_undone() -> None:
    instance = wf.instance("engine_cancellable")

    def cancel(step_id: str) -> None:  # arrives after the step ran, before the suspend
        instance.cancel_requested = True

    wf.HOOKS.after_activity = cancel
    assert await run_once(wf.app, instance) is RunOutcome.CANCELLED
    assert instance.status == "cancelled"
    assert instance.waiting_for is None  # the suspend was refused, not registered
    assert wf.UNDONE == ["kept"]
    assert wf.CALLS["double:5"] == 0


async def test_a_cancel_before_the_first_run_runs_nothing() -> None:
    instance = wf.instance("engine_cancellable")
    instance.cancel_requested = True
    assert await run_once(wf.app, instance) is RunOutcome.CANCELLED
    assert instance.history == [] and sum(wf.CALLS.values()) == 0


async def test_a_lost_lease_stops_the_run_without_writing_more() -> None:
    instance = wf.instance("engine_steps", value=1)

    def take_over(step_id: str) -> None:  # another worker claims it while the step runs
        instance.lease_token = "someone else"

    wf.HOOKS.after_activity = take_over
    expect_log("instance.lease_lost")
    assert await run_once(wf.app, instance) is RunOutcome.LEASE_LOST
    # double:1's record was held back for the suspend to fold in, and went with the
    # refused suspend, as on PostgreSQL: the next holder runs the step again
    assert instance.history == []
    assert instance.writes == []  # every write after the takeover was refused at its fence
    assert instance.waiting_for is None  # the stale run registered no timer
