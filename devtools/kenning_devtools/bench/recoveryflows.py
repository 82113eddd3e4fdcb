"""The workflow the recovery section runs in real worker processes: one activity that
takes a set time, so a run's length is known when its worker is killed mid-way.

In the worker to be killed (``HOLD`` set in its environment) the activity never ends: its
runs must all be in flight at the kill. With the set time there, the first runs ended while
a loaded machine was still starting the second worker, and the section waited in vain for
the moment every lease was held.
"""

from __future__ import annotations

import asyncio
import os

from kenning import WorkflowContext, activity, workflow

HOLD = "BENCH_RECOVERY_HOLD"  # the doomed worker's variable: its runs last until it is killed


@activity
async def bench_nap(ctx: WorkflowContext, seconds: float) -> float:
    if os.environ.get(HOLD):
        await asyncio.Event().wait()  # until kill -9
    await asyncio.sleep(seconds)
    return seconds


@workflow
async def bench_recovery(ctx: WorkflowContext, seconds: float) -> float:
    return await bench_nap(ctx, seconds)
