"""``ctx.patched`` on the in-memory port: a changed workflow where old instances finish on
the old path and new ones take the new path, and every replay agrees. No database.

The "deploy" is the instance's workflow name switched to the changed code's: histories
hold step ids, never the code, so the next run replays the same history on the new code.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from kenning import WorkflowContext, activity, wait_event, workflow
from kenning.core.names import ACTIVITY_COMPLETED, EVENT_RECEIVED, PATCH_MARKER
from kenning.core.records import ClaimedInstance
from kenning.engine.history import PATCH_STEP_PREFIX
from kenning.engine.outcomes import RunOutcome
from kenning.engine.replayonly import Verdict, replay_only
from kenning.testing.memoryport import run_once, run_until_rest
from kenning.testing.memorystate import MemoryInstance
from tests import engine_support as wf
from tests.logguard import expect_log

CALLS: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


@activity
async def reserve(ctx: WorkflowContext) -> str:
    CALLS["reserve"] += 1
    return "reserved"


@activity
async def reserve_v2(ctx: WorkflowContext) -> str:
    CALLS["reserve_v2"] += 1
    return "reserved v2"


@activity
async def ship(ctx: WorkflowContext, how: str) -> str:
    CALLS[f"ship:{how}"] += 1
    return how


@workflow(name="patch_old")
async def patch_old(ctx: WorkflowContext) -> str:
    how = await reserve(ctx)
    await wait_event(ctx, "paid")
    return await ship(ctx, how)


@workflow(name="patch_new")
async def patch_new(ctx: WorkflowContext) -> str:
    how = await reserve_v2(ctx) if await ctx.patched("v2") else await reserve(ctx)
    await wait_event(ctx, "paid")
    return await ship(ctx, how)


@workflow(name="patch_twice")
async def patch_twice(ctx: WorkflowContext) -> list[bool]:
    first = await ctx.patched("v2")
    await reserve(ctx)
    return [first, await ctx.patched("v2")]


@workflow(name="patch_after_wait")
async def patch_after_wait(ctx: WorkflowContext) -> str:
    await wait_event(ctx, "paid")
    return await reserve_v2(ctx) if await ctx.patched("late") else await reserve(ctx)


@workflow(name="patch_removed")
async def patch_removed(ctx: WorkflowContext) -> str:
    """``patch_new`` once every old instance has finished: the call and old path are gone."""
    how = await reserve_v2(ctx)
    await wait_event(ctx, "paid")
    return await ship(ctx, how)


def _instance(workflow_name: str) -> MemoryInstance:
    return MemoryInstance(id=f"{workflow_name}-1", workflow_name=workflow_name)


def _steps(instance: MemoryInstance) -> list[tuple[str, str]]:
    return [(r.step_id, r.kind) for r in instance.history]


def _paid(instance: MemoryInstance) -> None:
    instance.deliver_event({"type": "paid", "source": "t", "id": "e1", "data": {}})


async def _replays_alike(workflow_name: str, instance: MemoryInstance) -> None:
    """The finished history replays on ``workflow_name`` to the same result, running and
    recording nothing."""
    copy = MemoryInstance(id=instance.id, workflow_name=workflow_name, history=list(instance.history))
    calls = Counter(CALLS)
    assert await run_once(wf.app, copy) is RunOutcome.COMPLETED
    assert copy.result == instance.result
    assert copy.history == instance.history
    assert calls == CALLS


async def test_an_instance_past_the_patch_finishes_on_the_old_path() -> None:
    instance = _instance("patch_old")
    assert await run_until_rest(wf.app, instance) == [RunOutcome.SUSPENDED]
    instance.workflow_name = "patch_new"  # the deploy
    _paid(instance)
    assert await run_once(wf.app, instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": "reserved"}
    assert CALLS == {"reserve": 1, "ship:reserved": 1}
    assert not any(r.kind == PATCH_MARKER for r in instance.history)
    await _replays_alike("patch_new", instance)


async def test_a_new_instance_takes_the_new_path_and_records_the_marker() -> None:
    instance = _instance("patch_new")
    assert await run_until_rest(wf.app, instance) == [RunOutcome.SUSPENDED]
    assert _steps(instance) == [(f"{PATCH_STEP_PREFIX}v2", PATCH_MARKER), ("reserve_v2:1", ACTIVITY_COMPLETED)]
    _paid(instance)
    assert await run_once(wf.app, instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": "reserved v2"}
    assert CALLS == {"reserve_v2": 1, "ship:reserved v2": 1}
    await _replays_alike("patch_new", instance)


async def test_the_decision_is_made_once_per_run_and_recorded_once() -> None:
    instance = _instance("patch_twice")
    assert await run_until_rest(wf.app, instance) == [RunOutcome.COMPLETED]
    assert instance.result == {"result": [True, True]}
    assert [r.step_id for r in instance.history].count(f"{PATCH_STEP_PREFIX}v2") == 1
    await _replays_alike("patch_twice", instance)


async def test_an_instance_not_yet_at_the_patch_takes_the_new_path() -> None:
    """Waiting before the patch point, with nothing recorded beyond it: after the deploy
    it has not been there yet, so it goes the new way."""
    instance = _instance("patch_after_wait")
    assert await run_until_rest(wf.app, instance) == [RunOutcome.SUSPENDED]
    _paid(instance)
    assert await run_once(wf.app, instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": "reserved v2"}
    assert [r.kind for r in instance.history] == [EVENT_RECEIVED, PATCH_MARKER, ACTIVITY_COMPLETED]
    await _replays_alike("patch_after_wait", instance)


async def test_markers_need_no_call_once_the_old_path_is_removed() -> None:
    instance = _instance("patch_new")
    assert await run_until_rest(wf.app, instance) == [RunOutcome.SUSPENDED]
    instance.workflow_name = "patch_removed"
    _paid(instance)
    assert await run_once(wf.app, instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": "reserved v2"}


async def test_ctx_patched_is_refused_inside_an_activity() -> None:
    expect_log("instance.failed", workflow="patch_in_activity")
    instance = _instance("patch_in_activity")
    await run_until_rest(wf.app, instance)
    assert instance.status == "failed"
    assert "ctx.patched belongs in workflow code" in str(instance.error)


@activity(retry_policy=wf.FAST)
async def patches(ctx: WorkflowContext) -> bool:
    return await ctx.patched("inside")


@workflow(name="patch_in_activity")
async def patch_in_activity(ctx: WorkflowContext) -> bool:
    return await patches(ctx)


# ---------------------------------------------------------------- replay only


def _claimed(instance: MemoryInstance) -> ClaimedInstance:
    return ClaimedInstance(instance.id, instance.workflow_name, instance.status, {}, False, "", 1, {})


async def _check(workflow_name: str, instance: MemoryInstance) -> tuple[Verdict, str, str, str, str]:
    report = await replay_only(
        wf.app,
        wf.app.registry.workflow(workflow_name),
        _claimed(instance),
        list(instance.history),
        list(instance.compensations),
    )
    return report.verdict, report.step_id, report.recorded_name, report.new_name, report.new_step


async def test_replay_only_runs_and_writes_nothing() -> None:
    instance = _instance("patch_old")
    await run_until_rest(wf.app, instance)
    history, calls = list(instance.history), Counter(CALLS)
    # the old code and the patched code replay it and would go on at the wait
    assert await _check("patch_old", instance) == (Verdict.GOES_ON, "", "", "", "wait_event_paid:1")
    assert await _check("patch_new", instance) == (Verdict.GOES_ON, "", "", "", "wait_event_paid:1")
    # code that renamed the first step unpatched diverges there
    assert await _check("patch_removed", instance) == (Verdict.DIVERGED, "reserve:1", "reserve", "reserve_v2", "")
    _paid(instance)
    # an activity that is not recorded yet is where the replay stops, never run
    assert await _check("patch_new", instance) == (Verdict.GOES_ON, "", "", "", "ship:1")
    assert instance.history[:-1] == history and calls == CALLS
    # a new instance of the patched code would record the marker first: stop there
    fresh = _instance("patch_new")
    assert await _check("patch_new", fresh) == (Verdict.GOES_ON, "", "", "", f"{PATCH_STEP_PREFIX}v2")
    assert not fresh.history and calls == CALLS
