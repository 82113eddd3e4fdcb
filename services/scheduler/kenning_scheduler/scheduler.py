"""``Scheduler``: fires due timers and event timeouts, and starts cron ticks; past a
workflow timeout's deadline it requests the instance's cancellation (``deadline.fired``).

Each pass fires a batch of due timers and a batch of due event timeouts (one statement
and one commit each), starts the cron ticks that are due, then sleeps until the earliest
of: the next timer or timeout, the next cron tick, a ``NOTIFY`` on ``kenning_timers``
(a new, maybe earlier, wait), or the poll interval. Every comparison with a due time is
made on the database clock. Any number of schedulers may run: rows are claimed with
``FOR UPDATE SKIP LOCKED``, so each timer fires once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

import structlog

from kenning.app import App
from kenning.core.names import CHANNEL_TIMERS
from kenning.db import Database
from kenning.hosting.config import ServiceSettings, positive_float, positive_int, process_id, setting, settings_group
from kenning.hosting.passloop import PassLoop, listening
from kenning.hosting.presence import Presence
from kenning.hosting.retention import RetentionSettings
from kenning.observability import metrics
from kenning.observability.faults import fault_point
from kenning.schedules import scheduled_workflows
from kenning.storage import deadlines as deadlines_sql
from kenning.storage import messages as messages_sql
from kenning.storage import timers as timers_sql
from kenning.storage.timers import FiredWait
from kenning_scheduler.cron_ticks import CronTicker
from kenning_scheduler.upkeep import ObjectUpkeep, Upkeep

_log = structlog.get_logger("kenning.scheduler")
# kenning_timer_lateness_seconds's kind, by what _fire logs for a fired row
_LATENESS_KIND = {"timer.fired": "timer", "event.timed_out": "event_timeout", "message.timed_out": "receive_timeout"}

FireStatement = Callable[..., Awaitable[list[FiredWait]]]  # timer_fire_due and the like
# Something is due but every due row was locked by another transaction (another
# scheduler mid-batch, a cancel): look again soon, backing off up to this.
_BUSY_BACKOFF_MAX = 0.1


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings(ServiceSettings):
    """``kenning scheduler``'s options (``kenning.hosting.config``)."""

    PROCESS: ClassVar[str] = "scheduler"

    app: str = setting(
        "",
        help="modules defining workflows, for their cron schedules: module[:attribute][,module...] "
        "(timers and event timeouts need none)",
    )
    batch_size: int = setting(100, type=positive_int, per_process=True, help="timers fired per transaction")
    scheduler_id: str = setting("", help="name in logs (default host-pid-random)")
    # nothing stuck silently (kenning_scheduler/upkeep.py)
    stuck_check_interval: float = setting(
        5.0, type=positive_float, help="seconds between checks that every unfinished instance has a way forward"
    )
    max_repairs: int = setting(
        3, type=positive_int, help="repairs of one instance with no way forward before it is marked instead"
    )
    overdue_seconds: float = setting(
        300.0,
        type=positive_float,
        help="report instances due longer than this and still not claimed (instances.overdue), per workflow",
    )
    retention: RetentionSettings = settings_group(RetentionSettings)  # noqa: RUF009
    # the object store's upkeep (kenning.hosting.objects), with --object-store set
    object_sweep_interval: float = setting(
        3600.0, type=positive_float, help="seconds between sweeps of --object-store for objects no row references"
    )
    object_sweep_grace: float = setting(
        3600.0,
        type=positive_float,
        help="an object no row references is deleted once it is this many seconds old (a write whose row's "
        "commit failed); keep it well above the longest commit",
    )


