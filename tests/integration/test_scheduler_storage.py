"""The scheduler's SQL against real PostgreSQL: firing timers and event timeouts, the
locks they skip, the next due time, and cron ticks (time moved with ``now``)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from kenning import App
from kenning.db import Database, statement
from kenning.errors import ConfigurationError
from kenning.registry import Registry
from kenning.schedules import scheduled_workflows, tick_key
from kenning.storage import instances as instances_sql
from kenning.storage import timers as timers_sql
from kenning.storage.schedules import TickOutcome
from kenning.workflow import Workflow
from kenning_scheduler import Scheduler, SchedulerSettings
from tests.apps import timers as apps
from tests.logguard import LogGuard
from tests.scheduler_support import (
    Sql,
    check_timer_invariants,
    db_now,
    fired_timers,
    insert_waiting_event,
    insert_waiting_timers,
    statuses,
)


async def fire(database: Database, limit: int = 100, now: datetime | None = None) -> list[timers_sql.FiredWait]:
    async with database.transaction() as conn:
        return await timers_sql.timer_fire_due(conn, limit=limit, now=now)


async def fire_timeouts(
    database: Database, limit: int = 100, now: datetime | None = None
) -> list[timers_sql.FiredWait]:
    async with database.transaction() as conn:
        return await timers_sql.subscription_timeout_fire_due(conn, limit=limit, now=now)


# ------------------------------------------------------------------ timers


async def test_timer_fires_only_when_due_and_wakes_its_instance_in_one_commit(database: Database, sql: Sql) -> None:
    due = db_now(sql) + timedelta(seconds=60)
    insert_waiting_timers(sql, ["t1"], due)
    sql.execute("LISTEN kenning_instances")
    assert await fire(database) == []
    assert await fire(database, now=due - timedelta(microseconds=1)) == []
    assert statuses(sql) == {"t1": "waiting_for_timer"}
    assert list(sql.notifies(timeout=0.05)) == []

    (fired,) = await fire(database, now=due)
    assert (fired.instance_id, fired.workflow_name, fired.step_id, fired.due_at) == ("t1", "nap", "wait_timer:1", due)
    assert fired.fired_at is not None
    rows = sql.execute(
        "SELECT step_id, kind, step_name, (payload ->> 'due_at')::timestamptz FROM kenning_history"
    ).fetchall()
    assert rows == [("wait_timer:1", "TimerExpired", "wait_timer", due)]
    row = sql.execute("SELECT status, available_at <= now(), lease_token FROM kenning_instances").fetchone()
    assert row == ("pending", True, None)
    assert sql.execute("SELECT count(*) FROM kenning_timers").fetchone() == (0,)
    assert [n.channel for n in sql.notifies(timeout=2, stop_after=1)] == ["kenning_instances"]
    assert await fire(database, now=due + timedelta(hours=1)) == []  # gone: fires once


async def test_overdue_timers_fire_oldest_first_in_batches(database: Database, sql: Sql) -> None:
    now = db_now(sql)
    order = [5, 1, 6, 3, 0, 4, 2]
    for n in order:
        insert_waiting_timers(sql, [f"t{n}"], now - timedelta(minutes=10 - n))
    batches = [[f.instance_id for f in await fire(database, limit=3)] for _ in range(4)]
    assert batches == [["t0", "t1", "t2"], ["t3", "t4", "t5"], ["t6"], []]
    assert [i for i, _, _ in fired_timers(sql)] == [f"t{n}" for n in range(7)]
    check_timer_invariants(sql)


async def test_concurrent_fire_loops_fire_each_timer_once(database: Database, sql: Sql) -> None:
    insert_waiting_timers(sql, [f"t{n}" for n in range(200)], db_now(sql) - timedelta(seconds=1))

    async def loop() -> list[str]:
        got: list[str] = []
        while batch := await fire(database, limit=7):
            got += [f.instance_id for f in batch]
        return got

    results = await asyncio.gather(*(loop() for _ in range(4)))
    flat = [i for r in results for i in r]
    assert sorted(flat) == sorted(f"t{n}" for n in range(200))
    assert len(flat) == len(set(flat))
    assert sql.execute("SELECT count(*) FROM kenning_history WHERE kind = 'TimerExpired'").fetchone() == (200,)
    check_timer_invariants(sql)


async def test_a_cancel_in_progress_is_skipped_not_waited_for_and_wins(database: Database, sql: Sql) -> None:
    insert_waiting_timers(sql, ["t1"], db_now(sql) - timedelta(seconds=1))
    async with database.transaction() as cancelling:
        assert await instances_sql.instance_request_cancel(cancelling, "t1") == ("waiting_for_timer", True)
        # the cancel holds the instance and timer rows: the scheduler skips them at once
        assert await asyncio.wait_for(fire(database), timeout=5) == []
    assert await fire(database) == []
    assert sql.execute("SELECT count(*) FROM kenning_history").fetchone() == (0,)
    assert sql.execute("SELECT status, cancel_requested FROM kenning_instances").fetchone() == ("pending", True)
    check_timer_invariants(sql)


async def test_a_timer_of_an_instance_no_longer_waiting_is_discarded(database: Database, sql: Sql) -> None:
    insert_waiting_timers(sql, ["t1"], db_now(sql) - timedelta(seconds=1))
    sql.execute("UPDATE kenning_instances SET status = 'completed'")
    (discarded,) = await fire(database)
    assert discarded.instance_id == "t1" and discarded.fired_at is None
    assert sql.execute("SELECT count(*) FROM kenning_history").fetchone() == (0,)
    assert sql.execute("SELECT count(*) FROM kenning_timers").fetchone() == (0,)
    assert statuses(sql) == {"t1": "completed"}


# ------------------------------------------------------------------ event timeouts


async def test_event_timeout_is_recorded_and_the_instance_woken(database: Database, sql: Sql) -> None:
    now = db_now(sql)
    insert_waiting_event(sql, "late", now - timedelta(seconds=1))
    insert_waiting_event(sql, "later", now + timedelta(seconds=60))
    insert_waiting_event(sql, "forever", None)
    (fired,) = await fire_timeouts(database)
    assert (fired.instance_id, fired.step_id, fired.workflow_name) == ("late", "wait_event_never.sent:1", "patient")
    rows = sql.execute("SELECT instance_id, kind, step_name, payload ->> 'event_type' FROM kenning_history").fetchall()
    assert rows == [("late", "EventTimeout", "wait_event:never.sent", "never.sent")]
    assert statuses(sql) == {"late": "pending", "later": "waiting_for_event", "forever": "waiting_for_event"}
    remaining = sql.execute("SELECT instance_id FROM kenning_event_subscriptions ORDER BY 1").fetchall()
    assert remaining == [("forever",), ("later",)]
    assert await fire_timeouts(database, now=now + timedelta(days=3650)) != []  # 'later' only
    assert statuses(sql)["forever"] == "waiting_for_event"
    check_timer_invariants(sql)


async def test_event_timeout_skips_a_subscription_being_delivered_and_delivery_wins(
    database: Database, sql: Sql
) -> None:
    insert_waiting_event(sql, "e1", db_now(sql) - timedelta(seconds=1))
    async with database.transaction() as delivering:
        # the delivery's lock on the subscription, as the worker delivering an event takes it
        await delivering.execute(
            statement("SELECT 1 FROM kenning_event_subscriptions WHERE instance_id = 'e1' FOR UPDATE")
        )
        assert await asyncio.wait_for(fire_timeouts(database), timeout=5) == []
        await delivering.execute(statement("DELETE FROM kenning_event_subscriptions WHERE instance_id = 'e1'"))
    assert await fire_timeouts(database) == []
    assert sql.execute("SELECT count(*) FROM kenning_history").fetchone() == (0,)


async def test_next_due_is_the_earliest_timer_or_event_timeout(database: Database, sql: Sql) -> None:
    now = db_now(sql)
    async with database.connection() as conn:
        assert await timers_sql.timer_next_due(conn, now) == timers_sql.NextDue(now=now, seconds=None)
    insert_waiting_timers(sql, ["t1"], now + timedelta(seconds=30))
    async with database.connection() as conn:
        assert (await timers_sql.timer_next_due(conn, now)).seconds == pytest.approx(30)
    insert_waiting_event(sql, "e1", now + timedelta(seconds=10))
    async with database.connection() as conn:
        assert (await timers_sql.timer_next_due(conn, now)).seconds == pytest.approx(10)
        assert (await timers_sql.timer_next_due(conn, now + timedelta(seconds=40))).seconds == pytest.approx(-30)


async def test_scheduler_logs_stable_event_names(database: Database, sql: Sql, log_guard: LogGuard) -> None:
    now = db_now(sql)
    insert_waiting_timers(sql, ["t1"], now)
    insert_waiting_event(sql, "e1", now)
    with log_guard.capture() as logs:
        scheduler = Scheduler(database, None, SchedulerSettings(poll_interval=0.5))
        sleep_for = await scheduler.run_once()
    fired = [e for e in logs if e["event"] == "timer.fired"]
    assert [(e["instance_id"], e["workflow"], e["step"]) for e in fired] == [("t1", "nap", "wait_timer:1")]
    timed_out = [e for e in logs if e["event"] == "event.timed_out"]
    assert [(e["instance_id"], e["workflow"]) for e in timed_out] == [("e1", "patient")]
    assert [(e["timers"], e["timeouts"]) for e in logs if e["event"] == "scheduler.fired"] == [(1, 1)]
    assert sleep_for == 0.5  # nothing else due: the poll interval


# ------------------------------------------------------------------ cron ticks


def registry_of(*workflows: Workflow[str]) -> App:
    registry = Registry()
    for wf in workflows:
        registry.add_workflow(wf)
    return App(registry=registry)


async def first_seen_at(database: Database, sql: Sql, app: App, at: datetime) -> None:
    """Record the schedules' definitions as first seen at ``at``."""
    await Scheduler(database, app).cron.register()
    sql.execute("UPDATE kenning_workflow_definitions SET created_at = %s", (at,))


