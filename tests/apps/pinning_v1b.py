"""Version 1 of ``tests.apps.pinning_v1`` with one workflow changed: ``auto_order``
records other labels, every other workflow's source is the same, character for character.
A worker's version covers all its workflows (docs/operations.md#version-pinning), so this
worker's is another, and ``pinned_order``'s pinned instances do not move to it."""

from __future__ import annotations

from kenning import App, WorkflowContext, activity, receive, start_child, workflow
from tests.sidechannel import record_execution

app = App("kenning-pinning-tests")


@activity
async def noted(ctx: WorkflowContext, label: str) -> str:
    record_execution(f"{label} {ctx.instance_id}")
    return label


@workflow(versioning="pinned")
async def pinned_order(ctx: WorkflowContext) -> str:
    """Its first step, then a wait for the message ``go``, then its second step."""
    await noted(ctx, "v1 first")
    await receive(ctx, "go")
    return await noted(ctx, "v1 second")


@workflow
async def auto_order(ctx: WorkflowContext) -> str:
    await noted(ctx, "v1b first")
    await receive(ctx, "go")
    return await noted(ctx, "v1b second")


@workflow(versioning="pinned")
async def pinned_child(ctx: WorkflowContext) -> str:
    return await noted(ctx, "v1 child")


@workflow(versioning="pinned")
async def pinned_parent(ctx: WorkflowContext) -> str:
    child = await start_child(ctx, pinned_child)
    return f"v1 parent of {await child.result()}"
