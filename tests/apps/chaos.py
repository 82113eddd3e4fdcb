"""The chaos test's app as its NEW version has it (``tests/system/test_chaos.py``,
``scripts/chaos.py``): everything of the old version (``tests.apps.chaos_core``), and what
only this version has: an ``event_handler`` workflow for ``chaos.start``, an ``on_event``
handler for ``chaos.audit``, and a slow workflow for the mass kill (a worker killed with
its slots full). The chaos run's workers on this version share the inbox with one on the
old version: events of the two new types must reach a worker of this one.

The ``chaos.audit`` handler appends ``handled <type> <source> <id> <transaction>`` to the
side channel each time it runs; the invariant checker counts the runs whose transaction
committed (``tests/invariants.py::handlers_ran_once``).
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from kenning import ReceivedEvent, WorkflowContext, activity, wait_timer, workflow
from tests.apps import chaos_keys  # noqa: F401  (registers the keyed workflows: new version only)
from tests.apps.chaos_core import (
    ANNOUNCED,
    ANSWER,
    QUICK,
    announce,
    app,
    chaos_event,
    chaos_saga,
    chaos_steps,
    chaos_timer,
    effect,
    flaky,
    release,
    reserve,
)
from tests.apps.chaos_core import EXPECTED as OLD_EXPECTED
from tests.sidechannel import record_execution

__all__ = [
    "ANNOUNCED",
    "ANSWER",
    "AUDIT",
    "EXPECTED",
    "SLOW",
    "STARTER",
    "announce",
    "app",
    "audited",
    "chaos_event",
    "chaos_saga",
    "chaos_slow",
    "chaos_started",
    "chaos_steps",
    "chaos_timer",
    "effect",
    "flaky",
    "release",
    "reserve",
    "slow",
]

STARTER = "chaos.start"
AUDIT = "chaos.audit"
SLOW = "chaos_slow"
# What each workflow ends as when nothing is lost.
EXPECTED = {**OLD_EXPECTED, STARTER: "completed", SLOW: "completed"}


@workflow(event_handler=True, name=STARTER)
async def chaos_started(ctx: WorkflowContext, key: str) -> str:
    await effect(ctx, 1)
    await wait_timer(ctx, 0.3)
    await effect(ctx, 2)
    return key


@app.on_event(AUDIT)
async def audited(event: ReceivedEvent, session: AsyncSession) -> None:
    """Runs in the transaction that marks the event processed. A run cut short (a kill, a
    database restart) rolls back and runs again, so the line names its transaction: the
    checker counts only the runs whose transaction committed."""
    xact = (await session.execute(text("SELECT CAST(pg_current_xact_id() AS text)"))).scalar_one()
    record_execution(f"handled {event.type} {event.source} {event.id} {xact}")


@activity(retry_policy=QUICK)
async def slow(ctx: WorkflowContext, seconds: float) -> float:
    """Holds its instance's lease for ``seconds``: a burst of these fills a worker's slots."""
    record_execution(f"step {ctx.instance_id} slow:1")
    await asyncio.sleep(seconds)
    return seconds


@workflow(name=SLOW)
async def chaos_slow(ctx: WorkflowContext, seconds: float) -> str:
    await effect(ctx, 1)
    await slow(ctx, seconds)
    return "done"