def cron_instances(sql: Sql) -> list[tuple[str, str, str]]:
    rows = sql.execute(
        "SELECT id, workflow_name, idempotency_key FROM kenning_instances ORDER BY idempotency_key"
    ).fetchall()
    return [(str(a), str(b), str(c)) for a, b, c in rows]


async def test_ticks_missed_while_down_start_only_the_latest_once(database: Database, sql: Sql) -> None:
    app = registry_of(apps.every_five_minutes)
    t0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
    await first_seen_at(database, sql, app, t0 - timedelta(seconds=1))
    sql.execute("LISTEN kenning_instances")
    first, second = Scheduler(database, app), Scheduler(database, app)
    down_until = t0 + timedelta(hours=1, minutes=2)  # 13 ticks passed while nothing ran
    assert await first.cron.start_due(down_until) == {"every_five_minutes": TickOutcome.STARTED}
    assert await second.cron.start_due(down_until) == {"every_five_minutes": TickOutcome.EXISTS}
    assert await first.cron.start_due(down_until + timedelta(minutes=1)) == {}  # same tick: not tried again
    key = "2026-01-05T11:00:00Z"
    assert cron_instances(sql) == [(f"every_five_minutes@{key}", "every_five_minutes", key)]
    assert [n.channel for n in sql.notifies(timeout=2, stop_after=1)] == ["kenning_instances"]
    # the next tick starts once more, however many schedulers look
    outcomes = await asyncio.gather(
        *(Scheduler(database, app).cron.start_due(t0 + timedelta(hours=1, minutes=5)) for _ in range(4))
    )
    decided = sorted(o["every_five_minutes"].value for o in outcomes)  # the others find it started, or held
    assert decided.count("started") == 1 and set(decided) <= {"started", "exists", "locked"}, decided
    assert [k for _, _, k in cron_instances(sql)] == [key, "2026-01-05T11:05:00Z"]
    (status,) = sql.execute("SELECT DISTINCT status FROM kenning_instances").fetchone() or ()
    assert status == "pending"


