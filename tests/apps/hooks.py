"""Workflows the hook tests run: every lifecycle hook, counted per instance.

``journey`` goes start → activity → wait_event (``rounds`` times) → activity (which sends
an outbox event) → complete; ``saga`` goes start → activity with a compensation →
wait_event → an activity that fails for good → compensation → failed; ``flaky`` retries an
activity once.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from kenning import (
    App,
    EddaApp,
    HooksBase,
    RetryPolicy,
    TerminalError,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    wait_event,
    wait_timer,
    workflow,
)
from kenning.outbox import send_event_transactional

FAST = RetryPolicy(initial_interval=0.01, backoff_coefficient=1.0, max_interval=0.01, max_attempts=3)


class CountingHooks(HooksBase):
    """Every hook call as ``(hook, instance id or None, detail)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, Any]] = []

    def of(self, instance_id: str) -> Counter[str]:
        return Counter(hook for hook, instance, _ in self.calls if instance == instance_id)

    def received(self, instance_id: str) -> list[tuple[str, Any]]:
        """``(event type, event data)`` of each ``on_event_received`` for the instance."""
        return [detail for hook, instance, detail in self.calls if hook == "received" and instance == instance_id]

    async def on_workflow_start(self, instance_id: str, workflow_name: str, input_data: dict[str, Any]) -> None:
        self.calls.append(("start", instance_id, workflow_name))

    async def on_workflow_complete(self, instance_id: str, workflow_name: str, result: Any) -> None:
        self.calls.append(("complete", instance_id, result))

    async def on_workflow_failed(self, instance_id: str, workflow_name: str, error: Exception) -> None:
        self.calls.append(("failed", instance_id, repr(error)))

    async def on_workflow_cancelled(self, instance_id: str, workflow_name: str) -> None:
        self.calls.append(("cancelled", instance_id, workflow_name))

    async def on_activity_start(self, instance_id: str, step: str, activity_name: str, is_replaying: bool) -> None:
        self.calls.append(("activity_start", instance_id, step))

    async def on_activity_complete(
        self, instance_id: str, step: str, activity_name: str, result: Any, cache_hit: bool
    ) -> None:
        self.calls.append(("activity_hit" if cache_hit else "activity_complete", instance_id, step))

    async def on_activity_failed(self, instance_id: str, step: str, activity_name: str, error: Exception) -> None:
        self.calls.append(("activity_failed", instance_id, step))

    async def on_activity_retry(
        self, instance_id: str, step: str, activity_name: str, attempt: int, delay: float
    ) -> None:
        self.calls.append(("activity_retry", instance_id, step))

    async def on_event_sent(self, event_type: str, event_source: str, event_data: Any) -> None:
        # no instance id in Edda's signature: the data carries it
        self.calls.append(("sent", event_data.get("instance_id"), event_type))

    async def on_event_received(self, instance_id: str, event_type: str, event_data: Any) -> None:
        self.calls.append(("received", instance_id, (event_type, event_data)))


hooks = CountingHooks()
app = App("kenning-hook-tests", hooks=hooks)
edda_app = EddaApp(
    "kenning-edda-tests",
    os.environ.get("TEST_APP_DATABASE_URL"),
    True,
    os.environ.get("TEST_APP_BROKER_URL"),
    hooks,
)


@activity
async def hooks_prepare(ctx: WorkflowContext, key: str) -> str:
    return key


@activity
async def hooks_finish(ctx: WorkflowContext, key: str, rounds: int) -> int:
    await send_event_transactional(ctx, "hooks.finished", "/tests/hooks", {"instance_id": ctx.instance_id})
    return rounds


@workflow(name="hooks.journey")
async def journey(ctx: WorkflowContext, key: str, rounds: int = 1, since: float | None = None) -> int:
    await hooks_prepare(ctx, key)
    for n in range(rounds):
        await wait_event(ctx, "hooks.go", match={"key": key, "n": n}, since=since)
    return await hooks_finish(ctx, key, rounds)


@compensation
async def hooks_release(ctx: WorkflowContext, key: str) -> None:
    pass


@activity
@on_failure(hooks_release)
async def hooks_reserve(ctx: WorkflowContext, key: str) -> str:
    return key


@activity
async def hooks_explode(ctx: WorkflowContext, key: str) -> None:
    raise TerminalError(f"no stock for {key}")


@workflow(name="hooks.saga")
async def saga(ctx: WorkflowContext, key: str) -> None:
    await hooks_reserve(ctx, key)
    await wait_event(ctx, "hooks.go", match={"key": key, "n": 0})
    await hooks_explode(ctx, key)


_flaky_attempts: Counter[str] = Counter()


@activity(retry_policy=FAST)
async def hooks_flaky(ctx: WorkflowContext) -> int:
    _flaky_attempts[ctx.instance_id] += 1
    if _flaky_attempts[ctx.instance_id] == 1:
        raise ConnectionError("first attempt fails")
    return _flaky_attempts[ctx.instance_id]


@workflow(name="hooks.flaky")
async def flaky(ctx: WorkflowContext) -> int:
    return await hooks_flaky(ctx)


@workflow(event_handler=True, name="hooks.signup")
async def signup(ctx: WorkflowContext, email: str) -> str:
    return email


@workflow(name="hooks.nap")
async def nap(ctx: WorkflowContext, key: str) -> int:
    await wait_timer(ctx, 0.2)
    return await hooks_finish(ctx, key, 0)
