"""A workflow only one worker of the fleet registry's tests runs (then it dies)."""

from __future__ import annotations

from kenning import WorkflowContext, workflow


@workflow(name="fleet.orphan")
async def orphan(ctx: WorkflowContext, value: int) -> int:
    return value
