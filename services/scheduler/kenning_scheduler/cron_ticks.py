"""``CronTicker``: starts the instance of each cron tick of the scheduled workflows.

Every scheduler runs one. It declares its workflows' schedules (``kenning_schedules``),
then on each pass decides, for each schedule, the ticks due at or before the database
clock that no scheduler decided yet, in one short transaction holding the schedule's row
(``storage/schedules.py``). Every tick due since this scheduler began is started, late if
need be; the ticks of a time when no scheduler that still runs was there collapse into one
run of the latest of them (an operator starts the others with ``kenning schedules
backfill``). The ticks are skipped if the schedule is paused; while its last instance has
not finished, overlap ``skip`` skips them and ``buffer_one`` holds the latest, started once
that instance finished; either way a catch-up of several ticks starts one run, the latest
tick's. The tick's idempotency key makes each tick start once however many schedulers run.

No scheduler waits for another: a schedule whose row is locked elsewhere (a scheduler
stopped inside its transaction, an operator's session) is skipped and tried again within
``RETRY_SECONDS``, and the tick transaction bounds its lock waits (``LOCK_WAIT_SECONDS``)
and the time its client may stay silent inside it (``HOLD_SECONDS``: then the server ends
the session, so a stopped scheduler holds one schedule back that long at most). A
transaction cut so is given up with ``cron.tick_deferred``; its ticks are decided later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog

from kenning.client.starts import start_on
from kenning.core.records import Definition
from kenning.db import Database, Executor
from kenning.db.errors import is_unavailable, sqlstate
from kenning.observability.faults import fault_point
from kenning.schedules import tick_instance_id, tick_key, ticks_between
from kenning.starting import prepare_start
from kenning.storage import definitions as definitions_sql
from kenning.storage import schedules as schedules_sql
from kenning.storage.schedules import ScheduleDeclaration, ScheduleState, TickOutcome
from kenning.workflow import Workflow

_log = structlog.get_logger("kenning.scheduler")
# outcomes that leave the tick decided: the ticker does not look at it again
_DECIDED = frozenset(TickOutcome) - {TickOutcome.BUFFERED, TickOutcome.LOCKED}
LOCK_WAIT_SECONDS = 1.0  # longest wait of a tick's transaction for any lock
HOLD_SECONDS = 5.0  # longest a scheduler's silent client holds a schedule's row
RETRY_SECONDS = 0.2  # a schedule left undecided (row held elsewhere, wait cut) is tried again this soon
CATCH_UP_BATCH = 100  # ticks decided per transaction; more are decided on the next pass, at once
# A schedule's ticks up to this long after its last decision count as watched: a scheduler
# then running (stopped, or the database away) would have started them, so one coming
# later starts each; ticks further out and before its own first pass collapse into one.
WATCH_SECONDS = 60.0
# the bounds above, as the server reports them: lock_timeout, idle_in_transaction_session_timeout
_BOUND_SQLSTATES = frozenset({"55P03", "25P03"})


@dataclass
class _Window:
    latest: datetime  # the latest tick at or before the clock when last looked
    following: datetime  # the tick after it


@dataclass
class _Decision:
    """A transaction's decisions: each tick it decided, oldest first, and what of it."""

    ticks: list[tuple[datetime, TickOutcome]] = field(default_factory=list)
    complete: bool = True  # every tick due was decided (False: a batch was full)
    # ranges of ticks skipped together, logged once each: (reason, first, last)
    skipped: list[tuple[str, datetime, datetime]] = field(default_factory=list)

    @property
    def outcome(self) -> TickOutcome:
        return self.ticks[-1][1]


def _declaration(wf: Workflow[Any]) -> ScheduleDeclaration:
    assert wf.schedule is not None and wf.cron is not None
    return ScheduleDeclaration(wf.name, wf.schedule, wf.cron.timezone, wf.overlap)


