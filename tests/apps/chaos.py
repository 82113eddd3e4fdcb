"""The chaos test's app as its NEW version has it (``tests/system/test_chaos.py``,
``scripts/chaos.py``): everything of the old version (``tests.apps.chaos_core``), and what
only this version has: an ``event_handler`` workflow for ``chaos.start``, an ``on_event``
handler for ``chaos.audit``, a debounced and a batched ``event_handler`` workflow (their
events folded into bursts and batches, issue 35), and a slow workflow for the mass kill (a worker killed with
its slots full). The chaos run's workers on this version share the inbox with one on the
old version: events of the two new types must reach a worker of this one.

The ``chaos.audit`` handler appends ``handled <type> <source> <id> <transaction>`` to the
side channel each time it runs; the invariant checker counts the runs whose transaction
committed (``tests/invariants.py::handlers_ran_once``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from kenning import Batch, Debounce, ReceivedEvent, WorkflowContext, activity, wait_timer, workflow
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
    "BATCHED",
    "DEBOUNCED",
    "EXPECTED",
    "SLOW",
    "STARTER",
    "announce",
    "app",
    "audited",
    "chaos_batched",
    "chaos_debounced",
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
DEBOUNCED = "chaos.debounced"  # a group's burst of events: one instance, the last event's data
BATCHED = "chaos.batched"  # a group's events in batches of at most 4
# What each workflow ends as when nothing is lost.
EXPECTED = {**OLD_EXPECTED, STARTER: "completed", SLOW: "completed", DEBOUNCED: "completed", BATCHED: "completed"}


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


@workflow(event_handler=True, name=DEBOUNCED, debounce=Debounce(key="group", period=0.3, max_wait=2))
async def chaos_debounced(ctx: WorkflowContext, group: str, n: int) -> int:
    await effect(ctx, 1)
    return n


@workflow(event_handler=True, name=BATCHED, batch=Batch(max_size=4, max_wait=0.5, key="group"))
async def chaos_batched(ctx: WorkflowContext, events: list[dict[str, Any]]) -> int:
    await effect(ctx, 1)
    return len(events)
