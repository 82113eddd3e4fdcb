"""The engine's fixes after the review of issue 14, on the in-memory port (no database)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from kenning import App, WorkflowContext, activity, wait_event, wait_timer, workflow
from kenning.core.names import ACTIVITY_COMPLETED
from kenning.core.records import SuspendOutcome
from kenning.engine.commands import Suspend
from kenning.engine.outcomes import RunOutcome
from kenning.engine.run import WorkflowRun
from kenning.errors import LeaseLostError
from kenning.testing.memoryport import MemoryPort, run_once
from kenning.testing.memorystate import MemoryInstance
from tests.logguard import expect_log

CALLS: Counter[str] = Counter()
OPTIONS: dict[str, Any] = {"sleep_on": None, "wrap": False, "match": None}


class SleepyHooks:
    """A hook that does I/O (here: sleeps) while a recorded step is replayed."""

    async def on_activity_complete(
        self, instance_id: str, step_id: str, name: str, result: Any, replaying: bool
    ) -> None:
        if replaying and step_id == OPTIONS["sleep_on"]:
            await asyncio.sleep(0.05)


app = App("kenning-engine-review-tests", hooks=SleepyHooks())


@activity
async def review_step(ctx: WorkflowContext, name: str) -> str:
    CALLS[name] += 1
    return name


@workflow(name="review_two_branches")
async def two_branches(ctx: WorkflowContext, right: str) -> list[str]:
    async def left_branch() -> list[str]:
        # a nested gather: its task starts a loop turn after the outer ones
        (first,) = await asyncio.gather(review_step(ctx, "a1", activity_id="a1"))
        return [first, await review_step(ctx, "a2", activity_id="a2")]

    async def right_branch() -> list[str]:
        return [await review_step(ctx, right, activity_id=right)]

    both = asyncio.gather(right_branch(), left_branch())
    if OPTIONS["wrap"]:
        right_steps, left_steps = await asyncio.wait_for(both, timeout=5)
    else:
        right_steps, left_steps = await both
    return left_steps + right_steps


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    CALLS.clear()
    OPTIONS.update(sleep_on=None, wrap=False, match=None)
    yield
    OPTIONS.update(sleep_on=None, wrap=False, match=None)


def _replaying(*recorded: str) -> MemoryInstance:
    """An instance whose history holds ``recorded`` (the right branch asks for ``b1``)."""
    instance = MemoryInstance(id="review-1", workflow_name="review_two_branches", input={"right": "b1"})
    for step_id in recorded:
        instance.append(step_id, ACTIVITY_COMPLETED, "review_step", {"result": step_id})
    return instance


@pytest.mark.parametrize("wait", ["hook_sleeps", "wait_for"])
async def test_a_branch_waiting_outside_the_engine_during_replay_is_not_a_divergence(wait: str) -> None:
    """The right branch parks at its new step while the left one has recorded steps to
    replay but waits on something outside the engine first (a replay hook's I/O, or the
    whole gather under wait_for): the verdict waits for it, and the run completes."""
    OPTIONS.update(sleep_on="a1" if wait == "hook_sleeps" else None, wrap=wait == "wait_for")
    instance = _replaying("a1", "a2")
    assert await run_once(app, instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": ["a1", "a2", "b1"]}
    assert CALLS == {"b1": 1}  # only the new step ran


async def test_a_divergence_is_still_decided_when_the_outside_wait_ends() -> None:
    """A recorded step no branch reaches any more (c1) is a divergence, once the hook's
    sleep is over and every branch is parked or finished; nothing new ran."""
    expect_log("instance.non_deterministic", workflow="review_two_branches")
    OPTIONS.update(sleep_on="a1")
    instance = _replaying("a1", "c1", "a2")
    assert await run_once(app, instance) is RunOutcome.FAILED
    assert instance.error is not None and instance.error["type"] == "kenning.errors.NonDeterminismError"
    assert "c1" in instance.error["message"]
    assert CALLS == {}


class LeaseLostOnFlush(MemoryPort):
    """A port whose lease is found lost by the write after a suspend."""

    suspended = False

    async def suspend(self, command: Suspend) -> SuspendOutcome:
        self.suspended = True
        return await super().suspend(command)

    async def flush(self) -> None:
        if self.suspended:
            raise LeaseLostError("lease lost before the deferred record")
        await super().flush()


@workflow(name="review_suspends")
async def suspends(ctx: WorkflowContext) -> None:
    await review_step(ctx, "s1")
    await wait_timer(ctx, 60.0)


async def test_a_lease_lost_on_the_flush_after_a_suspend_ends_the_run_as_lease_lost() -> None:
    """No control signal escapes ``run()`` (the worker's task would die with it)."""
    instance = MemoryInstance(id="review-2", workflow_name="review_suspends", input={})
    claimed = instance.claim()
    run = WorkflowRun(
        app=app,
        workflow=app.registry.workflow("review_suspends"),
        claimed=claimed,
        history=[],
        compensations=[],
        port=LeaseLostOnFlush(instance, claimed.lease_token),
        inline_retry_seconds=5.0,
    )
    assert await run.run() is RunOutcome.LEASE_LOST


@workflow(name="review_waits_with_match")
async def waits_with_match(ctx: WorkflowContext) -> Any:
    event = await wait_event(ctx, "paid", match=OPTIONS["match"])
    return event.data


async def test_a_recorded_event_replays_whatever_the_match_holds_now() -> None:
    """``match`` is read only when the wait is new: on replay the recorded event is
    returned even if the match could not be turned into JSON any more."""
    instance = MemoryInstance(id="review-3", workflow_name="review_waits_with_match", input={})
    OPTIONS["match"] = {"order": "o-1"}
    assert await run_once(app, instance) is RunOutcome.SUSPENDED
    instance.deliver_event({"type": "paid", "source": "t", "id": "e1", "data": {"order": "o-1"}})
    OPTIONS["match"] = {"order": object()}  # not JSON
    assert await run_once(app, instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": {"order": "o-1"}}
