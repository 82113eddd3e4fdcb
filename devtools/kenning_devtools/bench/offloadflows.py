"""The workflow of ``kenning bench``'s offload section: a large step result stored, then
loaded back by the replay after a timer (the worker reads it from the object store)."""

from __future__ import annotations

from kenning import App, WorkflowContext, activity, wait_timer, workflow

app = App("kenning-bench-offload")


@activity
async def produce(ctx: WorkflowContext, size: int) -> str:
    return "x" * size


@activity
async def measure(ctx: WorkflowContext, text: str) -> int:
    return len(text)


@workflow
async def offload_roundtrip(ctx: WorkflowContext, size: int) -> int:
    text = await produce(ctx, size)  # stored: above --offload-bytes, written to the object store
    await wait_timer(ctx, 0.01)  # the instance suspends; its replay loads the value back
    return await measure(ctx, text)
