"""A stalled scheduler, or another session holding a schedule's row, stops nothing else
(issue 33, item 1): real ``kenning scheduler`` processes, one stopped with SIGSTOP inside
a cron tick's transaction, or a session of the test holding one schedule's row ``FOR
UPDATE``. Timers, event timeouts, deadlines and the other schedules go on, and every tick
due while a scheduler ran is started exactly once, the held schedule's late."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from datetime import datetime, timedelta

import psycopg

from tests.logguard import expect_log
from tests.scheduler_support import (
    Sql,
    db_now,
    fired_timers,
    insert_waiting_event,
    insert_waiting_timers,
    log_events,
    spawn_scheduler,
)
from tests.support import ProcessPool, eventually

TICKING_APP = "tests.apps.ticking"
SCHEDULES = ("tick_a", "tick_b", "tick_c")


def ticks_of(sql: Sql, workflow: str) -> list[datetime]:
    """The ticks whose instance exists, oldest first (the key is the tick, in UTC)."""
    rows = sql.execute(
        "SELECT CAST(idempotency_key AS timestamptz) FROM kenning_instances WHERE workflow_name = %s ORDER BY 1",
        (workflow,),
    ).fetchall()
    return [row[0] for row in rows]


def missing_ticks(ticks: list[datetime]) -> list[datetime]:
    """The seconds between the first and the last tick that have no instance."""
    if not ticks:
        return []
    have = set(ticks)
    span = int((ticks[-1] - ticks[0]).total_seconds())
    return [t for t in (ticks[0] + timedelta(seconds=n) for n in range(span + 1)) if t not in have]


def ticked_since(sql: Sql, workflow: str, since: datetime) -> bool:
    ticks = ticks_of(sql, workflow)
    return bool(ticks) and ticks[-1] >= since


def started_once_each(sql: Sql, logs: list[str]) -> None:
    """Every schedule's ticks have no gap, and each was logged started by one scheduler."""
    started = Counter(
        (e["workflow"], e["tick"]) for text in logs for e in log_events(text, "cron.tick_started") if "tick" in e
    )
    for workflow in SCHEDULES:
        ticks = ticks_of(sql, workflow)
        assert len(ticks) >= 3, (workflow, ticks)
        assert missing_ticks(ticks) == [], f"{workflow}: ticks never started"
        keys = [t.strftime("%Y-%m-%dT%H:%M:%SZ") for t in ticks]
        # the first may predate the schedule's first sighting (recorded, not started)
        assert all(started[(workflow, key)] == 1 for key in keys[1:]), (workflow, started)


async def test_a_scheduler_stopped_inside_a_tick_holds_up_no_other_and_loses_no_tick(
    database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    # the stopped scheduler's session is ended by the server while it is stopped: its
    # commit then fails, and it goes on with the next pass
    expect_log("cron.tick_deferred")
    other = spawn_scheduler(processes, database_url, "--app", TICKING_APP)
    await eventually(lambda: "scheduler.started" in processes.log_of(other), message="the other scheduler up")
    # the 10th decision: some seconds in, both running; the stall is the window to stop it in
    stopped = spawn_scheduler(
        processes, database_url, "--app", TICKING_APP, env={"KENNING_FAULTS": "cron.tick_decided=stall:4@10"}
    )
    await eventually(lambda: "fault.fired" in processes.log_of(stopped), timeout=30, message="inside a tick")
    stopped.suspend()  # SIGSTOP, the schedule's row held by its open transaction
    stopped_at = db_now(sql)
    assert "fault.resumed" not in processes.log_of(stopped), "stopped only after its stall inside the tick ended"
    try:
        # the other scheduler starts every schedule's ticks meanwhile, the held one's once
        # the server ended the stopped scheduler's transaction
        later = stopped_at + timedelta(seconds=2)
        await eventually(
            lambda: all(ticked_since(sql, w, later) for w in SCHEDULES),
            timeout=30,
            message="every schedule ticked while one scheduler was stopped",
        )
    finally:
        stopped.resume()
    resumed_at = db_now(sql) + timedelta(seconds=2)
    await eventually(
        lambda: all(ticked_since(sql, w, resumed_at) for w in SCHEDULES), timeout=30, message="ticks after SIGCONT"
    )
    await eventually(
        lambda: "cron.tick_deferred" in processes.log_of(stopped), message="the stopped scheduler's tick abandoned"
    )
    for proc in (stopped, other):
        proc.send_signal(signal.SIGTERM)
    assert [await asyncio.to_thread(p.wait, 15) for p in (stopped, other)] == [0, 0]
    started_once_each(sql, [processes.log_of(stopped), processes.log_of(other)])


async def test_a_schedule_row_held_by_another_session_holds_up_nothing_and_loses_no_tick(
    database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    scheduler = spawn_scheduler(processes, database_url, "--app", TICKING_APP)
    await eventually(lambda: all(ticks_of(sql, w) for w in SCHEDULES), timeout=30, message="every schedule ticked")
    with psycopg.connect(database_url) as holder:  # a transaction, as an operator's session might hold
        holder.execute("SELECT 1 FROM kenning_schedules WHERE workflow_name = 'tick_a' FOR UPDATE")
        held_at = db_now(sql)
        due = held_at + timedelta(seconds=1.5)
        insert_waiting_timers(sql, ["held-timer"], due)
        insert_waiting_event(sql, "held-timeout", due)
        sql.execute(
            "INSERT INTO kenning_instances (id, workflow_name, status, run_count, deadline_at) "
            "VALUES ('held-deadline', 'patient', 'waiting_for_event', 1, %s)",
            (due,),
        )

        def everything_else_fired() -> bool:
            deadline = sql.execute("SELECT cancel_requested FROM kenning_instances WHERE id = 'held-deadline'")
            return (
                [i for i, _, _ in fired_timers(sql)] == ["held-timer"]
                and [i for i, _, _ in fired_timers(sql, "EventTimeout")] == ["held-timeout"]
                and deadline.fetchone() == (True,)
                and all(ticked_since(sql, w, held_at + timedelta(seconds=3)) for w in ("tick_b", "tick_c"))
            )

        await eventually(
            everything_else_fired, timeout=30, message="timers, timeouts, deadlines, other schedules while held"
        )
        assert not ticked_since(sql, "tick_a", held_at + timedelta(seconds=1)), "a held schedule decided a tick"
        holder.commit()
        released_at = db_now(sql)
    # the held schedule's ticks start late, each once
    await eventually(lambda: ticked_since(sql, "tick_a", released_at), timeout=30, message="the held ticks caught up")
    scheduler.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(scheduler.wait, 15) == 0
    started_once_each(sql, [processes.log_of(scheduler)])
