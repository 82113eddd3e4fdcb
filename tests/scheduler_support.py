"""Helpers for the scheduler tests: scheduler processes, waits made in SQL, log events,
and the timer invariants checked after every multi-process run."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psutil
import psycopg

from tests.support import ProcessPool, iter_lines

Sql = psycopg.Connection[tuple[Any, ...]]
TIMER_APP = "tests.apps.timers"


def spawn_scheduler(
    processes: ProcessPool, database_url: str, *extra: str, env: dict[str, str] | None = None
) -> psutil.Popen:
    """A real ``kenning scheduler`` process with millisecond-scale settings."""
    return processes.spawn(
        ["scheduler", "--no-migrate", "--poll-interval", "0.5", *extra],
        env={"KENNING_DATABASE_URL": database_url, **(env or {})},
        name="scheduler",
    )


def db_now(sql: Sql) -> datetime:
    row = sql.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def insert_waiting_timers(sql: Sql, ids: list[str], due_at: datetime, workflow: str = "nap") -> None:
    """Instances that already suspended in ``wait_timer`` (step ``wait_timer:1``), as the
    worker leaves them, all due at ``due_at``."""
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, status, input, run_count, started_at) "
        "SELECT id, %s, 'waiting_for_timer', '{\"seconds\": 0}', 1, now() FROM unnest(%s::text[]) AS id",
        (workflow, ids),
    )
    sql.execute(
        "INSERT INTO kenning_timers (instance_id, step_id, step_name, due_at) "
        "SELECT id, 'wait_timer:1', 'wait_timer', %s FROM unnest(%s::text[]) AS id",
        (due_at, ids),
    )


def insert_waiting_event(
    sql: Sql, instance_id: str, timeout_at: datetime | None, step_id: str = "wait_event_never.sent:1"
) -> None:
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, status, run_count) VALUES (%s, 'patient', "
        "'waiting_for_event', 1)",
        (instance_id,),
    )
    sql.execute(
        "INSERT INTO kenning_event_subscriptions (instance_id, step_id, step_name, event_type, timeout_at) "
        "VALUES (%s, %s, 'wait_event:never.sent', 'never.sent', %s)",
        (instance_id, step_id, timeout_at),
    )


def fired_timers(sql: Sql, kind: str = "TimerExpired") -> list[tuple[str, datetime, datetime]]:
    """(instance_id, due time, fired_at) of every fired timer (or timeout), in the order
    they were recorded."""
    due_key = "due_at" if kind == "TimerExpired" else "timeout_at"
    rows = sql.execute(
        f"SELECT instance_id, (payload ->> '{due_key}')::timestamptz, (payload ->> 'fired_at')::timestamptz "
        "FROM kenning_history WHERE kind = %s ORDER BY seq",
        (kind,),
    ).fetchall()
    return [(str(r[0]), r[1], r[2]) for r in rows]


def statuses(sql: Sql, workflow: str | None = None) -> dict[str, str]:
    rows = sql.execute(
        "SELECT id, status FROM kenning_instances WHERE %s::text IS NULL OR workflow_name = %s", (workflow, workflow)
    ).fetchall()
    return {str(r[0]): str(r[1]) for r in rows}


def log_events(log_text: str, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of one event name."""
    found = []
    for line in iter_lines(log_text):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == event:
            found.append(entry)
    return found


def check_timer_invariants(sql: Sql) -> None:
    """No timer or timeout fired early, none recorded twice, and every timer or timed
    subscription left belongs to an instance still waiting for it."""
    early = sql.execute(
        "SELECT instance_id, step_id FROM kenning_history "
        "WHERE (kind = 'TimerExpired' AND (payload ->> 'fired_at')::timestamptz < (payload ->> 'due_at')::timestamptz) "
        "   OR (kind = 'EventTimeout' "
        "       AND (payload ->> 'fired_at')::timestamptz < (payload ->> 'timeout_at')::timestamptz)"
    ).fetchall()
    assert early == [], f"fired before due: {early}"
    twice = sql.execute("SELECT instance_id, step_id FROM kenning_history GROUP BY 1, 2 HAVING count(*) > 1").fetchall()
    assert twice == [], f"recorded twice: {twice}"
    stray_timers = sql.execute(
        "SELECT t.instance_id FROM kenning_timers t JOIN kenning_instances i ON i.id = t.instance_id "
        "WHERE i.status <> 'waiting_for_timer'"
    ).fetchall()
    assert stray_timers == [], f"timers of instances not waiting for them: {stray_timers}"
    stray_timeouts = sql.execute(
        "SELECT s.instance_id FROM kenning_event_subscriptions s JOIN kenning_instances i ON i.id = s.instance_id "
        "WHERE i.status <> 'waiting_for_event'"
    ).fetchall()
    assert stray_timeouts == [], f"subscriptions of instances not waiting for them: {stray_timeouts}"
    fired_and_waiting = sql.execute(
        "SELECT t.instance_id FROM kenning_timers t JOIN kenning_history h "
        "ON h.instance_id = t.instance_id AND h.step_id = t.step_id"
    ).fetchall()
    assert fired_and_waiting == [], f"timers still registered after they fired: {fired_and_waiting}"
