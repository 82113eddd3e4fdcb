"""``CronTicker``: starts the instance of each cron tick of the scheduled workflows.

Every scheduler runs one; the tick's idempotency key makes each tick start once however
many run. Only the latest tick at or before the database clock is considered, so ticks
missed while every scheduler was down collapse into one run of the latest.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from kenning.clients.starts import start_on
from kenning.core.records import Definition
from kenning.db import Database
from kenning.schedules import tick_instance_id, tick_key
from kenning.starting import StartedInstance, prepare_start
from kenning.storage import definitions as definitions_sql
from kenning.storage.schedules import TickOutcome
from kenning.workflow import Workflow

_log = structlog.get_logger("kenning.scheduler")


def _outcome(started: StartedInstance | None) -> TickOutcome:
    if started is None:
        return TickOutcome.BEFORE_SCHEDULE
    return TickOutcome.STARTED if started.created else TickOutcome.EXISTS


@dataclass
class _Window:
    latest: datetime  # the latest tick at or before the clock when last looked
    following: datetime  # the tick after it


class CronTicker:
    def __init__(self, database: Database, workflows: list[Workflow[Any]], log: Any = None) -> None:
        self.database = database
        self.workflows = workflows
        self.log = log or _log
        self._registered = False
        self._windows: dict[str, _Window] = {}
        self._handled: dict[str, datetime] = {}  # workflow -> the tick already tried
        self._known: set[tuple[str, str]] = set()  # definitions registered

    async def register(self) -> None:
        """Record the workflows' definitions: the first sighting of a schedule is when
        its ticks begin to count."""
        if self._registered or not self.workflows:
            return
        definitions = [Definition(wf.name, wf.source_hash, wf.source, wf.retention_seconds) for wf in self.workflows]
        async with self.database.connection() as conn:
            await definitions_sql.definitions_register(conn, definitions)
        self._known.update((d.workflow_name, d.source_hash) for d in definitions)
        self._registered = True

    async def start_due(self, now: datetime) -> dict[str, TickOutcome]:
        """Start the latest tick at or before ``now`` (the database clock) of each
        scheduled workflow, unless this ticker already tried it."""
        await self.register()
        outcomes: dict[str, TickOutcome] = {}
        for wf in self.workflows:
            tick = self._window(wf, now).latest
            if self._handled.get(wf.name) == tick:
                continue
            # a start like any other (kenning.starting), not before the workflow's first sighting
            start = prepare_start(
                wf,
                {},
                instance_id=tick_instance_id(wf.name, tick),
                idempotency_key=tick_key(tick),
                not_before=tick,
                own_ids=True,
            )
            async with self.database.connection() as conn:  # one statement, its own transaction
                started = await start_on(conn, start, known=self._known)
            outcome = _outcome(started)
            self._handled[wf.name] = tick
            outcomes[wf.name] = outcome
            log = self.log.bind(workflow=wf.name, instance_id=tick_instance_id(wf.name, tick), tick=tick_key(tick))
            if outcome is TickOutcome.STARTED:
                log.info("cron.tick_started", late_ms=round((now - tick).total_seconds() * 1000, 1))
            else:
                log.debug("cron.tick_skipped", reason=outcome.value)
        return outcomes

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
