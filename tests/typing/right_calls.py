"""Calls of the public API as users write them: mypy --strict and pyright (strict) must report
nothing here (``tests/unit/test_typed_calls.py``). Read by type checkers, never imported."""

from __future__ import annotations

import asyncio
from typing import Any, assert_type

import pydantic

from kenning import ChildHandle, Client, StartedInstance, WorkflowContext, activity, start_child, workflow
from kenning.testing import WorkflowEnvironment


class Receipt(pydantic.BaseModel):
    sku: str
    qty: int


@activity
async def reserve(ctx: WorkflowContext, sku: str, qty: int) -> str:
    return f"r-{sku}-{qty}"


@activity
def price(ctx: WorkflowContext, qty: int, *, unit: float = 1.0) -> float:
    return qty * unit


@workflow
async def ship(ctx: WorkflowContext, order_id: str, parcel: int) -> str:
    return f"{order_id}/{parcel}"


@workflow
async def order(ctx: WorkflowContext, sku: str, qty: int = 1) -> Receipt:
    assert_type(await reserve(ctx, "book", 1), str)
    assert_type(await reserve(ctx, sku=sku, qty=qty), str)
    assert_type(await price(ctx, qty, unit=2.5), float)
    # Edda's activity_id= for concurrent calls: accepted (unchecked), and its checked form
    both = await asyncio.gather(reserve(ctx, sku, 1, activity_id="a"), reserve.options(activity_id="b")(ctx, sku, 2))
    assert_type(both, tuple[str, str])
    handle = await start_child(ctx, ship, order_id=sku, parcel=1)
    assert_type(handle, ChildHandle[str])
    assert_type(await handle.result(), str)
    assert_type(await start_child(ctx, ship, sku, 2), ChildHandle[str])
    await start_child(ctx, ship.options(instance_id=f"{ctx.instance_id}-3", on_parent_cancel="abandon"), sku, 3)
    await start_child(ctx, ship, order_id=sku, parcel=4, on_parent_cancel="abandon")  # the first form
    return Receipt(sku=sku, qty=qty)


async def main(url: str) -> None:
    async with Client(url) as client:
        started = await client.start(order, sku="book", qty=2)
        assert_type(started, StartedInstance[Receipt])
        assert_type(await client.result(started), Receipt)
        assert_type(await client.result(started, timeout=5), Receipt)
        await client.start(order, "book")
        await client.start(order.options(instance_id="o-1", queue="orders", priority=1), sku="book")
        await client.start(order, sku="book", instance_id="o-2")  # the first form: options mixed in
        await client.start(order, sku="book", idempotency_key="k-1")
        by_name = await client.start("order", sku="book")  # a workflow by name: unchecked
        assert_type(await client.result(by_name.instance_id), Any)
    assert_type(await order.start(sku="book"), str)  # Edda's start, through the default client
    await order.start(sku="book", lock_timeout_seconds=30)
    await order.options(instance_id="o-3").start("book", 3)


async def under_test() -> None:
    async with WorkflowEnvironment() as env:
        handle = await env.start(order, sku="book", qty=2)
        assert_type(await handle.result(), Receipt)
