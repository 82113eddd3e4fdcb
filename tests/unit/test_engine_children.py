"""Child workflows in the replay engine, on the in-memory port (no database): the start is
a step replayed to the same child, a result waits without a worker, a failed child raises
in the parent and its saga undoes, a parent's end cancels its ``cancel`` children; and the
``sleep``/``sleep_until`` aliases record the steps ``wait_timer``/``wait_until`` do."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from kenning import (
    App,
    ChildWorkflowFailed,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    sleep,
    sleep_until,
    start_child,
    wait_event,
    workflow,
)
from kenning.core.names import CHILD_STARTED, EVENT_RECEIVED, TIMER_EXPIRED
from kenning.engine.outcomes import RunOutcome
from kenning.serialization import decode_error
from kenning.testing.memoryport import run_family, run_once
from kenning.testing.memorystate import MemoryInstance
from tests.logguard import expect_log

app = App()
UNDONE: list[str] = []
RAN: list[str] = []


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    UNDONE.clear()
    RAN.clear()
    yield


@compensation
async def undo(ctx: WorkflowContext, what: str) -> None:
    UNDONE.append(what)


@activity
async def effect(ctx: WorkflowContext, what: str) -> str:
    RAN.append(what)
    return what


@activity
@on_failure(undo)
async def reserve(ctx: WorkflowContext, what: str) -> dict[str, str]:
    RAN.append(what)
    return {"what": what}


@workflow(name="engine_child_square")
async def square(ctx: WorkflowContext, n: int) -> int:
    await effect(ctx, f"square:{n}")
    return n * n


@workflow(name="engine_child_fails")
async def failing_child(ctx: WorkflowContext, n: int) -> int:
    await reserve(ctx, f"child:{n}")
    raise ValueError(f"child {n} refused")


@workflow(name="engine_child_waits")
async def waiting_child(ctx: WorkflowContext, n: int) -> int:
    await reserve(ctx, f"child:{n}")
    await wait_event(ctx, "never.sent")
    return n


@workflow(name="engine_parent_sum")
async def parent_sum(ctx: WorkflowContext, count: int) -> int:
    handles = [await start_child(ctx, square, n=n) for n in range(1, count + 1)]
    return sum([await h.result() for h in handles])


@workflow(name="engine_parent_gathers")
async def parent_gathers(ctx: WorkflowContext, count: int) -> list[int]:
    handles = [await start_child(ctx, square, n=n) for n in range(1, count + 1)]
    return list(await asyncio.gather(*(h.result() for h in handles)))


@workflow(name="engine_parent_of_failure")
async def parent_of_failure(ctx: WorkflowContext, catch: bool) -> str:
    await reserve(ctx, "parent")
    handle = await start_child(ctx, failing_child, n=7)
    try:
        await handle.result()
    except ChildWorkflowFailed as error:
        if not catch:
            raise
        return f"{error.child_id}:{error.status}"
    return "unreachable"


@workflow(name="engine_parent_of_waiters")
async def parent_of_waiters(ctx: WorkflowContext) -> None:
    await reserve(ctx, "parent")
    kept = await start_child(ctx, waiting_child, n=1)
    await start_child(ctx, waiting_child, n=2, on_parent_cancel="abandon")
    await kept.result()


@workflow(name="engine_sleeper")
async def sleeper(ctx: WorkflowContext) -> str:
    await sleep(ctx, 0.01)
    await sleep_until(ctx, datetime(2000, 1, 1, tzinfo=UTC))
    return "rested"


def _instance(name: str, **input: object) -> MemoryInstance:
    return MemoryInstance(id=f"{name}-1", workflow_name=name, input=dict(input))


async def test_children_results_are_gathered_and_replay_starts_none_again() -> None:
    parent = _instance("engine_parent_sum", count=3)
    await run_family(app, parent)
    assert (parent.status, parent.result) == ("completed", {"result": 1 + 4 + 9})
    assert len(parent.children) == 3  # one per start step, however many runs replayed them
    assert all(c.status == "completed" and c.parent_id == parent.id for c in parent.children)
    starts = [r for r in parent.history if r.kind == CHILD_STARTED]
    assert [r.step_id for r in starts] == [f"start_child:engine_child_square:{n}" for n in (1, 2, 3)]
    assert [r.payload["child_id"] for r in starts] == [c.id for c in parent.children]
    results = [r for r in parent.history if r.kind == EVENT_RECEIVED]
    assert [r.payload["data"]["result"] for r in results] == [1, 4, 9]
    assert parent.run_count >= 2  # it suspended on a child at least once
    assert sorted(RAN) == ["square:1", "square:2", "square:3"]  # each child's step ran once


async def test_children_results_awaited_together_in_gather_come_back_in_order() -> None:
    parent = _instance("engine_parent_gathers", count=4)
    await run_family(app, parent)
    assert (parent.status, parent.result) == ("completed", {"result": [1, 4, 9, 16]})
    assert parent.run_count >= 2  # the gather suspended it on a child at least once
    assert len(parent.children) == 4 and all(c.status == "completed" for c in parent.children)
    assert sorted(RAN) == [f"square:{n}" for n in (1, 2, 3, 4)]


async def test_a_waiting_parent_holds_no_lease_until_its_child_ends() -> None:
    parent = _instance("engine_parent_sum", count=1)
    assert await run_once(app, parent) is RunOutcome.SUSPENDED
    assert (parent.status, parent.lease_token) == ("waiting_for_event", None)
    (child,) = parent.children
    assert child.status == "pending"
    await run_family(app, parent)
    assert parent.result == {"result": 1}


async def test_a_failed_child_raises_in_the_parent_and_the_parents_saga_undoes() -> None:
    expect_log("instance.failed", workflow="engine_child_fails")
    expect_log("instance.failed", workflow="engine_parent_of_failure")
    parent = _instance("engine_parent_of_failure", catch=False)
    await run_family(app, parent)
    (child,) = parent.children
    assert child.status == "failed" and parent.status == "failed"
    assert UNDONE == ["child:7", "parent"]  # the child's compensation, then the parent's
    error = decode_error(parent.error or {})
    assert isinstance(error, ChildWorkflowFailed)
    assert (error.child_id, error.status) == (child.id, "failed")
    assert error.error is not None and "child 7 refused" in str(error.error["message"])
    assert "traceback" not in error.error  # the parent's own error carries its traceback


async def test_a_parent_may_catch_its_childs_failure() -> None:
    expect_log("instance.failed", workflow="engine_child_fails")
    parent = _instance("engine_parent_of_failure", catch=True)
    await run_family(app, parent)
    (child,) = parent.children
    assert (parent.status, parent.result) == ("completed", {"result": f"{child.id}:failed"})
    assert UNDONE == ["child:7"]


async def test_a_cancelled_parent_cancels_its_cancel_children_and_leaves_abandoned_ones() -> None:
    parent = _instance("engine_parent_of_waiters")
    await run_family(app, parent)
    kept, abandoned = parent.children
    assert parent.status == "waiting_for_event"
    assert kept.status == abandoned.status == "waiting_for_event"
    # what the cancel request does to a waiting instance (instances.instance_request_cancel)
    parent.cancel_requested, parent.status, parent.waiting_for = True, "pending", None
    await run_family(app, parent)
    assert parent.status == "cancelled"
    assert kept.status == "cancelled" and kept.cancel_requested
    assert abandoned.status == "waiting_for_event" and not abandoned.cancel_requested
    assert sorted(UNDONE) == ["child:1", "parent"]


async def test_sleep_and_sleep_until_record_wait_timer_and_wait_until_steps() -> None:
    instance = _instance("engine_sleeper")
    await run_family(app, instance)
    assert instance.result == {"result": "rested"}
    assert [(r.step_id, r.kind) for r in instance.history] == [
        ("wait_timer:1", TIMER_EXPIRED),
        ("wait_until:1", TIMER_EXPIRED),
    ]