async def test_a_new_schedule_does_not_start_ticks_from_before_it_was_seen(database: Database, sql: Sql) -> None:
    app = registry_of(apps.every_five_minutes)
    t0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
    await first_seen_at(database, sql, app, t0 + timedelta(minutes=1))
    scheduler = Scheduler(database, app)
    assert await scheduler.cron.start_due(t0 + timedelta(minutes=2)) == {
        "every_five_minutes": TickOutcome.BEFORE_SCHEDULE
    }
    assert cron_instances(sql) == []
    assert await scheduler.cron.start_due(t0 + timedelta(minutes=5)) == {"every_five_minutes": TickOutcome.STARTED}
    assert scheduler.cron.seconds_until_next(t0 + timedelta(minutes=6)) == 240


async def test_schedule_in_a_time_zone_and_run_once_drives_ticks(database: Database, sql: Sql) -> None:
    app = registry_of(apps.nightly)  # 02:30 in Europe/Paris
    await first_seen_at(database, sql, app, datetime(2026, 6, 1, tzinfo=UTC))
    scheduler = Scheduler(database, app, SchedulerSettings(poll_interval=30, stuck_check_interval=60))
    summer = datetime(2026, 7, 1, 1, 0, tzinfo=UTC)  # 03:00 CEST
    await scheduler.run_once(now=summer)
    winter = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)  # 03:00 CET
    # another scheduler, come after one that ran only in July: the nights between are
    # not caught up (one that ran all along would start each, oldest first)
    scheduler = Scheduler(database, app, SchedulerSettings(poll_interval=30, stuck_check_interval=60))
    sleep_for = await scheduler.run_once(now=winter)
    assert [k for _, _, k in cron_instances(sql)] == ["2026-07-01T00:30:00Z", "2026-12-01T01:30:00Z"]
    assert sleep_for == 30  # the poll interval is sooner than tomorrow's tick
    assert tick_key(datetime(2026, 12, 1, 2, 30, tzinfo=apps.nightly.cron.zone)) == "2026-12-01T01:30:00Z"  # type: ignore[union-attr]


def test_a_scheduled_workflow_must_be_startable_without_arguments() -> None:
    async def needs(ctx: object, order_id: str) -> str:
        return order_id

    app = registry_of(Workflow(needs, schedule="@hourly"))
    with pytest.raises(ConfigurationError, match=r"scheduled workflow 'needs' must take no arguments.*order_id"):
        scheduled_workflows(app.registry)
    assert [wf.name for wf in scheduled_workflows(registry_of(apps.every_five_minutes).registry)] == [
        "every_five_minutes"
    ]
