"""Retention: finished instances (with their history, compensations and leftover waits),
processed inbox rows and published outbox rows expire in small batches by the scheduler
and by ``kenning gc``; nothing unfinished ever goes (issue 16, item 4)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from kenning.errors import ConfigurationError
from kenning.workflow import Workflow
from tests.scheduler_support import log_events, spawn_scheduler
from tests.support import ProcessPool, eventually, kenning_command

Sql = psycopg.Connection[tuple[Any, ...]]
RETENTION_APP = "tests.apps.retention"
UNFINISHED = ("pending", "running", "waiting_for_timer", "waiting_for_event", "compensating")


def _ids(sql: Sql, table: str, column: str = "instance_id") -> set[str]:
    return {str(r[0]) for r in sql.execute(f"SELECT DISTINCT {column} FROM {table}").fetchall()}


def _seed(sql: Sql) -> None:
    """Workflow 'short' keeps finished instances a minute, 'plain' names no retention.
    Instances ``*-old`` finished (or, if unfinished, were last touched) two days ago."""
    sql.execute(
        "INSERT INTO kenning_workflow_definitions (workflow_name, source_hash, source, retention_seconds) "
        "VALUES ('short', 'h', '', 60), ('plain', 'h', '', NULL)"
    )
    finished = [
        ("done-old", "short", "completed"),
        ("failed-old", "short", "failed"),
        ("plain-old", "plain", "cancelled"),
    ]
    for instance_id, workflow, status in finished:
        sql.execute(
            "INSERT INTO kenning_instances (id, workflow_name, status, finished_at) "
            "VALUES (%s, %s, %s, now() - interval '2 days')",
            (instance_id, workflow, status),
        )
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, status, finished_at) "
        "VALUES ('done-new', 'short', 'completed', now())"
    )
    for status in UNFINISHED:  # an unfinished row never goes, whatever its finished_at says
        sql.execute(
            "INSERT INTO kenning_instances (id, workflow_name, status, available_at, finished_at) "
            "VALUES (%s, 'short', %s, now() + interval '1 hour', now() - interval '2 days')",
            (f"{status}-old", status),
        )
    sql.execute(
        "INSERT INTO kenning_timers (instance_id, step_id, step_name, due_at) VALUES "
        "('waiting_for_timer-old', 'wait_timer:1', 'wait_timer', now() + interval '1 hour')"
    )
    sql.execute(  # one kept by its waiting instance, one left behind by a finished one
        "INSERT INTO kenning_event_subscriptions (instance_id, step_id, step_name, event_type) VALUES "
        "('waiting_for_event-old', 'wait_event:t:1', 'wait_event:t', 't'), "
        "('done-old', 'wait_event:t:1', 'wait_event:t', 't')"
    )
    for instance_id in ("done-old", "failed-old", "done-new", "running-old"):
        sql.execute(
            "INSERT INTO kenning_history (instance_id, step_id, kind, step_name) "
            "SELECT %s, 'note:' || n, 'ActivityCompleted', 'note' FROM generate_series(1, 3) AS n",
            (instance_id,),
        )
    sql.execute(
        "INSERT INTO kenning_compensations (instance_id, comp_id, position, function_name) VALUES "
        "('failed-old', 'c1', 1, 'm:undo'), ('compensating-old', 'c1', 1, 'm:undo')"
    )
    sql.execute(
        "INSERT INTO kenning_inbox (source, event_id, event_type, status, processed_at) VALUES "
        "('s', 'old', 't', 'processed', now() - interval '2 days'), ('s', 'new', 't', 'processed', now()), "
        "('s', 'parked', 't', 'failed', now() - interval '2 days'), ('s', 'waiting', 't', 'pending', NULL)"
    )
    sql.execute(
        "INSERT INTO kenning_outbox (id, event_type, source, status, published_at) VALUES "
        "(gen_random_uuid(), 'old', 's', 'published', now() - interval '8 days'), "
        "(gen_random_uuid(), 'new', 's', 'published', now()), "
        "(gen_random_uuid(), 'dead', 's', 'failed', NULL), (gen_random_uuid(), 'due', 's', 'pending', NULL)"
    )


def _kept(sql: Sql) -> dict[str, set[str]]:
    return {
        "instances": _ids(sql, "kenning_instances", "id"),
        "history": _ids(sql, "kenning_history"),
        "compensations": _ids(sql, "kenning_compensations"),
        "timers": _ids(sql, "kenning_timers"),
        "subscriptions": _ids(sql, "kenning_event_subscriptions"),
        "inbox": _ids(sql, "kenning_inbox", "event_id"),
        "outbox": _ids(sql, "kenning_outbox", "event_type"),
    }


async def test_the_scheduler_expires_what_is_past_retention_and_nothing_else(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    _seed(sql)
    unfinished = {f"{s}-old" for s in UNFINISHED}
    scheduler = spawn_scheduler(processes, database_url, "--retention-interval", "0.2", "--retention-batch-size", "1")
    await eventually(lambda: "done-old" not in _ids(sql, "kenning_instances", "id"), message="done-old expired")
    await eventually(lambda: "failed-old" not in _ids(sql, "kenning_instances", "id"), message="failed-old expired")
    await eventually(lambda: len(log_events(processes.log_of(scheduler), "retention.swept")) >= 1)
    kept = _kept(sql)
    # 'plain' names no retention and the default keeps: its instance stays
    assert kept["instances"] == {"plain-old", "done-new", *unfinished}
    assert kept["history"] == {"done-new", "running-old"}
    assert kept["compensations"] == {"compensating-old"}
    assert kept["timers"] == {"waiting_for_timer-old"}
    assert kept["subscriptions"] == {"waiting_for_event-old"}
    assert kept["inbox"] == {"new", "parked", "waiting"}
    assert kept["outbox"] == {"new", "dead", "due"}
    swept = log_events(processes.log_of(scheduler), "retention.swept")[0]
    assert swept["instances"] == 2 and swept["history"] == 6 and swept["compensations"] == 1 and swept["waits"] == 1


def test_gc_dry_run_counts_and_deletes_nothing_then_gc_deletes(database_url: str, sql: Sql) -> None:
    _seed(sql)
    before = _kept(sql)
    dry = kenning_command("gc", "--dry-run", "--json", "--instance-retention-days", "1", url=database_url)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout) == {
        "dry_run": True,
        "instances": 3,  # with a default of a day, 'plain' expires too
        "history": 6,
        "compensations": 1,
        "waits": 1,
        "inbox": 1,
        "outbox": 1,
    }
    assert _kept(sql) == before
    human = kenning_command("gc", "--dry-run", url=database_url)
    assert "WOULD DELETE" in human.stdout and _kept(sql) == before

    done = kenning_command("gc", "--instance-retention-days", "1", "--retention-batch-size", "2", url=database_url)
    assert done.returncode == 0, done.stderr
    assert "DELETED" in done.stdout
    assert _kept(sql)["instances"] == {"done-new", *(f"{s}-old" for s in UNFINISHED)}
    again = json.loads(
        kenning_command("gc", "--dry-run", "--json", "--instance-retention-days", "1", url=database_url).stdout
    )
    assert again["instances"] == again["inbox"] == again["outbox"] == 0


async def test_a_workflows_retention_travels_with_its_definition_to_the_scheduler(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    processes.worker(database_url, RETENTION_APP)
    await eventually(
        lambda: sql.execute("SELECT count(*) FROM kenning_workflow_definitions").fetchone() == (2,),
        message="the worker registered its workflows",
    )
    for name in ("brief", "lasting"):
        started = kenning_command("start", name, "--wait", "30", "--json", url=database_url)
        assert started.returncode == 0, started.stderr
    rows: dict[str, float | None] = dict(
        sql.execute("SELECT workflow_name, retention_seconds FROM kenning_workflow_definitions").fetchall()
    )
    assert rows == {"brief": 1.0, "lasting": None}
    spawn_scheduler(processes, database_url, "--retention-interval", "0.2")  # no --app: the rows say it all
    await eventually(lambda: sql.execute("SELECT workflow_name FROM kenning_instances").fetchall() == [("lasting",)])
    assert sql.execute("SELECT DISTINCT h.instance_id FROM kenning_history AS h").fetchall() != []
    assert not sql.execute(
        "SELECT 1 FROM kenning_history AS h LEFT JOIN kenning_instances AS i ON i.id = h.instance_id WHERE i.id IS NULL"
    ).fetchall(), "history of a deleted instance left behind"


def test_retention_must_be_a_positive_timedelta() -> None:
    async def body() -> None:
        return None

    assert Workflow(body, name="weekly", retention=timedelta(days=7)).retention_seconds == 7 * 86400
    for bad in (timedelta(0), timedelta(seconds=-1), 7):
        with pytest.raises(ConfigurationError, match="retention= must be a positive timedelta"):
            Workflow(body, name="bad", retention=bad)  # type: ignore[arg-type]
