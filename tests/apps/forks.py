"""Workflows the fork tests run (tests/integration/test_forks.py, tests/system/test_forks.py,
the console's fork button): a saga whose third step fails until the code is "fixed", and
an order whose history holds each kind of record a fork keeps or drops.

The fix is an environment variable read when ``ship`` runs (``KENNING_TEST_FORK_FIXED``):
a worker started with it is the deploy that fixed the bug, one without it the code that
failed. Every activity and compensation writes a line to the side channel, so a test
counts what ran, per instance.
"""

from __future__ import annotations

import os

from kenning import (
    App,
    RetryPolicy,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    publish_value,
    receive,
    start_child,
    subscribe,
    workflow,
    write_stream,
)
from tests.sidechannel import record_execution

FIXED = "KENNING_TEST_FORK_FIXED"
app = App("kenning-forks-tests", default_retry_policy=RetryPolicy(max_attempts=1))


@compensation
async def release(ctx: WorkflowContext, order: str) -> None:
    record_execution(f"release {ctx.instance_id}")


@compensation
async def refund(ctx: WorkflowContext, amount: int) -> None:
    record_execution(f"refund {ctx.instance_id}")


@activity
@on_failure(release)
async def reserve(ctx: WorkflowContext, order: str) -> str:
    record_execution(f"reserve {ctx.instance_id}")
    return f"r-{order}"


@activity
@on_failure(refund)
async def charge(ctx: WorkflowContext, amount: int) -> int:
    record_execution(f"charge {ctx.instance_id} {amount}")
    return amount


@activity
async def ship(ctx: WorkflowContext, order: str) -> str:
    record_execution(f"ship {ctx.instance_id}")
    if os.environ.get(FIXED) != "1":
        raise RuntimeError("the carrier refuses the parcel (the bug the fix removes)")
    return f"shipped {order}"


@workflow(name="forks.saga")
async def saga(ctx: WorkflowContext, order: str, amount: int) -> str:
    """Steps 1 to 3 as ``kenning instances show`` numbers them: reserve, charge, ship."""
    await reserve(ctx, order)
    await charge(ctx, amount)
    return await ship(ctx, order)


@workflow(name="forks.rich")
async def rich(ctx: WorkflowContext, order: str, amount: int) -> dict[str, object]:
    """Records, in order: 1 reserve, 2 a published value, 3 a stream entry, 4 a received
    message (a wait), 5 charge, 6 a published value, 7 a stream entry, 8 ship."""
    reservation = await reserve(ctx, order)
    await publish_value(ctx, "stage", "reserved")
    await write_stream(ctx, "log", f"reserved {reservation}")
    paid = await receive(ctx, "paid")
    charged = await charge(ctx, amount)
    await publish_value(ctx, "stage", "charged")
    await write_stream(ctx, "log", f"charged {charged}")
    shipped = await ship(ctx, order)
    return {"paid": paid.data, "charged": charged, "shipped": shipped}


@activity
async def note(ctx: WorkflowContext, text: str) -> str:
    record_execution(f"note {ctx.instance_id}")
    return text


@workflow(name="forks.listener")
async def listener(ctx: WorkflowContext, channel: str) -> object:
    """1 subscribe, 2 note, then the channel's first broadcast."""
    await subscribe(ctx, channel)
    await note(ctx, "subscribed")
    return (await receive(ctx, channel)).data


@workflow(name="forks.child")
async def child(ctx: WorkflowContext, n: int) -> int:
    await note(ctx, f"child {n}")
    return n * 10


@workflow(name="forks.parent")
async def parent(ctx: WorkflowContext, n: int) -> str:
    """1 a child started, 2 its result, 3 ship (which fails until the fix)."""
    handle = await start_child(ctx, child, n=n)
    value = await handle.result()
    return f"{value} {await ship(ctx, str(n))}"


@workflow(name="forks.awaited")
async def awaited(ctx: WorkflowContext, n: int) -> int:
    """A child that runs until it is sent ``go``."""
    await receive(ctx, "go")
    return n * 10


@workflow(name="forks.waiting_parent")
async def waiting_parent(ctx: WorkflowContext, n: int) -> int:
    """1 a child started (it runs until it is sent ``go``), 2 note, 3 its result."""
    handle = await start_child(ctx, awaited, n=n)
    await note(ctx, "started")
    return await handle.result()
