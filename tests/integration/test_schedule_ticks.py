"""A cron tick's decision against real PostgreSQL, time moved with ``now``: the overlap
policies, pause and resume, several schedulers deciding one tick, the schedules' rows."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from kenning import App
from kenning.db import Database
from kenning.errors import ConfigurationError
from kenning.registry import Registry
from kenning.storage import schedules as schedules_sql
from kenning.storage.schedules import TickOutcome
from kenning.workflow import Workflow
from kenning_scheduler import Scheduler
from tests.apps import schedules as apps
from tests.scheduler_support import Sql

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)


def app_of(*workflows: Workflow[str]) -> App:
    registry = Registry()
    for wf in workflows:
        registry.add_workflow(wf)
    return App(registry=registry)


async def seen_before_t0(database: Database, sql: Sql, app: App) -> None:
    """Declare the schedules and date their first sighting just before ``T0``."""
    await Scheduler(database, app).cron.register()
    sql.execute("UPDATE kenning_workflow_definitions SET created_at = %s", (T0 - timedelta(seconds=1),))


def ticks_started(sql: Sql, workflow: str) -> list[str]:
    rows = sql.execute(
        "SELECT idempotency_key FROM kenning_instances WHERE workflow_name = %s ORDER BY idempotency_key", (workflow,)
    ).fetchall()
    return [str(r[0]) for r in rows]


def finish(sql: Sql, instance_id: str) -> None:
    sql.execute("UPDATE kenning_instances SET status = 'completed', finished_at = now() WHERE id = %s", (instance_id,))


async def test_overlap_skip_skips_ticks_while_the_last_instance_runs(database: Database, sql: Sql) -> None:
    app = app_of(apps.five_minutes_skip)
    await seen_before_t0(database, sql, app)
    scheduler = Scheduler(database, app)
    name = "five_minutes_skip"
    assert await scheduler.cron.start_due(T0) == {name: TickOutcome.STARTED}
    # the 10:00 run has not finished: 10:05 is skipped, by this scheduler and for the others
    assert await scheduler.cron.start_due(T0 + timedelta(minutes=5)) == {name: TickOutcome.OVERLAP_SKIPPED}
    assert await Scheduler(database, app).cron.start_due(T0 + timedelta(minutes=6)) == {name: TickOutcome.DECIDED}
    finish(sql, f"{name}@2026-01-05T10:00:00Z")
    assert await scheduler.cron.start_due(T0 + timedelta(minutes=10)) == {name: TickOutcome.STARTED}
    assert ticks_started(sql, name) == ["2026-01-05T10:00:00Z", "2026-01-05T10:10:00Z"]


async def test_overlap_buffer_one_starts_the_latest_held_tick_once_the_run_ends(database: Database, sql: Sql) -> None:
    app = app_of(apps.five_minutes_buffer)
    await seen_before_t0(database, sql, app)
    scheduler = Scheduler(database, app)
    name = "five_minutes_buffer"
    assert await scheduler.cron.start_due(T0) == {name: TickOutcome.STARTED}
    assert await scheduler.cron.start_due(T0 + timedelta(minutes=5)) == {name: TickOutcome.BUFFERED}
    assert await scheduler.cron.start_due(T0 + timedelta(minutes=6)) == {name: TickOutcome.BUFFERED}  # asked again
    assert await scheduler.cron.start_due(T0 + timedelta(minutes=11)) == {name: TickOutcome.BUFFERED}
    assert ticks_started(sql, name) == ["2026-01-05T10:00:00Z"]
    finish(sql, f"{name}@2026-01-05T10:00:00Z")
    # one run of the held ticks, the latest, as soon as the run ended (not at 10:15)
    assert await scheduler.cron.start_due(T0 + timedelta(minutes=12)) == {name: TickOutcome.STARTED}
    assert ticks_started(sql, name) == ["2026-01-05T10:00:00Z", "2026-01-05T10:10:00Z"]
    (row,) = await _list(database)
    assert (row.last_tick, row.last_instance_id) == (T0 + timedelta(minutes=10), f"{name}@2026-01-05T10:10:00Z")


async def test_overlap_allow_starts_every_tick(database: Database, sql: Sql) -> None:
    app = app_of(apps.quarter_hourly)
    await seen_before_t0(database, sql, app)
    scheduler = Scheduler(database, app)
    for minutes in (0, 15, 30):
        assert await scheduler.cron.start_due(T0 + timedelta(minutes=minutes)) == {
            "quarter_hourly": TickOutcome.STARTED
        }
    assert len(ticks_started(sql, "quarter_hourly")) == 3


async def test_a_paused_schedule_starts_no_tick_and_resumes_from_the_next(database: Database, sql: Sql) -> None:
    app = app_of(apps.quarter_hourly)
    await seen_before_t0(database, sql, app)
    scheduler = Scheduler(database, app)
    async with database.connection() as conn:
        assert await schedules_sql.schedule_set_paused(conn, "quarter_hourly", paused=True, reason="maintenance")
        assert not await schedules_sql.schedule_set_paused(conn, "no_such", paused=True)
    assert await scheduler.cron.start_due(T0) == {"quarter_hourly": TickOutcome.PAUSED}
    (row,) = await _list(database)
    assert (row.paused, row.paused_reason, row.last_tick) == (True, "maintenance", T0)
    # resumed at 10:20 with no scheduler having looked at 10:15: 10:15 does not start late
    async with database.connection() as conn:
        await schedules_sql.schedule_set_paused(
            conn, "quarter_hourly", paused=False, skip_through=T0 + timedelta(minutes=15)
        )
    assert await Scheduler(database, app).cron.start_due(T0 + timedelta(minutes=20)) == {
        "quarter_hourly": TickOutcome.DECIDED
    }
    assert await scheduler.cron.start_due(T0 + timedelta(minutes=30)) == {"quarter_hourly": TickOutcome.STARTED}
    assert ticks_started(sql, "quarter_hourly") == ["2026-01-05T10:30:00Z"]
    (row,) = await _list(database)
    assert (row.paused, row.paused_reason) == (False, None)


async def test_schedulers_deciding_one_tick_at_once_start_it_once(database: Database, sql: Sql) -> None:
    app = app_of(apps.five_minutes_skip)
    await seen_before_t0(database, sql, app)
    outcomes = await asyncio.gather(*(Scheduler(database, app).cron.start_due(T0) for _ in range(6)))
    assert sorted(o["five_minutes_skip"].value for o in outcomes) == ["exists"] * 5 + ["started"]
    outcomes = await asyncio.gather(
        *(Scheduler(database, app).cron.start_due(T0 + timedelta(minutes=5)) for _ in range(6))
    )
    assert sorted(o["five_minutes_skip"].value for o in outcomes) == ["resolved"] * 5 + ["overlap_skipped"]
    assert ticks_started(sql, "five_minutes_skip") == ["2026-01-05T10:00:00Z"]


async def test_a_scheduler_declares_its_schedules_and_keeps_the_operators_pause(database: Database, sql: Sql) -> None:
    app = app_of(apps.quarter_hourly, apps.five_minutes_buffer)
    await Scheduler(database, app).cron.register()
    async with database.connection() as conn:
        await schedules_sql.schedule_set_paused(conn, "quarter_hourly", paused=True, reason="r")
    # a later deploy changes the expression: declared again, the pause stays
    changed = Workflow(apps.quarter_hourly.func, name="quarter_hourly", schedule="0 * * * *", overlap="skip")
    await Scheduler(database, app_of(changed)).cron.register()
    rows = {r.workflow_name: r for r in await _list(database)}
    assert [(n, r.expression, r.overlap, r.paused) for n, r in sorted(rows.items())] == [
        ("five_minutes_buffer", "*/5 * * * *", "buffer_one", False),
        ("quarter_hourly", "0 * * * *", "skip", True),
    ]


def test_overlap_is_checked_when_the_workflow_is_defined() -> None:
    async def job(ctx: object) -> str:
        return ""

    with pytest.raises(ConfigurationError, match=r"workflow 'job': overlap='sometimes' must be one of allow, skip"):
        Workflow(job, schedule="@hourly", overlap="sometimes")
    with pytest.raises(ConfigurationError, match=r"workflow 'job': overlap= needs schedule="):
        Workflow(job, overlap="skip")
    assert Workflow(job, schedule="@hourly").overlap == "allow"


async def _list(database: Database) -> list[schedules_sql.ScheduleRow]:
    async with database.connection() as conn:
        return await schedules_sql.schedules_list(conn)
