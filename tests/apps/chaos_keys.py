"""The chaos run's keyed workflows (issue 35; tests/chaos_keys.py), in the new version of
the app only: one queue with a per-key rate limit whose key is an input field, one whose
keys cancel a start while one of theirs is open (``cancel_newest``). The open one waits on
a durable timer, so the scheduler's kills and stops hold keys open longer."""

from __future__ import annotations

from kenning import Queue, RateLimit, WorkflowContext, activity, wait_timer, workflow

RATED = Queue("chaos-keyed-rate", partition_rate_limit=RateLimit(limit=2, period=1.0, key="key"))
NEWEST = Queue("chaos-newest", partition_strategy="cancel_newest")
RATED_WORKFLOW = "chaos_keyed_rate"
NEWEST_WORKFLOW = "chaos_newest"


@activity
async def keyed_step(ctx: WorkflowContext, key: str, n: int) -> int:
    return n


@workflow(queue=RATED, name=RATED_WORKFLOW)
async def chaos_keyed_rate(ctx: WorkflowContext, key: str, n: int) -> int:
    return await keyed_step(ctx, key, n)


@workflow(queue=NEWEST, name=NEWEST_WORKFLOW)
async def chaos_newest(ctx: WorkflowContext, key: str, n: int) -> int:
    await keyed_step(ctx, key, n)
    await wait_timer(ctx, 0.3)
    return n
