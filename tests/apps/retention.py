"""Workflows the retention tests run: one keeps its finished instances a second, one
names no retention (the scheduler's default applies)."""

from __future__ import annotations

from datetime import timedelta

from kenning import App, WorkflowContext, activity, workflow

app = App("kenning-retention-tests")


@activity
async def note(ctx: WorkflowContext, label: str) -> str:
    return label


@workflow(retention=timedelta(seconds=1))
async def brief(ctx: WorkflowContext) -> str:
    return await note(ctx, "brief")


@workflow
async def lasting(ctx: WorkflowContext) -> str:
    return await note(ctx, "lasting")
