"""The workflows the benchmark runs in real worker processes."""

from __future__ import annotations

from kenning import WorkflowContext, activity, continue_as_new, receive, workflow


@activity
async def bump(ctx: WorkflowContext, value: int) -> int:
    return value + 1


@workflow
async def bench_three(ctx: WorkflowContext, value: int) -> int:
    value = await bump(ctx, value)
    value = await bump(ctx, value)
    return await bump(ctx, value)


@workflow
async def bench_long(ctx: WorkflowContext, steps: int) -> int:
    value = 0
    for _ in range(steps):
        value = await bump(ctx, value)
    return value


@workflow
async def bench_message_loop(ctx: WorkflowContext, every: int = 0, done: int = 0) -> int:
    """Receive messages, a recorded step each, until "stop"; with ``every`` > 0, continue
    as new after each ``every`` messages (``done`` carried along). The resume section
    (kenning_devtools/bench/resume.py) runs it both ways."""
    while True:
        message = await receive(ctx, "work")
        if message.data == "stop":
            return done
        done += 1
        if every and done % every == 0:
            await continue_as_new(ctx, every=every, done=done)
