"""Workflows the core tests run, in-process and in real worker processes.

Activities append ``name instance_id`` to the side channel each time they really run.
Knobs come from environment variables or files so a separate process can be steered.
"""

from __future__ import annotations

import asyncio
import enum
import os
import time
from pathlib import Path

from pydantic import BaseModel

from kenning import (
    App,
    EventTimeoutError,
    HooksBase,
    RetryExhaustedError,
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
from tests.sidechannel import executions, record_execution


class RecordingHooks(HooksBase):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def on_workflow_start(self, instance_id: str, workflow_name: str, input_data: object) -> None:
        self.calls.append(("start", instance_id))

    async def on_workflow_complete(self, instance_id: str, workflow_name: str, result: object) -> None:
        self.calls.append(("complete", instance_id))

    async def on_workflow_failed(self, instance_id: str, workflow_name: str, error: Exception) -> None:
        self.calls.append(("failed", instance_id))

    async def on_workflow_cancelled(self, instance_id: str, workflow_name: str) -> None:
        self.calls.append(("cancelled", instance_id))

    async def on_activity_complete(
        self, instance_id: str, step: str, activity_name: str, result: object, cache_hit: bool
    ) -> None:
        self.calls.append((f"activity:{step}:{'hit' if cache_hit else 'run'}", instance_id))


hooks = RecordingHooks()
app = App("kenning-tests", hooks=hooks)

FAST = RetryPolicy(initial_interval=0.01, backoff_coefficient=1.0, max_interval=0.01, max_attempts=3)


def side(label: str, ctx: WorkflowContext) -> None:
    record_execution(f"{label} {ctx.instance_id}")


def count(label: str, ctx: WorkflowContext) -> int:
    path = os.environ.get("KENNING_TEST_SIDE_CHANNEL", "")
    return executions(path)[f"{label} {ctx.instance_id}"] if path else 0


# ------------------------------------------------------------------ three steps


@activity
async def step_one(ctx: WorkflowContext, value: int) -> int:
    side("step_one", ctx)
    return value + 1


@activity
async def step_two(ctx: WorkflowContext, value: int) -> int:
    side("step_two", ctx)
    block = os.environ.get("KENNING_TEST_BLOCK_FILE")
    if block:
        while Path(block).exists():
            await asyncio.sleep(0.02)
    return value * 2


@activity
def step_three(ctx: WorkflowContext, value: int) -> int:  # a sync activity, run in a thread
    side("step_three", ctx)
    return value - 3


@workflow
async def three_steps(ctx: WorkflowContext, value: int) -> int:
    a = await step_one(ctx, value)
    b = await step_two(ctx, a)
    return await step_three(ctx, b)


# ------------------------------------------------------------------ types


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Item(BaseModel):
    sku: str
    qty: int


class Order(BaseModel):
    order_id: str
    items: list[Item]
    color: Color


@activity
async def price(ctx: WorkflowContext, items: list[Item]) -> list[Item]:
    side("price", ctx)
    return [Item(sku=i.sku.upper(), qty=i.qty * 10) for i in items]


@activity
async def choose(ctx: WorkflowContext, color: Color) -> Color:
    side("choose", ctx)
    return Color.BLUE if color is Color.RED else Color.RED


@activity(retry_policy=RetryPolicy(initial_interval=0.2, max_interval=0.2, max_attempts=3))
async def pause_once(ctx: WorkflowContext) -> None:
    """Fails the first time with a back-off longer than the worker's inline limit in the
    tests, so the instance is released and replayed by a later claim."""
    side("pause_once", ctx)
    if count("pause_once", ctx) == 1:
        raise RuntimeError("first attempt fails")


@workflow
async def typed(ctx: WorkflowContext, order: Order) -> dict[str, object]:
    items = await price(ctx, order.items)
    color = await choose(ctx, order.color)
    await pause_once(ctx)
    # On the replay after pause_once, items and color come back from history: their
    # types must be restored from the return annotations.
    assert all(isinstance(i, Item) for i in items), items
    assert isinstance(color, Color), color
    return {"skus": [i.sku for i in items], "qty": sum(i.qty for i in items), "color": color.value}


# ------------------------------------------------------------------ retries and failures


@activity(retry_policy=FAST)
async def flaky(ctx: WorkflowContext, failures: int) -> str:
    side("flaky", ctx)
    if count("flaky", ctx) <= failures:
        raise ConnectionError("transient")
    return "ok"


@workflow
async def retrying(ctx: WorkflowContext, failures: int) -> str:
    return await flaky(ctx, failures)


@activity(retry_policy=FAST)
async def always_fails(ctx: WorkflowContext) -> None:
    side("always_fails", ctx)
    raise ValueError("boom")


@activity
async def terminal(ctx: WorkflowContext) -> None:
    side("terminal", ctx)
    raise TerminalError("card declined")


@workflow
async def catches_failure(ctx: WorkflowContext) -> list[str]:
    seen = []
    try:
        await always_fails(ctx)
    except RetryExhaustedError as error:
        seen.append(f"{type(error).__name__}<-{type(error.__cause__).__name__}")
    try:
        await terminal(ctx)
    except TerminalError as error:
        seen.append(f"{type(error).__name__}:{error}")
    await pause_once(ctx)  # forces a replay of both failures from history
    return seen


@activity(retry_policy=RetryPolicy(initial_interval=0.3, backoff_coefficient=1.0, max_attempts=4))
async def slow_retry(ctx: WorkflowContext) -> int:
    side("slow_retry", ctx)
    if count("slow_retry", ctx) < 3:
        raise ConnectionError("down")
    return count("slow_retry", ctx)


@workflow
async def durable_retry(ctx: WorkflowContext) -> int:
    return await slow_retry(ctx)


# ------------------------------------------------------------------ compensation


@compensation
async def release_stock(ctx: WorkflowContext, sku: str, qty: int, *, reservation: str) -> None:
    side(f"release_stock:{sku}:{qty}:{reservation}", ctx)


@compensation
async def refund(ctx: WorkflowContext, amount: int) -> None:
    side(f"refund:{amount}", ctx)
    if os.environ.get("KENNING_TEST_CRASH_IN_REFUND") and count(f"refund:{amount}", ctx) == 1:
        os._exit(9)  # die like kill -9 in the middle of compensating


@activity
@on_failure(release_stock)
async def reserve(ctx: WorkflowContext, sku: str, qty: int) -> dict[str, str]:
    side("reserve", ctx)
    return {"reservation": f"r-{sku}"}


@activity
async def charge(ctx: WorkflowContext, amount: int) -> int:
    side("charge", ctx)
    return amount


@activity
async def ship(ctx: WorkflowContext, fail: bool) -> None:
    side("ship", ctx)
    if fail:
        raise TerminalError("no courier")


@workflow
async def saga(ctx: WorkflowContext, amount: int, fail: bool) -> str:
    await reserve(ctx, "sku1", 2)
    charged = await charge(ctx, amount)
    await register_compensation(ctx, refund, charged)
    await ship(ctx, fail)
    return "shipped"


# ------------------------------------------------------------------ cancellation and gather

GATES: dict[str, asyncio.Event] = {}


@activity
async def gate(ctx: WorkflowContext, name: str) -> str:
    side("gate", ctx)
    await GATES.setdefault(name, asyncio.Event()).wait()
    return name


@workflow
async def cancellable(ctx: WorkflowContext, gate_name: str) -> str:
    await reserve(ctx, "sku9", 1)
    await gate(ctx, gate_name)
    await charge(ctx, 5)
    return "done"


@activity
async def square(ctx: WorkflowContext, n: int) -> int:
    side(f"square:{n}", ctx)
    await asyncio.sleep(0.01 * (5 - n))
    return n * n


@workflow
async def fan_out(ctx: WorkflowContext) -> list[int]:
    results = await asyncio.gather(*(square(ctx, n, activity_id=f"square-{n}") for n in range(5)))
    await pause_once(ctx)
    return list(results)


# ------------------------------------------------------------------ determinism

VARIANT = {"name": "a"}


@activity
async def variant_a(ctx: WorkflowContext) -> str:
    return "a"


@activity
async def variant_b(ctx: WorkflowContext) -> str:
    return "b"


@workflow
async def changes_shape(ctx: WorkflowContext) -> str:
    first = await (variant_a(ctx) if VARIANT["name"] == "a" else variant_b(ctx))
    await pause_once(ctx)
    return first


@activity
async def stamp(ctx: WorkflowContext) -> float:
    return time.time()


@workflow
async def slow_three(ctx: WorkflowContext, value: int) -> int:
    """three_steps under another name, for the kill -9 and stall tests."""
    a = await step_one(ctx, value)
    b = await step_two(ctx, a)
    return await step_three(ctx, b)


# ------------------------------------------------------------------ suspension


@workflow
async def sleeper(ctx: WorkflowContext, seconds: float) -> str:
    await reserve(ctx, "sku5", 1)
    await wait_timer(ctx, seconds)
    await charge(ctx, 1)
    return "woke"


@workflow
async def awaits_payment(ctx: WorkflowContext, order_id: str) -> str:
    await reserve(ctx, "sku7", 1)
    event = await wait_event(ctx, "payment.completed", timeout_seconds=600, match={"order_id": order_id})
    return str(event.data)


@workflow
async def early_reply(ctx: WorkflowContext, order_id: str) -> object:
    """The reply is already in the inbox when the workflow subscribes, and the timeout is
    zero: with since= the event must win."""
    try:
        event = await wait_event(ctx, "reply.sent", timeout_seconds=0, since=60, match={"order_id": order_id})
    except EventTimeoutError:
        return "timed out"
    return event.data["n"]
