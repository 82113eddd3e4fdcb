"""Workflows for the fleet registry's tests (``kenning workers list``, ``kenning why``)."""

from __future__ import annotations

from kenning import WorkflowContext, activity, workflow


@activity
async def fleet_double(ctx: WorkflowContext, value: int) -> int:
    return value * 2


@workflow(name="fleet.double")
async def double(ctx: WorkflowContext, value: int) -> int:
    return await fleet_double(ctx, value)
