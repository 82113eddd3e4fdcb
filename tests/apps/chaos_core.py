"""The chaos test's app as its OLD version has it (``tests/system/test_chaos.py``,
``scripts/chaos.py``): steps, timers, events, a saga that fails and compensates, and outbox
sends. One worker of the chaos run runs only this module, beside workers on the new
version (``tests.apps.chaos``, which imports this one and adds an ``event_handler``
workflow, an ``on_event`` handler and a slow workflow): a fleet in a rolling deploy. This
module must never import the new one (the registry is process-wide: whatever a worker
imports, it has).

Every effect appends ``step <instance id> <step id>`` to the side channel each time it
really runs, so the invariant checker can match each effect to its one recorded step.
Step ids are the engine's defaults (``name:n``); compensations' are
``compensation:on_failure:<activity step id>``.
"""

from __future__ import annotations

import os
from typing import Any

from kenning import (
    App,
    RetryPolicy,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    wait_event,
    wait_timer,
    workflow,
)
from kenning.outbox import send_event_transactional
from tests.sidechannel import executions, record_execution

app = App("kenning-chaos")

# Retries quick enough for the test, and enough of them that a fault is never an exhausted step.
QUICK = RetryPolicy(initial_interval=0.05, backoff_coefficient=2.0, max_interval=0.5, max_attempts=20)
ANSWER = "chaos.answer"
ANNOUNCED = "chaos.announced"
# What each workflow ends as when nothing is lost.
EXPECTED = {
    "chaos_steps": "completed",
    "chaos_timer": "completed",
    "chaos_event": "completed",
    "chaos_saga": "failed",
}


class PlannedFailureError(Exception):
    """The saga's own failure, after its reservations: what it is undone for."""


def _effect(ctx: WorkflowContext, step_id: str) -> None:
    record_execution(f"step {ctx.instance_id} {step_id}")


@activity(retry_policy=QUICK)
async def effect(ctx: WorkflowContext, n: int) -> int:
    _effect(ctx, f"effect:{n}")
    return n


@activity(retry_policy=QUICK)
async def flaky(ctx: WorkflowContext) -> str:
    """Fails its first attempt (counted in the side channel), so attempts are recorded."""
    key = f"try {ctx.instance_id} flaky:1"
    record_execution(key)
    path = os.environ.get("KENNING_TEST_SIDE_CHANNEL")
    if path and executions(path)[key] < 2:
        raise RuntimeError("first attempt fails on purpose")
    _effect(ctx, "flaky:1")
    return "ok"


@activity(retry_policy=QUICK)
async def announce(ctx: WorkflowContext, n: int) -> str:
    event_id = await send_event_transactional(ctx, ANNOUNCED, "/chaos", {"instance": ctx.instance_id, "n": n})
    _effect(ctx, "announce:1")
    return event_id


@compensation
async def release(ctx: WorkflowContext, n: int, *, reservation: str) -> None:
    _effect(ctx, f"compensation:on_failure:reserve:{n}")


@activity(retry_policy=QUICK)
@on_failure(release)
async def reserve(ctx: WorkflowContext, n: int) -> dict[str, str]:
    _effect(ctx, f"reserve:{n}")
    return {"reservation": f"r-{ctx.instance_id}-{n}"}


@workflow
async def chaos_steps(ctx: WorkflowContext, n: int) -> str:
    for i in (1, 2, 3):
        await effect(ctx, i)
    await flaky(ctx)
    await announce(ctx, n)
    return "done"


@workflow
async def chaos_timer(ctx: WorkflowContext, seconds: float) -> str:
    await effect(ctx, 1)
    await wait_timer(ctx, seconds)
    await effect(ctx, 2)
    return "done"


@workflow
async def chaos_event(ctx: WorkflowContext, key: str) -> Any:
    await effect(ctx, 1)
    answer = await wait_event(ctx, ANSWER, match={"key": key}, since=600, timeout_seconds=600)
    await effect(ctx, 2)
    return answer.data


@workflow
async def chaos_saga(ctx: WorkflowContext, n: int) -> str:
    for i in (1, 2, 3):
        await reserve(ctx, i)
    await effect(ctx, 1)
    raise PlannedFailureError(f"saga {n} fails after its reservations, on purpose")