class CronTicker:
    def __init__(self, database: Database, workflows: list[Workflow[Any]], log: Any = None) -> None:
        self.database = database
        self.workflows = workflows
        self.log = log or _log
        self._registered = False
        self._since: datetime | None = None  # the database clock at this ticker's first pass
        self._windows: dict[str, _Window] = {}
        self._handled: dict[str, datetime] = {}  # workflow -> the tick decided
        self._buffered: dict[str, datetime] = {}  # workflow -> the tick waiting (logged once)
        self._pending: set[str] = set()  # workflows with ticks due left undecided: look again soon
        self._known: set[tuple[str, str]] = set()  # definitions registered

    async def register(self) -> None:
        """Record the workflows' definitions (the first sighting of a schedule is when its
        ticks begin to count) and their schedules. A schedule row held elsewhere leaves
        the declaration for the next pass (``cron.declare_deferred``): the ticks of the
        others are decided meanwhile."""
        if self._registered or not self.workflows:
            return
        definitions = [Definition(wf.name, wf.source_hash, wf.source, wf.retention_seconds) for wf in self.workflows]
        try:
            async with self.database.transaction() as conn:
                await schedules_sql.schedule_bound_transaction(
                    conn, lock_seconds=LOCK_WAIT_SECONDS, idle_seconds=HOLD_SECONDS
                )
                await definitions_sql.definitions_register(conn, definitions)
                await schedules_sql.schedules_declare(conn, [_declaration(wf) for wf in self.workflows])
        except Exception as error:
            if sqlstate(error) not in _BOUND_SQLSTATES:
                raise
            self.log.warning("cron.declare_deferred", error=repr(error))
            return
        self._known.update((d.workflow_name, d.source_hash) for d in definitions)
        self._registered = True

    async def start_due(self, now: datetime) -> dict[str, TickOutcome]:
        """Decide the ticks at or before ``now`` (the database clock) of each scheduled
        workflow that no scheduler decided yet; returns each workflow's latest outcome."""
        await self.register()
        if self._since is None:
            self._since = now  # every tick after this falls while this scheduler runs
        outcomes: dict[str, TickOutcome] = {}
        for wf in self.workflows:
            window = self._window(wf, now)
            if self._handled.get(wf.name) == window.latest:
                continue
            decision = await self._decide_in_transaction(wf, window, now)
            if decision is None:
                self._pending.add(wf.name)
                continue
            if decision.complete and decision.outcome in _DECIDED:
                self._handled[wf.name] = window.latest
            if decision.complete and decision.outcome is not TickOutcome.LOCKED:
                self._pending.discard(wf.name)
            else:
                self._pending.add(wf.name)
            outcomes[wf.name] = decision.outcome
            for reason, first, last in decision.skipped:
                # ticks never started, said once per range: none dropped in silence
                self.log.info(
                    "cron.ticks_skipped", workflow=wf.name, reason=reason, first=tick_key(first), last=tick_key(last)
                )
            for tick, outcome in decision.ticks:
                self._log_outcome(wf, tick, outcome, now)
        return outcomes

    async def _decide_in_transaction(self, wf: Workflow[Any], window: _Window, now: datetime) -> _Decision | None:
        """Decide the schedule's due ticks in one transaction; None if the transaction
        was cut by one of its bounds or lost its connection (decided on a later pass)."""
        try:
            async with self.database.transaction() as conn:  # the schedule's row, held briefly
                await schedules_sql.schedule_bound_transaction(
                    conn, lock_seconds=LOCK_WAIT_SECONDS, idle_seconds=HOLD_SECONDS
                )
                decision = await self._decide(conn, wf, window, now)
                if decision.outcome is not TickOutcome.LOCKED:
                    fault_point("cron.tick_decided")  # the row held, the decision not yet committed
        except Exception as error:
            if sqlstate(error) not in _BOUND_SQLSTATES and not is_unavailable(error):
                raise
            # nothing of it committed: the ticks stay undecided, for whichever scheduler comes next
            self.log.warning("cron.tick_deferred", workflow=wf.name, tick=tick_key(window.latest), error=repr(error))
            return None
        return decision

    async def _decide(self, conn: Executor, wf: Workflow[Any], window: _Window, now: datetime) -> _Decision:
        state = await schedules_sql.schedule_lock(conn, wf.name)
        if state is None:
            if await schedules_sql.schedule_exists(conn, wf.name):
                return _Decision([(window.latest, TickOutcome.LOCKED)])
            # its row was deleted since this scheduler declared it
            await schedules_sql.schedules_declare(conn, [_declaration(wf)])
            state = await schedules_sql.schedule_lock(conn, wf.name)
            if state is None:  # declared meanwhile by another scheduler, which holds it
                return _Decision([(window.latest, TickOutcome.LOCKED)])
        due, missed = self._due_ticks(wf, state, window.latest)
        if not due:
            instance_id = tick_instance_id(wf.name, window.latest)
            return _Decision(
                [(window.latest, TickOutcome.EXISTS if state.last_instance_id == instance_id else TickOutcome.DECIDED)]
            )
        held = _held_back(state)
        if held is TickOutcome.BUFFERED:
            await schedules_sql.schedule_record(conn, wf.name, next_tick=window.following, decided_at=now)
            return _Decision([(window.latest, held)])
        latest = window.latest
        if held is not None or state.overlap != "allow":
            # paused, skip and buffer_one decide every due tick at once, and start one run at
            # most, the latest tick's: the earlier ones would overlap it
            decision = _Decision(skipped=[] if missed is None else [missed])
            if due[0] < latest:
                reason = (held or TickOutcome.OVERLAP_SKIPPED).value
                decision.skipped.append((reason, due[0], _tick_before(wf, latest)))
            started = None
            if held is not None:
                decision.ticks.append((latest, held))
            else:
                outcome, started = await self._start(conn, wf, latest)
                decision.ticks.append((latest, outcome))
            await schedules_sql.schedule_record(
                conn, wf.name, tick=latest, instance_id=started, next_tick=window.following, decided_at=now
            )
            return decision
        decision = _Decision(complete=len(due) <= CATCH_UP_BATCH, skipped=[] if missed is None else [missed])
        last = None
        for tick in due[:CATCH_UP_BATCH]:
            outcome, started = await self._start(conn, wf, tick)
            decision.ticks.append((tick, outcome))
            last = started or last
        await schedules_sql.schedule_record(
            conn, wf.name, tick=decision.ticks[-1][0], instance_id=last, next_tick=window.following, decided_at=now
        )
        return decision

    async def _start(self, conn: Executor, wf: Workflow[Any], tick: datetime) -> tuple[TickOutcome, str | None]:
        """Start the tick's instance, a start like any other (kenning.starting), not
        before the workflow's first sighting; the outcome and the instance started."""
        start = prepare_start(
            wf,
            {},
            instance_id=tick_instance_id(wf.name, tick),
            idempotency_key=tick_key(tick),
            not_before=tick,
            own_ids=True,
        )
        registered: list[tuple[str, str]] = []
        started = await start_on(conn, start, known=self._known, registered=registered)
        self._known.update(registered)  # committed with the transaction (an error raises past this)
        if started is None:
            return TickOutcome.BEFORE_SCHEDULE, None
        return (TickOutcome.STARTED if started.created else TickOutcome.EXISTS), started.instance_id

    def _due_ticks(
        self, wf: Workflow[Any], state: ScheduleState, latest: datetime
    ) -> tuple[list[datetime], tuple[str, datetime, datetime] | None]:
        """The ticks to decide, oldest first, up to ``latest``: every one after the row's
        last decided tick that fell while a scheduler watched (up to ``WATCH_SECONDS``
        after the row's last decision, or since this ticker's first pass); those between,
        when maybe none ran, collapse into their latest. At most one more than a batch;
        and the range collapsed into it, if any: ``("missed", first, last)``."""
        assert wf.cron is not None and self._since is not None
        cron, after = wf.cron, state.last_tick
        ticks: list[datetime] = []
        collapsed = None
        if after is not None and state.decided_at is not None:
            watched = min(state.decided_at + timedelta(seconds=WATCH_SECONDS), latest)
            if watched > after:
                ticks = ticks_between(cron, cron.next_after(after), watched, CATCH_UP_BATCH)
                after = watched
        missed = cron.latest_at_or_before(min(self._since, latest))
        if after is None or missed > after:
            if after is not None and cron.next_after(after) < missed:
                collapsed = ("missed", cron.next_after(after), _tick_before(wf, missed))
            ticks.append(missed)
            after = missed
        if after < latest and len(ticks) <= CATCH_UP_BATCH:
            ticks.extend(ticks_between(cron, cron.next_after(after), latest, CATCH_UP_BATCH))
        return ticks[: CATCH_UP_BATCH + 1], collapsed

    def _log_outcome(self, wf: Workflow[Any], tick: datetime, outcome: TickOutcome, now: datetime) -> None:
        log = self.log.bind(workflow=wf.name, instance_id=tick_instance_id(wf.name, tick), tick=tick_key(tick))
        if outcome is TickOutcome.STARTED:
            self._buffered.pop(wf.name, None)
            log.info("cron.tick_started", late_ms=round((now - tick).total_seconds() * 1000, 1))
        elif outcome is TickOutcome.BUFFERED:
            if self._buffered.get(wf.name) != tick:  # once per tick, not on every pass it waits
                self._buffered[wf.name] = tick
                log.info("cron.tick_buffered", overlap=wf.overlap)
        elif outcome is TickOutcome.LOCKED:
            log.debug("cron.tick_locked", retry_seconds=RETRY_SECONDS)
        elif outcome in (TickOutcome.PAUSED, TickOutcome.OVERLAP_SKIPPED):
            log.info("cron.tick_skipped", reason=outcome.value)
        else:
            log.debug("cron.tick_skipped", reason=outcome.value)

    def seconds_until_next(self, now: datetime) -> float | None:
        """Seconds from ``now`` until the next tick of any scheduled workflow, or until a
        schedule left undecided is tried again."""
        if not self.workflows:
            return None
        following = min((self._window(wf, now).following - now).total_seconds() for wf in self.workflows)
        return min(following, RETRY_SECONDS) if self._pending else following

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


def _tick_before(wf: Workflow[Any], tick: datetime) -> datetime:
    """The schedule's tick just before ``tick``."""
    assert wf.cron is not None
    return wf.cron.latest_at_or_before(tick - timedelta(microseconds=1))
