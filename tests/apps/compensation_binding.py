"""Workflows for tests/system/test_compensation_binding.py: Edda-style ``@on_failure`` compensations.

Compensations append ``label instance_id`` to the side channel each time they really run.
"""

from __future__ import annotations

from kenning import (
    App,
    RetryPolicy,
    TerminalError,
    WorkflowContext,
    activity,
    compensation,
    on_failure,
    wait_timer,
    workflow,
)
from tests.sidechannel import record_execution

app = App("kenning-compensation-tests")

FAST = RetryPolicy(initial_interval=0.01, backoff_coefficient=1.0, max_interval=0.01, max_attempts=2)

# The "deploy" the operator makes before retrying: the test flips it in the worker's process.
HOLD_SERVICE_FIXED = False


def side(label: str, ctx: WorkflowContext) -> None:
    record_execution(f"{label} {ctx.instance_id}")


# ------------------------------------------------------------------ the example of the issue


@compensation
async def cancel_reservation(ctx: WorkflowContext, reservation_id: str) -> None:
    side(f"cancel_reservation:{reservation_id}", ctx)


@activity(retry_policy=FAST)
@on_failure(cancel_reservation)
async def reserve_seat(ctx: WorkflowContext, seat: str) -> dict[str, str]:
    return {"reservation_id": f"res-{seat}"}


@activity
async def charge_card(ctx: WorkflowContext, amount: int) -> None:
    raise TerminalError(f"card declined for {amount}")


@workflow
async def book_flight(ctx: WorkflowContext, seat: str, amount: int) -> str:
    await reserve_seat(ctx, seat)
    await charge_card(ctx, amount)
    return "booked"


# ------------------------------------------------------------------ a compensation that fails until a deploy


@compensation
async def release_hold(ctx: WorkflowContext, seat: str, *, hold_id: str) -> None:
    if not HOLD_SERVICE_FIXED:
        raise RuntimeError(f"hold service rejects the release of {hold_id}")
    side(f"release_hold:{seat}:{hold_id}", ctx)


@activity(retry_policy=FAST)
@on_failure(release_hold)
async def hold_seat(ctx: WorkflowContext, seat: str) -> dict[str, str]:
    return {"hold_id": f"hold-{seat}"}


@workflow
async def hold_then_charge(ctx: WorkflowContext, seat: str, amount: int) -> str:
    await reserve_seat(ctx, seat)  # undone fine, after the failing one
    await hold_seat(ctx, seat)
    await charge_card(ctx, amount)
    return "held"


@workflow
async def hold_then_wait(ctx: WorkflowContext, seat: str) -> str:
    await hold_seat(ctx, seat)
    await wait_timer(ctx, 3600)  # cancelled while it waits
    return "held"


# ------------------------------------------------------------------ a result without the key the compensation needs


@compensation
async def void_ticket(ctx: WorkflowContext, seat: str, ticket_id: str) -> None:
    side(f"void_ticket:{seat}:{ticket_id}", ctx)


@activity(retry_policy=FAST)
@on_failure(void_ticket)
async def issue_ticket(ctx: WorkflowContext, seat: str) -> dict[str, str]:
    return {"ticket": f"t-{seat}"}  # not "ticket_id": only known when it runs


@workflow
async def ticket_then_charge(ctx: WorkflowContext, seat: str, amount: int) -> str:
    await issue_ticket(ctx, seat)
    await charge_card(ctx, amount)
    return "ticketed"
