"""``CronTicker``: starts the instance of each cron tick of the scheduled workflows.

Every scheduler runs one. It declares its workflows' schedules (``kenning_schedules``),
then on each pass decides, for each schedule, the latest tick at or before the database
clock, in one short transaction holding the schedule's row (``storage/schedules.py``):
ticks missed while every scheduler was down collapse into one run of the latest (an
operator starts the others with ``kenning schedules backfill``). The tick is skipped if
the schedule is paused, or if its last instance has not finished and its overlap policy
is ``skip``; with ``buffer_one`` it waits, and starts once that instance finished. The
tick's idempotency key still makes each tick start once however many schedulers run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from kenning.clients.starts import start_on
from kenning.core.records import Definition
from kenning.db import Database, Executor
from kenning.schedules import tick_instance_id, tick_key
from kenning.starting import prepare_start
from kenning.storage import definitions as definitions_sql
from kenning.storage import schedules as schedules_sql
from kenning.storage.schedules import ScheduleDeclaration, ScheduleState, TickOutcome
from kenning.workflow import Workflow

_log = structlog.get_logger("kenning.scheduler")
# outcomes that leave the tick decided: the ticker does not look at it again
_DECIDED = frozenset(TickOutcome) - {TickOutcome.BUFFERED}


@dataclass
class _Window:
    latest: datetime  # the latest tick at or before the clock when last looked
    following: datetime  # the tick after it


def _declaration(wf: Workflow[Any]) -> ScheduleDeclaration:
    assert wf.schedule is not None and wf.cron is not None
    return ScheduleDeclaration(wf.name, wf.schedule, wf.cron.timezone, wf.overlap)


class CronTicker:
    def __init__(self, database: Database, workflows: list[Workflow[Any]], log: Any = None) -> None:
        self.database = database
        self.workflows = workflows
        self.log = log or _log
        self._registered = False
        self._windows: dict[str, _Window] = {}
        self._handled: dict[str, datetime] = {}  # workflow -> the tick decided
        self._buffered: dict[str, datetime] = {}  # workflow -> the tick waiting (logged once)
        self._known: set[tuple[str, str]] = set()  # definitions registered

    async def register(self) -> None:
        """Record the workflows' definitions (the first sighting of a schedule is when its
        ticks begin to count) and their schedules."""
        if self._registered or not self.workflows:
            return
        definitions = [Definition(wf.name, wf.source_hash, wf.source, wf.retention_seconds) for wf in self.workflows]
        async with self.database.connection() as conn:
            await definitions_sql.definitions_register(conn, definitions)
            await schedules_sql.schedules_declare(conn, [_declaration(wf) for wf in self.workflows])
        self._known.update((d.workflow_name, d.source_hash) for d in definitions)
        self._registered = True

    async def start_due(self, now: datetime) -> dict[str, TickOutcome]:
        """Decide the latest tick at or before ``now`` (the database clock) of each
        scheduled workflow, unless this ticker decided it already."""
        await self.register()
        outcomes: dict[str, TickOutcome] = {}
        for wf in self.workflows:
            window = self._window(wf, now)
            tick = window.latest
            if self._handled.get(wf.name) == tick:
                continue
            async with self.database.transaction() as conn:  # the schedule's row, held briefly
                outcome = await self._decide(conn, wf, tick, window.following, now)
            if outcome in _DECIDED:
                self._handled[wf.name] = tick
            outcomes[wf.name] = outcome
            self._log_outcome(wf, tick, outcome, now)
        return outcomes

    async def _decide(
        self, conn: Executor, wf: Workflow[Any], tick: datetime, following: datetime, now: datetime
    ) -> TickOutcome:
        state = await schedules_sql.schedule_lock(conn, wf.name)
        if state is None:  # its row was deleted since this scheduler declared it
            await schedules_sql.schedules_declare(conn, [_declaration(wf)])
            state = await schedules_sql.schedule_lock(conn, wf.name)
            assert state is not None
        instance_id = tick_instance_id(wf.name, tick)
        if state.last_tick is not None and state.last_tick >= tick:
            return TickOutcome.EXISTS if state.last_instance_id == instance_id else TickOutcome.DECIDED
        held = _held_back(state)
        if held is TickOutcome.BUFFERED:
            await schedules_sql.schedule_record(conn, wf.name, next_tick=following)
            return held
        if held is not None:
            await schedules_sql.schedule_record(conn, wf.name, tick=tick, next_tick=following)
            return held
        # a start like any other (kenning.starting), not before the workflow's first sighting
        start = prepare_start(
            wf, {}, instance_id=instance_id, idempotency_key=tick_key(tick), not_before=tick, own_ids=True
        )
        registered: list[tuple[str, str]] = []
        started = await start_on(conn, start, known=self._known, registered=registered)
        outcome = (
            TickOutcome.BEFORE_SCHEDULE
            if started is None
            else TickOutcome.STARTED
            if started.created
            else TickOutcome.EXISTS
        )
        last = None if started is None else started.instance_id
        await schedules_sql.schedule_record(conn, wf.name, tick=tick, instance_id=last, next_tick=following)
        self._known.update(registered)  # committed with the transaction (an error raises past this)
        return outcome

    def _log_outcome(self, wf: Workflow[Any], tick: datetime, outcome: TickOutcome, now: datetime) -> None:
        log = self.log.bind(workflow=wf.name, instance_id=tick_instance_id(wf.name, tick), tick=tick_key(tick))
        if outcome is TickOutcome.STARTED:
            self._buffered.pop(wf.name, None)
            log.info("cron.tick_started", late_ms=round((now - tick).total_seconds() * 1000, 1))
        elif outcome is TickOutcome.BUFFERED:
            if self._buffered.get(wf.name) != tick:  # once per tick, not on every pass it waits
                self._buffered[wf.name] = tick
                log.info("cron.tick_buffered", overlap=wf.overlap)
        elif outcome in (TickOutcome.PAUSED, TickOutcome.OVERLAP_SKIPPED):
            log.info("cron.tick_skipped", reason=outcome.value)
        else:
            log.debug("cron.tick_skipped", reason=outcome.value)

    def seconds_until_next(self, now: datetime) -> float | None:
        """Seconds from ``now`` until the next tick of any scheduled workflow."""
        if not self.workflows:
            return None
        return min((self._window(wf, now).following - now).total_seconds() for wf in self.workflows)

    def _window(self, wf: Workflow[Any], now: datetime) -> _Window:
        assert wf.cron is not None
        window = self._windows.get(wf.name)
        if window is None or not window.latest <= now < window.following:
            window = _Window(latest=wf.cron.latest_at_or_before(now), following=wf.cron.next_after(now))
            self._windows[wf.name] = window
        return window


def _held_back(state: ScheduleState) -> TickOutcome | None:
    """Why the schedule's row says its due tick must not start now; None: start it. The
    row's overlap policy applies, which the last scheduler to start declared."""
    if state.paused:
        return TickOutcome.PAUSED
    if not state.last_instance_running or state.overlap == "allow":
        return None
    return TickOutcome.BUFFERED if state.overlap == "buffer_one" else TickOutcome.OVERLAP_SKIPPED