class Scheduler:
    def __init__(self, database: Database, app: App | None = None, settings: SchedulerSettings | None = None) -> None:
        self.database = database
        self.settings = settings or SchedulerSettings()
        self.scheduler_id = self.settings.scheduler_id or process_id()
        self.log = _log.bind(scheduler_id=self.scheduler_id)
        workflows = scheduled_workflows(app.registry) if app is not None else []
        self.cron = CronTicker(database, workflows, self.log)
        self._busy_backoff = 0.0
        self.upkeep = Upkeep(
            database,
            stuck_check_interval=self.settings.stuck_check_interval,
            max_repairs=self.settings.max_repairs,
            overdue_seconds=self.settings.overdue_seconds,
            retention=self.settings.retention.policy(),
            retention_interval=self.settings.retention.retention_interval,
            log=self.log,
            objects=ObjectUpkeep.configured(self.settings, self.log),
        )
        self.loop = PassLoop(
            self.run_once,
            log=self.log,
            failed_event="scheduler.pass_failed",
            retry_seconds=min(self.settings.poll_interval, 1.0),
        )
        # its entry in the fleet's registry, whose long-stale entries it deletes
        self.presence = Presence(
            database,
            kind="scheduler",
            process_id=self.scheduler_id,
            interval=self.settings.presence_interval,
            commit_stall_seconds=self.settings.commit_stall_seconds,
            details=lambda: {"app": self.settings.app, "schedules": sorted(wf.name for wf in self.cron.workflows)},
            forget_stale=True,
        )

    def stop(self) -> None:
        """Finish the current pass and return from ``run`` (SIGTERM)."""
        self.loop.stop()

    def _notify(self, channel: str) -> None:
        self.loop.wake()

    async def run(self) -> None:
        try:
            async with (
                self.presence.running(),
                listening(
                    self.database.listen_url,
                    [CHANNEL_TIMERS],
                    self._notify,
                    enabled=self.settings.listen,
                    parameters=self.database.client_parameters,
                ),
            ):
                self.log.info(
                    "scheduler.started",
                    schedules={wf.name: wf.schedule for wf in self.cron.workflows},
                    batch_size=self.settings.batch_size,
                    listen=self.settings.listen,
                )
                await self.loop.run()
        finally:
            self.log.info("scheduler.stopped")

    async def run_once(self, now: datetime | None = None) -> float:
        """One pass; returns how long to sleep before the next. ``now`` moves the clock
        (tests); by default the database clock is used."""
        timers = await self._fire(timers_sql.timer_fire_due, ("timer.fired", "timer.discarded"), now)
        timeouts = await self._fire(
            timers_sql.subscription_timeout_fire_due, ("event.timed_out", "event.timeout_discarded"), now
        )
        receives = await self._fire(
            messages_sql.message_wait_timeout_fire_due, ("message.timed_out", "message.timeout_discarded"), now
        )
        deadlines = await self._fire_deadlines(now)
        if timers or timeouts or receives:
            self.log.info("scheduler.fired", timers=timers, timeouts=timeouts, receive_timeouts=receives)
            fault_point("timer.after_fire")
        if self.settings.batch_size in (timers, timeouts, receives, deadlines):
            return 0.0  # a full batch: more may be due
        async with self.database.connection() as conn:
            next_due = await timers_sql.timer_next_due(conn, now)
            next_deadline = await deadlines_sql.deadline_next_due(conn, now)
        if self.cron.workflows:
            await self.cron.start_due(next_due.now)
        waits = [self.settings.poll_interval, await self.upkeep.run_due()]
        if next_due.seconds is not None:
            waits.append(self._after_due(next_due.seconds, fired=timers + timeouts + receives > 0))
        if next_deadline is not None:
            # overdue yet not fired: its row is locked (a worker's write): look again soon
            waits.append(next_deadline if next_deadline > 0 else _BUSY_BACKOFF_MAX)
        cron_wait = self.cron.seconds_until_next(next_due.now)
        if cron_wait is not None:
            waits.append(cron_wait)
        return max(min(waits), 0.0)

    async def _fire_deadlines(self, now: datetime | None) -> int:
        """Request the cancellation of instances past their workflow timeout (one
        statement); their workers end them failed with ``WorkflowTimeoutError``."""
        async with self.database.connection() as conn:
            fired = await deadlines_sql.deadline_fire_due(conn, limit=self.settings.batch_size, now=now)
        for deadline in fired:
            self.log.info(
                "deadline.fired",
                instance_id=deadline.instance_id,
                workflow=deadline.workflow_name,
                lateness=round(deadline.lateness_seconds, 3),
            )
        return len(fired)

    def _after_due(self, seconds: float, *, fired: bool) -> float:
        if seconds > 0 or fired:
            self._busy_backoff = 0.0
            return max(seconds, 0.0)
        # Due, yet nothing fired: the rows are locked elsewhere. Retry soon, backing off.
        self._busy_backoff = min(max(self._busy_backoff * 2, 0.005), _BUSY_BACKOFF_MAX, self.settings.poll_interval)
        return self._busy_backoff

    async def _fire(self, statement: FireStatement, events: tuple[str, str], now: datetime | None) -> int:
        """Run one fire statement (its own transaction, one round trip); log each row
        (per-wait events are debug, as per-step events are in the worker)."""
        async with self.database.connection() as conn:
            fired = await statement(conn, limit=self.settings.batch_size, now=now)
        fired_event, discarded_event = events
        lateness = metrics.TIMER_LATENESS.labels(_LATENESS_KIND[fired_event])
        for item in fired:
            log = self.log.bind(instance_id=item.instance_id, workflow=item.workflow_name)
            if item.fired_at is None:
                # The instance no longer waited for it (an orphan row): deleted, no history.
                log.info(discarded_event, step=item.step_id)
                continue
            late = (item.fired_at - item.due_at).total_seconds()
            lateness.observe(max(late, 0.0))
            late_ms = round(late * 1000, 1)
            log.debug(fired_event, step=item.step_id, due_at=item.due_at.isoformat(), late_ms=late_ms)
        return len(fired)
