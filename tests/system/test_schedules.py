"""``kenning schedules`` against real scheduler and worker processes: the list, each
overlap policy in real time, pause and resume, trigger, backfill, and the one-line
refusals."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg

from kenning import Client
from kenning.db import Database
from tests.scheduler_support import Sql, log_events, spawn_scheduler
from tests.support import ProcessPool, eventually, kenning_command, workers_started

APP = "tests.apps.schedules"


def instances_of(sql: Sql, workflow: str) -> list[str]:
    rows = sql.execute("SELECT id FROM kenning_instances WHERE workflow_name = %s ORDER BY id", (workflow,)).fetchall()
    return [str(r[0]) for r in rows]


def listed(database_url: str) -> dict[str, dict[str, Any]]:
    done = kenning_command("schedules", "list", "--json", url=database_url)
    assert done.returncode == 0, done
    return {s["workflow_name"]: s for s in json.loads(done.stdout)}


def schedules(database_url: str, *args: str) -> str:
    done = kenning_command("schedules", *args, url=database_url)
    assert done.returncode == 0, done
    return done.stdout.strip()


async def test_schedules_list_overlap_pause_trigger_and_backfill(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    worker = processes.worker(database_url, APP)
    scheduler = spawn_scheduler(processes, database_url, "--app", APP, "--log-level", "debug")
    await workers_started(processes, [worker])
    names = ["five_minutes_buffer", "five_minutes_skip", "held_buffer", "held_skip", "quarter_hourly"]
    await eventually(lambda: sorted(listed(database_url)) == names, timeout=20, message="schedules declared")
    table = schedules(database_url, "list").splitlines()
    assert table[0].split() == ["SCHEDULE", "EXPRESSION", "OVERLAP", "PAUSED", "LAST", "TICK", "NEXT", "TICK", "LAST",
                                "INSTANCE"]  # fmt: skip
    assert any(line.split()[:5] == ["held_buffer", "*", "*", "*", "*"] for line in table[1:])

    def ticks_logged(event: str, workflow: str) -> list[str]:
        return [e["tick"] for e in log_events(processes.log_of(scheduler), event) if e["workflow"] == workflow]

    async with Client(database=database) as client:
        # skip: while the first run waits, ticks pass and none starts
        (first_skip,) = await eventually(lambda: instances_of(sql, "held_skip"), message="held_skip's first tick")
        await eventually(lambda: len(ticks_logged("cron.tick_skipped", "held_skip")) >= 2, message="ticks skipped")
        assert instances_of(sql, "held_skip") == [first_skip]
        # buffer_one: the ticks held while the first run waits start once, after it
        (first_buffer,) = await eventually(lambda: instances_of(sql, "held_buffer"), message="held_buffer's tick")
        await eventually(lambda: len(ticks_logged("cron.tick_buffered", "held_buffer")) >= 2, message="buffered")
        assert instances_of(sql, "held_buffer") == [first_buffer]
        await client.send_message(first_buffer, "release")
        assert await asyncio.wait_for(client.result(first_buffer), 20) == "released"
        second = await eventually(lambda: len(instances_of(sql, "held_buffer")) == 2, message="the buffered run")
        assert second
        held_after = len(ticks_logged("cron.tick_buffered", "held_buffer"))
        await eventually(lambda: len(ticks_logged("cron.tick_buffered", "held_buffer")) > held_after, message="held")
        assert len(instances_of(sql, "held_buffer")) == 2  # the second runs: later ticks wait, none started

        # pause: the skip schedule's run ends and no tick starts until resumed
        paused = schedules(database_url, "pause", "held_skip", "--reason", "database maintenance")
        assert paused == "held_skip: paused"
        assert listed(database_url)["held_skip"]["paused_reason"] == "database maintenance"
        assert listed(database_url)["held_skip"]["next_tick"] is None
        await client.send_message(first_skip, "release")
        assert await asyncio.wait_for(client.result(first_skip), 20) == "released"
        # a tick after the run ended is skipped for the pause (no longer for the overlap)
        skipped_paused = len(ticks_logged("cron.tick_skipped", "held_skip"))
        await eventually(
            lambda: len(ticks_logged("cron.tick_skipped", "held_skip")) > skipped_paused, message="paused ticks"
        )
        reasons = {e["reason"] for e in log_events(processes.log_of(scheduler), "cron.tick_skipped")}
        assert {"paused", "overlap_skipped"} <= reasons
        assert instances_of(sql, "held_skip") == [first_skip]
        assert schedules(database_url, "resume", "held_skip") == "held_skip: resumed"
        await eventually(lambda: len(instances_of(sql, "held_skip")) == 2, message="a tick after the resume")

        # trigger: one run now, whatever the cron expression says
        triggered = schedules(database_url, "trigger", "quarter_hourly")
        assert triggered.startswith("quarter_hourly@") and triggered.endswith("Z-trigger"), triggered
        assert await asyncio.wait_for(client.result(triggered), 20) == "ran"
        assert listed(database_url)["quarter_hourly"]["last_instance_id"] == triggered

        # backfill: the count first, then every tick of the range, once however often asked
        span = ["--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T01:00:00Z"]
        dry = schedules(database_url, "backfill", "quarter_hourly", *span, "--dry-run")
        assert dry == "quarter_hourly: 5 ticks from 2026-01-01T00:00:00+00:00 to 2026-01-01T01:00:00+00:00"
        assert instances_of(sql, "quarter_hourly") == [triggered]
        assert (
            schedules(database_url, "backfill", "quarter_hourly", *span)
            == "quarter_hourly: 5 started, 0 had run already"
        )
        again = json.loads(schedules(database_url, "backfill", "quarter_hourly", *span, "--json"))
        assert (again["started"], again["existing"]) == (0, 5)
        backfilled = [
            f"quarter_hourly@2026-01-01T{h:02d}:{m:02d}:00Z" for h, m in [(0, 0), (0, 15), (0, 30), (0, 45), (1, 0)]
        ]
        assert sorted(instances_of(sql, "quarter_hourly")) == sorted([*backfilled, triggered])
        results = await asyncio.wait_for(asyncio.gather(*(client.result(i) for i in backfilled)), 30)
        assert results == ["ran"] * 5
        waiting = sql.execute(
            "SELECT id FROM kenning_instances WHERE workflow_name LIKE 'held_%%' AND status = 'waiting_for_message'"
        ).fetchall()
        for (instance_id,) in waiting:  # let the worker stop with no run waiting
            await client.send_message(str(instance_id), "release")


def test_schedules_refusals_are_one_line(database_url: str) -> None:
    for args, expected in [
        (["pause", "nope"], "no schedule 'nope'"),
        (["backfill", "nope", "--from", "yesterday", "--to", "2026-01-01T00:00:00Z"], "is not an ISO 8601 time"),
        (["trigger", "nope"], "no schedule 'nope'"),
    ]:
        done = kenning_command("schedules", *args, url=database_url)
        assert done.returncode == 2, done
        # argparse's own refusals come after the usage, as for every command: the error is one line
        last = done.stderr.strip().splitlines()[-1]
        assert expected in last and "Traceback" not in done.stderr, done.stderr


def test_an_operators_command_waits_for_a_held_schedule_row_a_bounded_time(database_url: str, sql: Sql) -> None:
    sql.execute("INSERT INTO kenning_schedules (workflow_name, expression) VALUES ('held', '* * * * *')")
    with psycopg.connect(database_url) as holder:  # another session holds the row, for as long as it likes
        holder.execute("SELECT 1 FROM kenning_schedules WHERE workflow_name = 'held' FOR UPDATE")
        for action in ("pause", "resume", "trigger"):
            done = kenning_command("schedules", action, "held", url=database_url)
            assert done.returncode == 1, done
            last = done.stderr.strip().splitlines()[-1]
            assert "schedule 'held' is held by another transaction" in last and "Traceback" not in done.stderr, last
        holder.rollback()
    assert schedules(database_url, "pause", "held") == "held: paused"
