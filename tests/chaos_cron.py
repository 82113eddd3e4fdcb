"""The chaos run's cron phase (issue 33): a scheduler stopped inside a tick's transaction.

The run's scheduler (which takes the run's random kills and stops) decides the schedules
of ``tests.apps.chaos_cron``, every second and every two seconds. A few seconds into the
fault window this phase starts a second scheduler with the same schedules, never killed,
armed to stall inside a tick's transaction (fault point ``cron.tick_decided``); once it
stalls there, it is SIGSTOPped for ``STOP_SECONDS``, longer than the bound on a held
schedule row (``kenning_scheduler.cron_ticks.HOLD_SECONDS``), then continued. At the end of
the fault window the schedules are paused, so the settling run starts no more.

Some scheduler process runs throughout (the second one is only ever stopped), so every
tick from the second scheduler's start to the pause, less a margin for a decision under
way, must have been started exactly once: ``tests/invariants.py::cron_ticks_started_once``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psutil

from kenning_scheduler.cron_ticks import HOLD_SECONDS
from tests.apps import chaos_cron
from tests.invariants import Sql, cron_ticks_started_once
from tests.support import ProcessPool

CRON_APP = "tests.apps.chaos_cron"
SCHEDULER_ARGS = ["scheduler", "--no-migrate", "--poll-interval", "0.5", "--app", CRON_APP]
START_AT = 3.0  # seconds into the fault window: the second scheduler starts
STOP_SECONDS = HOLD_SECONDS + 2.0  # the held row is freed by its bound, not by the SIGCONT
# The second scheduler's 6th tick decision: a few seconds after it started. It stalls there
# long enough for this phase to see fault.fired in its log and SIGSTOP it mid-transaction.
FAULT = "cron.tick_decided=stall:4@6"
SETTLE_MARGIN = timedelta(seconds=10)  # ticks this close to the pause may be decided after it

Query = Callable[[str], Awaitable[list[tuple[Any, ...]]]]


@dataclass
class CronFigures:
    started_at: datetime | None = None  # database clock when the second scheduler was started
    paused_at: datetime | None = None  # database clock of the schedules' pause
    stopped_inside_tick: bool = False  # SIGSTOPped while stalled in a tick's transaction
    stop_seconds: float = 0.0
    ticks_due: int = 0  # ticks due while a scheduler ran, each required started once
    problems: list[str] = field(default_factory=list)


class CronPhase:
    def __init__(self, pool: ProcessPool, url: str, query: Query, say: Callable[[str], None]) -> None:
        self.pool = pool
        self.url = url
        self.query = query
        self.say = say
        self.figures = CronFigures()
        self.proc: psutil.Popen | None = None

    async def _db_now(self) -> datetime:
        """The database clock, through a restart of PostgreSQL if one is under way."""
        while True:
            rows = await self.query("SELECT now()")
            if rows:
                return rows[0][0]  # type: ignore[no-any-return]
            await asyncio.sleep(0.2)

    async def run(self, t0: float, fault_seconds: float) -> None:
        await asyncio.sleep(max(0.0, t0 + START_AT - time.monotonic()))
        self.figures.started_at = await self._db_now()
        self.proc = self.pool.spawn(
            SCHEDULER_ARGS, env={"KENNING_DATABASE_URL": self.url, "KENNING_FAULTS": FAULT}, name="scheduler-cron"
        )
        self.say("cron: second scheduler started")
        try:
            await self._stop_inside_a_tick()
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.proc.resume()
        await asyncio.sleep(max(0.0, t0 + fault_seconds - time.monotonic()))
        names = [wf.name for wf in chaos_cron.SCHEDULED]
        while True:  # waits for a held row at most its bound; PostgreSQL may be restarting
            rows = await self.query(
                "UPDATE kenning_schedules SET paused = true, paused_reason = 'chaos: settling' "
                f"WHERE workflow_name IN ({', '.join(repr(n) for n in names)}) RETURNING now()"
            )
            if len(rows) == len(names):
                self.figures.paused_at = rows[0][0]
                break
            await asyncio.sleep(0.2)
        self.say("cron: schedules paused")

    async def _stop_inside_a_tick(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            if '"fault.fired"' in self.pool.log_of(self.proc):
                self.proc.suspend()  # SIGSTOP: its transaction holds a schedule's row
                self.figures.stopped_inside_tick = '"fault.resumed"' not in self.pool.log_of(self.proc)
                self.say(f"cron: second scheduler SIGSTOPped inside a tick for {STOP_SECONDS} s")
                began = time.monotonic()
                await asyncio.sleep(STOP_SECONDS)
                self.proc.resume()
                self.figures.stop_seconds = round(time.monotonic() - began, 2)
                self.say("cron: second scheduler continued")
                return
            if self.proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        self.figures.problems.append("the second scheduler never stalled inside a tick's transaction")

    def measure(self, sql: Sql) -> CronFigures:
        """Every tick due from the second scheduler's start to the pause started once."""
        f = self.figures
        if self.proc is not None and self.proc.returncode not in (None, 0, -15):
            f.problems.append(f"the second scheduler exited on its own ({self.proc.returncode})")
        if not f.stopped_inside_tick and not f.problems:
            f.problems.append("the second scheduler was not stopped inside a tick's transaction")
        if f.started_at is None or f.paused_at is None:
            f.problems.append("the cron phase did not run to its end")
            return f
        try:
            f.ticks_due = cron_ticks_started_once(sql, chaos_cron.SCHEDULED, f.started_at, f.paused_at - SETTLE_MARGIN)
        except AssertionError as error:
            f.problems.append(f"cron ticks: {error}")
        return f
