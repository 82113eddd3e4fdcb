"""The public API used as a user would; ``mypy --strict`` checks this file in CI."""

from __future__ import annotations

from typing import assert_type

import pydantic

import kenning
from kenning import (
    Activity,
    ReceivedEvent,
    RetryPolicy,
    Workflow,
    WorkflowContext,
    activity,
    send_event_transactional,
    wait_event,
    workflow,
)


class Receipt(pydantic.BaseModel):
    total: int


@activity
async def total(ctx: WorkflowContext, amounts: list[int]) -> Receipt:
    return Receipt(total=sum(amounts))


@activity(retry_policy=RetryPolicy(max_attempts=2))
def tax(ctx: WorkflowContext, receipt: Receipt) -> float:
    return receipt.total * 0.2


@activity
async def announce(ctx: WorkflowContext, receipt: Receipt) -> str:
    event_id = await send_event_transactional(ctx, "receipt.issued", "tests/typing", receipt)
    assert_type(event_id, str)
    return event_id


@workflow(event_handler=True)
async def checkout(ctx: WorkflowContext, amounts: list[int]) -> float:
    receipt = await total(ctx, amounts)
    assert_type(receipt, Receipt)
    await announce(ctx, receipt)
    confirmation = await wait_event(ctx, "receipt.confirmed", timeout_seconds=60, match={"total": receipt.total})
    assert_type(confirmation, ReceivedEvent)
    return await tax(ctx, receipt)


def test_decorators_keep_result_types() -> None:
    # result and parameters (an assignment, as mypy's assert_type compares parameter names
    # too; tests/unit/test_typed_calls.py checks the calls they type)
    typed_total: Activity[Receipt, [list[int]]] = total
    typed_tax: Activity[float, [Receipt]] = tax
    typed_checkout: Workflow[float, [list[int]]] = checkout
    assert typed_total is total and typed_tax is tax and typed_checkout is checkout
    assert checkout.event_handler and checkout.name == "checkout"
    assert isinstance(tax, Activity) and tax.retry_policy == RetryPolicy(max_attempts=2)


def test_everything_users_import_comes_from_kenning() -> None:
    for name in kenning.__all__:
        assert hasattr(kenning, name), name
    edda_names = {
        "workflow",
        "activity",
        "WorkflowContext",
        "compensation",
        "register_compensation",
        "on_failure",
        "WorkflowHooks",
        "HooksBase",
        "RetryPolicy",
        "RetryExhaustedError",
        "TerminalError",
        "EddaApp",
    }
    assert edda_names <= set(kenning.__all__)
