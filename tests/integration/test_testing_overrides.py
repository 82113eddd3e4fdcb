"""``env.override`` keeps the step the workflow declared (issue 38, item 2): a faked
activity's ``@on_failure`` compensation still runs, its retry policy and timeouts still
apply, and its result is what the real activity's return type makes of it, on the first
run and on a replay alike, on both ``kenning.testing`` backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel

from kenning import (
    App,
    RetryPolicy,
    TerminalError,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    wait_event,
    workflow,
)
from kenning.core.names import ACTIVITY_COMPLETED, COMPENSATION_EXECUTED
from kenning.examples import orders
from kenning.registry import qualified_name
from kenning.testing import WorkflowEnvironment
from tests.logguard import expect_log

app = App("kenning-override-tests")
RELEASED: list[dict[str, Any]] = []  # what the real compensation below was called with
RELEASE = qualified_name(orders.release_inventory)  # a compensation's step name


class Receipt(BaseModel):
    amount: int
    reference: str


@compensation
async def refund(ctx: WorkflowContext, amount: int, *, reference: str) -> None:
    RELEASED.append({"amount": amount, "reference": reference})


@activity(retry_policy=RetryPolicy(initial_interval=30, max_attempts=2))
async def charge(ctx: WorkflowContext, amount: int) -> Receipt:
    raise AssertionError("the real charge never runs in these tests")


@activity
@on_failure(refund)
async def hold(ctx: WorkflowContext, amount: int) -> dict[str, str]:
    raise AssertionError("the real hold never runs in these tests")


@workflow(name="override.checkout")
async def checkout(ctx: WorkflowContext, amount: int) -> list[str]:
    """What the workflow sees of the receipt before and after a wait (a replay on PostgreSQL)."""
    receipt = await charge(ctx, amount)
    seen = [type(receipt).__name__]
    await wait_event(ctx, "override.go")
    seen.append(type(receipt).__name__)
    return seen


@workflow(name="override.held")
async def held(ctx: WorkflowContext, amount: int) -> None:
    await hold(ctx, amount)
    await wait_event(ctx, "override.go")
    raise TerminalError("refused after the hold")


@pytest.fixture(params=["memory", "postgresql"])
async def env(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[WorkflowEnvironment]:
    url = database_url if request.param == "postgresql" else None
    async with WorkflowEnvironment(app, database_url=url) as environment:
        yield environment


@pytest.fixture
async def orders_env(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[WorkflowEnvironment]:
    url = database_url if getattr(request, "param", "memory") == "postgresql" else None
    async with WorkflowEnvironment(orders.app, database_url=url) as environment:
        yield environment


def _order(order_id: str) -> orders.OrderCreated:
    return orders.OrderCreated.model_validate(
        {"order_id": order_id, "items": [{"sku": "book", "qty": 1}], "amount": 42}
    )


@pytest.mark.parametrize("orders_env", ["memory", "postgresql"], indirect=True)
async def test_a_faked_activity_of_the_order_saga_is_still_compensated(orders_env: WorkflowEnvironment) -> None:
    env = orders_env

    async def fake_reserve(ctx, order_id, items):  # type: ignore[no-untyped-def]  # a reader's quick fake
        return {"reservation_id": f"fake-{order_id}"}

    env.override(orders.reserve_inventory, fake_reserve)
    cancelled = await env.start(orders.order_saga, order=_order("o-1"))
    await cancelled.cancel()
    assert await cancelled.status() == "cancelled"
    history = await cancelled.history()
    undone = [entry for entry in history if entry.kind == COMPENSATION_EXECUTED]
    assert [entry.step_name for entry in undone] == [RELEASE], [e.kind for e in history]

    expect_log("instance.failed")
    declined = await env.start(orders.order_saga, order=_order("o-2"))
    await env.send_event("payment.completed", {"order_id": "o-2", "status": "declined"})
    assert await declined.status() == "failed"
    assert [e.step_name for e in await declined.history() if e.kind == COMPENSATION_EXECUTED] == [RELEASE]


async def test_a_fake_without_annotations_returns_the_declared_type_first_and_on_replay(
    env: WorkflowEnvironment,
) -> None:
    async def fake_charge(ctx, amount):  # type: ignore[no-untyped-def]
        return {"amount": amount, "reference": f"ref-{amount}"}

    env.override(charge, fake_charge)
    handle = await env.start(checkout, amount=7)
    await env.send_event("override.go", {})
    assert await handle.result() == ["Receipt", "Receipt"]
    completed = [e for e in await handle.history() if e.kind == ACTIVITY_COMPLETED]
    assert [e.step_name for e in completed] == ["charge"]


async def test_a_faked_activity_keeps_its_compensation_bound_by_the_real_parameters(env: WorkflowEnvironment) -> None:
    RELEASED.clear()
    expect_log("instance.failed")

    async def fake_hold(ctx: WorkflowContext, *args: Any) -> dict[str, str]:  # other parameter names than hold's
        return {"reference": f"fake-{args[0]}"}

    env.override(hold, fake_hold)
    handle = await env.start(held, amount=3)
    await env.send_event("override.go", {})
    assert await handle.status() == "failed"
    # bound by hold's parameter names (amount), with the fake's result (reference)
    assert RELEASED == [{"amount": 3, "reference": "fake-3"}]


async def test_a_faked_activity_keeps_its_retry_policy_unless_the_fake_declares_one(
    env: WorkflowEnvironment,
) -> None:
    attempts: list[int] = []

    async def failing_charge(ctx: WorkflowContext, amount: int) -> Receipt:
        attempts.append(amount)
        if len(attempts) < 2:
            raise ConnectionError("down")
        return Receipt(amount=amount, reference="second")

    env.override(charge, failing_charge)
    started = env.now()
    handle = await env.start(checkout, amount=5)
    await env.sleep(31)  # charge's back-off: its second attempt runs, then the workflow waits
    await env.send_event("override.go", {})
    assert await handle.result() == ["Receipt", "Receipt"]
    assert len(attempts) == 2
    assert (env.now() - started).total_seconds() >= 30  # charge's back-off, skipped

    attempts.clear()
    expect_log("instance.failed")
    env.override(charge, activity(retry_policy=RetryPolicy(max_attempts=1))(failing_charge))
    once = await env.start(checkout, amount=6)
    assert await once.status() == "failed"
    assert len(attempts) == 1  # the fake's own policy: no retry


async def test_a_faked_compensation_is_called_as_the_real_one_would_be(env: WorkflowEnvironment) -> None:
    RELEASED.clear()
    faked: list[dict[str, Any]] = []
    expect_log("instance.failed")

    async def fake_hold(ctx: WorkflowContext, amount: int) -> dict[str, str]:
        return {"reference": "held"}

    async def fake_refund(ctx, **named):  # type: ignore[no-untyped-def]  # takes what the real one takes
        faked.append(named)

    env.override(hold, fake_hold)
    env.override(refund, fake_refund)
    handle = await env.start(held, amount=4)
    await env.send_event("override.go", {})
    assert await handle.status() == "failed"
    assert faked == [{"amount": 4, "reference": "held"}]  # the real refund's parameters, no more
    assert RELEASED == []
