"""Workflows for the engine's unit tests (``tests/unit/test_engine_*.py``): run on the in-memory
port, without PostgreSQL. ``CALLS`` counts each activity's real executions."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

from kenning import (
    App,
    RetryPolicy,
    TerminalError,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    register_compensation,
    wait_event,
    wait_timer,
    workflow,
)
from kenning.testing.memorystate import MemoryInstance

CALLS: Counter[str] = Counter()
UNDONE: list[str] = []
VARIANT = {"name": "a"}
FAILURES = {"flaky": 0}


class Hooks:
    """Lets a test act at a precise point of a run (a cancel arriving mid-run)."""

    def __init__(self) -> None:
        self.after_activity: Callable[[str], None] | None = None

    async def on_activity_complete(self, instance_id: str, step_id: str, *_: Any) -> None:
        if self.after_activity is not None:
            self.after_activity(step_id)


HOOKS = Hooks()
app = App(hooks=HOOKS)

FAST = RetryPolicy(initial_interval=0.0, max_attempts=3, max_duration=None)


def instance(workflow_name: str, **input: Any) -> MemoryInstance:
    return MemoryInstance(id=f"{workflow_name}-1", workflow_name=workflow_name, input=input)


def reset() -> None:
    CALLS.clear()
    UNDONE.clear()
    VARIANT["name"] = "a"
    FAILURES["flaky"] = 0
    HOOKS.after_activity = None


@activity
async def double(ctx: WorkflowContext, value: int) -> int:
    CALLS[f"double:{value}"] += 1
    return value * 2


@activity(retry_policy=FAST)
async def flaky(ctx: WorkflowContext) -> str:
    CALLS["flaky"] += 1
    if FAILURES["flaky"] > 0:
        FAILURES["flaky"] -= 1
        raise RuntimeError("not yet")
    return "ok"


@activity(retry_policy=RetryPolicy(initial_interval=60.0, max_attempts=3, max_duration=None))
async def slow_flaky(ctx: WorkflowContext) -> str:
    CALLS["slow_flaky"] += 1
    if FAILURES["flaky"] > 0:
        FAILURES["flaky"] -= 1
        raise RuntimeError("not yet")
    return "ok"


@activity
async def refuses(ctx: WorkflowContext) -> None:
    CALLS["refuses"] += 1
    raise TerminalError("no")


@compensation
async def undo(ctx: WorkflowContext, name: str) -> None:
    UNDONE.append(name)


@compensation
async def undo_flaky(ctx: WorkflowContext, name: str) -> None:
    CALLS[f"undo_flaky:{name}"] += 1
    if FAILURES["flaky"] > 0:
        FAILURES["flaky"] -= 1
        raise RuntimeError("undo not yet")
    UNDONE.append(name)


undo_flaky.retry_policy = FAST  # type: ignore[attr-defined]


@activity
@on_failure(undo)
async def book(ctx: WorkflowContext, name: str) -> dict[str, str]:
    CALLS[f"book:{name}"] += 1
    return {"name": name}


@workflow(name="engine_steps")
async def steps(ctx: WorkflowContext, value: int) -> int:
    first = await double(ctx, value)
    await wait_timer(ctx, 1.0)
    return await double(ctx, first)


@workflow(name="engine_waits")
async def waits(ctx: WorkflowContext) -> Any:
    await double(ctx, 1)
    event = await wait_event(ctx, "paid")
    return event.data


@workflow(name="engine_gather")
async def gather(ctx: WorkflowContext) -> list[int]:
    async def branch(n: int) -> int:
        # a nested gather: its tasks start a loop turn after the outer ones
        (a,) = await asyncio.gather(double(ctx, n))
        await asyncio.sleep(0)
        return await double(ctx, a + 100)

    results = await asyncio.gather(branch(1), branch(2), branch(3))
    await wait_timer(ctx, 1.0)
    return list(results)


SLOW_TURNS = 50  # far more loop turns than any fixed number of yields would wait


@workflow(name="engine_slow_branch")
async def slow_branch(ctx: WorkflowContext) -> list[Any]:
    async def quick() -> int:
        first = await double(ctx, 1)
        return await double(ctx, first)  # new on replay while the slow branch has not replayed yet

    async def slow() -> str:
        for _ in range(SLOW_TURNS):
            await asyncio.sleep(0)
        return await flaky(ctx)

    return list(await asyncio.gather(quick(), slow()))


@workflow(name="engine_changes")
async def changes(ctx: WorkflowContext) -> int:
    if VARIANT["name"] == "a":
        await double(ctx, 1)
    else:
        await flaky(ctx)
    await wait_timer(ctx, 1.0)
    return 0


@workflow(name="engine_branch_diverges")
async def branch_diverges(ctx: WorkflowContext) -> Any:
    async def left() -> int:
        return await double(ctx, 10)

    async def right() -> int:
        # recorded as double(20), now asks for double(21) by the same name
        return await double(ctx, 20 if VARIANT["name"] == "a" else 21)

    async def late() -> int:
        if VARIANT["name"] == "a":
            return await double(ctx, 30)
        return 0

    results = await asyncio.gather(left(), right(), late())
    await wait_timer(ctx, 1.0)
    return results


@workflow(name="engine_retries")
async def retries(ctx: WorkflowContext) -> str:
    return await flaky(ctx)


@workflow(name="engine_slow_retries")
async def slow_retries(ctx: WorkflowContext) -> str:
    return await slow_flaky(ctx)


@workflow(name="engine_terminal")
async def terminal(ctx: WorkflowContext) -> None:
    await refuses(ctx)


@workflow(name="engine_saga")
async def saga(ctx: WorkflowContext) -> None:
    await book(ctx, "first")
    await register_compensation(ctx, undo, name="explicit")
    await book(ctx, "second")
    await refuses(ctx)


@workflow(name="engine_saga_flaky")
async def saga_flaky(ctx: WorkflowContext) -> None:
    await register_compensation(ctx, undo_flaky, name="one")
    await refuses(ctx)


@workflow(name="engine_swallows")
async def swallows(ctx: WorkflowContext) -> str:
    try:
        await wait_event(ctx, "never")
    except Exception:  # user code cannot swallow the engine's control signals
        return "swallowed"
    return "returned"


@workflow(name="engine_cancellable")
async def cancellable(ctx: WorkflowContext) -> None:
    await book(ctx, "kept")
    await wait_event(ctx, "go")
    await double(ctx, 5)
