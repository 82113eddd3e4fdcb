"""Calls a type checker must refuse: every line whose comment starts with ``E:`` must be reported by mypy --strict
and by pyright (strict), and no other (``tests/unit/test_typed_calls.py``). mypy's ``tests``
run leaves this file out (``exclude`` in pyproject.toml); it is never imported."""

from __future__ import annotations

import pydantic

from kenning import Client, WorkflowContext, activity, start_child, workflow
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
    await reserve(ctx, 1, "book")  # E: arguments swapped
    await reserve(ctx, "book")  # E: qty missing
    await reserve(ctx, sku="book", qty=1, colour="red")  # E: no such parameter
    await reserve("book", 1)  # E: no context
    await reserve.options(activity_id="a")(ctx, "book", "1")  # E: qty is an int
    count: int = await reserve(ctx, "book", 1)  # E: it returns a str
    await price(ctx, "2")  # E: a sync activity's parameters too
    await price(ctx, 2, units=2.0)  # E: no such keyword
    await start_child(ctx, ship, order_id=sku, parcel="1")  # E: parcel is an int
    await start_child(ctx, ship, order_id=sku)  # E: parcel missing
    handle = await start_child(ctx, ship.options(instance_id="c-1"), order_id=sku, parcle=1)  # E: misspelt
    parcel: int = await (await start_child(ctx, ship, sku, 1)).result()  # E: the child returns a str
    return Receipt(sku=sku, qty=count + parcel + len(str(handle)))


async def main(url: str) -> None:
    async with Client(url) as client:
        await client.start(order, skus="book")  # E: a wrong keyword
        await client.start(order, sku=1)  # E: a wrong type
        await client.start(order)  # E: sku missing
        await client.start(order, "book", 1, 2)  # E: one argument too many
        await client.start(order.options(instance_id="o-1"), sku=2)  # E: options given apart, still checked
        await client.start(order.options(instance_ids="o-1"), sku="book")  # E: no such option
        started = await client.start(order, sku="book")
        receipt: str = await client.result(started)  # E: the result is a Receipt
    await order.start(skus="book")  # E: Edda's start, a wrong keyword
    await order.start(sku=["book"])  # E: a wrong type
    await order.options(queue="q").start(qty=1)  # E: sku missing
    print(receipt)


async def under_test() -> None:
    async with WorkflowEnvironment() as env:
        await env.start(order, skus="book")  # E: kenning.testing's start is checked too
        handle = await env.start(order, sku="book")
        result: str = await handle.result()  # E: the result is a Receipt
        print(result)
