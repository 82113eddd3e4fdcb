"""Continue-as-new on the in-memory port (issue 29, item 1): a chain of runs of one
instance, each with a fresh history; messages sent between runs are kept; ``except
Exception`` cannot stop it; a cancel wins; bad input fails the workflow; unfinished
children are treated as at a parent's end and detached. No database
(tests/system/test_continue_as_new.py runs a chain through PostgreSQL and real workers).

Before the feature ``continue_as_new`` did not exist: a loop's history only grew.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from kenning import (
    App,
    RetryPolicy,
    WorkflowContext,
    activity,
    continue_as_new,
    receive,
    start_child,
    wait_event,
    workflow,
)
from kenning.core.names import MESSAGE_RECEIVED
from kenning.engine.outcomes import RunOutcome
from kenning.testing.memoryport import run_family, run_once, run_until_rest
from kenning.testing.memorystate import MemoryInstance
from tests.logguard import expect_log

app = App()
HANDLED: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def fresh() -> None:
    HANDLED.clear()


@activity
async def can_handle(ctx: WorkflowContext, data: Any) -> int:
    HANDLED[str(data)] += 1
    return int(data)


@workflow
async def can_sum(ctx: WorkflowContext, per_run: int, runs: int, total: int = 0, run: int = 1) -> dict[str, int]:
    """Adds ``per_run`` messages a run, ``runs`` runs long."""
    for _ in range(per_run):
        total += await can_handle(ctx, (await receive(ctx, "numbers")).data)
    if run < runs:
        await continue_as_new(ctx, per_run=per_run, runs=runs, total=total, run=run + 1)
    return {"total": total, "run": run}


@workflow
async def can_swallowing(ctx: WorkflowContext, left: int) -> str:
    try:
        if left > 0:
            await continue_as_new(ctx, left=left - 1)
    except Exception:
        return "swallowed"
    return "done"


@workflow
async def can_bad_input(ctx: WorkflowContext, count: int) -> int:
    await continue_as_new(ctx, count="not a number")


@workflow
async def can_cancelled(ctx: WorkflowContext) -> str:
    await can_handle(ctx, 1)
    await continue_as_new(ctx)  # a cancel requested wins: this raises WorkflowCancelledException


@activity(retry_policy=RetryPolicy(max_attempts=1))
async def can_inside_activity(ctx: WorkflowContext) -> None:
    await continue_as_new(ctx)


@workflow
async def can_from_activity(ctx: WorkflowContext) -> None:
    await can_inside_activity(ctx)


@workflow
async def can_child(ctx: WorkflowContext) -> str:
    await wait_event(ctx, "never")
    return "child"


@workflow
async def can_parent(ctx: WorkflowContext, again: bool = True) -> str:
    await start_child(ctx, can_child, on_parent_cancel="cancel")
    await start_child(ctx, can_child, on_parent_cancel="abandon")
    if again:
        await continue_as_new(ctx, again=False)
    return "parent"


async def test_a_chain_runs_to_its_end_with_a_fresh_history_per_run_and_every_message_once() -> None:
    instance = MemoryInstance(id="sum-1", workflow_name="can_sum", input={"per_run": 2, "runs": 3})
    for n in range(1, 7):
        instance.send_message("numbers", n, message_id=f"m{n}")
    outcomes = await run_until_rest(app, instance)
    assert outcomes == [RunOutcome.CONTINUED, RunOutcome.CONTINUED, RunOutcome.COMPLETED]
    assert instance.status == "completed"
    assert instance.result == {"result": {"total": 21, "run": 3}}
    assert instance.run == 3
    # the last run's history only: its two receives and two activities
    assert len(instance.history) == 4
    assert [r["run"] for r in instance.runs] == [1, 2]
    assert [r["steps"] for r in instance.runs] == [4, 4]
    assert instance.runs[1]["input"] == {"per_run": 2, "runs": 3, "total": 3, "run": 2}
    assert Counter({str(n): 1 for n in range(1, 7)}) == HANDLED
    assert all(m.consumed_step_id is not None for m in instance.mailbox)


async def test_a_message_sent_between_runs_is_received_by_the_next_run() -> None:
    instance = MemoryInstance(id="sum-2", workflow_name="can_sum", input={"per_run": 1, "runs": 2})
    instance.send_message("numbers", 5, message_id="first")
    assert await run_once(app, instance) is RunOutcome.CONTINUED
    assert instance.status == "pending" and instance.history == [] and instance.run == 2
    assert await run_once(app, instance) is RunOutcome.SUSPENDED  # run 2 waits for a message
    instance.send_message("numbers", 7, message_id="between")
    assert await run_once(app, instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": {"total": 12, "run": 2}}
    received = [r.payload["message_id"] for r in instance.history if r.kind == MESSAGE_RECEIVED]
    assert received == ["between"]


async def test_except_exception_in_the_workflow_does_not_swallow_it() -> None:
    instance = MemoryInstance(id="swallow-1", workflow_name="can_swallowing", input={"left": 2})
    outcomes = await run_until_rest(app, instance)
    assert outcomes == [RunOutcome.CONTINUED, RunOutcome.CONTINUED, RunOutcome.COMPLETED]
    assert instance.result == {"result": "done"} and instance.run == 3


async def test_input_the_workflow_refuses_fails_the_run() -> None:
    expect_log("instance.failed")
    instance = MemoryInstance(id="bad-1", workflow_name="can_bad_input", input={"count": 1})
    assert await run_once(app, instance) is RunOutcome.FAILED
    assert instance.error is not None and instance.error["type"] == "kenning.starting.InvalidInputError"
    assert instance.run == 1 and instance.runs == []


async def test_a_cancel_requested_before_the_continue_wins() -> None:
    instance = MemoryInstance(id="cancel-1", workflow_name="can_cancelled", input={})
    instance.cancel_requested = True
    instance.append("can_handle:1", "ActivityCompleted", "can_handle", {"result": 1})
    assert await run_once(app, instance) is RunOutcome.CANCELLED
    assert instance.status == "cancelled" and instance.run == 1 and instance.runs == []


async def test_unfinished_children_are_treated_as_at_the_parents_end_and_detached() -> None:
    parent = MemoryInstance(id="parent-1", workflow_name="can_parent", input={})
    await run_family(app, parent)
    assert parent.status == "completed" and parent.run == 2
    first_run = parent.children[:2]
    assert all(c.parent_id is None for c in first_run)  # detached: their ends tell no one
    cancel, abandon = first_run
    assert cancel.status == "cancelled"
    assert abandon.status == "waiting_for_event" and not abandon.cancel_requested
    # the second run's children are its own, and the parent's end applies to them
    second_run = parent.children[2:]
    assert [c.parent_id for c in second_run] == ["parent-1", "parent-1"]
    assert len(parent.history) == 2  # run 2's two ChildStarted steps only


async def test_continue_as_new_inside_an_activity_is_a_runtime_error() -> None:
    expect_log("instance.failed")
    instance = MemoryInstance(id="inside-1", workflow_name="can_from_activity", input={})
    assert await run_once(app, instance) is RunOutcome.FAILED
    assert instance.error is not None
    assert "continue_as_new belongs in workflow code" in str(instance.error), instance.error
    assert instance.run == 1 and instance.runs == []
